"""Registry settings: where the store lives, which variable wins, and fast failure on a dead server."""

from __future__ import annotations

import time
from pathlib import Path

import pytest


@pytest.fixture()
def clean_env(monkeypatch, tmp_path):
    for var in ("SPECDEC_TRACKING_URI", "MLFLOW_TRACKING_URI", "SPECDEC_ARTIFACTS_DIR", "SPECDEC_CACHE_DIR", "SPECDEC_PAIR_NAME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)  # a stray .env in the repo must not leak in
    return tmp_path


def test_defaults_live_under_specdec_home(clean_env):
    from registry.settings import get_settings, local_artifacts_root

    home = (clean_env / "home").resolve()
    s = get_settings()
    assert s.tracking_uri == f"sqlite:///{home / 'mlflow.db'}"
    assert s.cache_dir == home / "registry-cache" and s.pair_name == "specdec-pair"
    assert local_artifacts_root(s.tracking_uri, s) == home / "mlartifacts"
    # another SQLite store keeps its artifacts next to its own file
    assert local_artifacts_root("sqlite:////data/x/mlflow.db", s) == Path("/data/x/mlartifacts")


def test_tracking_uri_precedence(clean_env, monkeypatch):
    from registry.service import Registry
    from registry.settings import get_settings

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.internal:5000")
    assert get_settings().tracking_uri == "http://mlflow.internal:5000"
    monkeypatch.setenv("SPECDEC_TRACKING_URI", "sqlite:////srv/specdec.db")
    assert get_settings().tracking_uri == "sqlite:////srv/specdec.db"
    assert Registry(get_settings(), tracking_uri="http://explicit:1", check=False).uri == "http://explicit:1"  # --tracking-uri


def test_local_store_experiments_get_artifacts_under_home(clean_env):
    from registry.service import Registry
    from registry.settings import get_settings as registry_settings
    from tests.support.mlflow_server import sqlite_store

    uri = sqlite_store(clean_env / "store")
    registry = Registry(registry_settings(), tracking_uri=uri)
    client = registry.client
    eid = registry.experiment("specdec-validation")
    assert registry.experiment("specdec-validation") == eid
    assert client.get_experiment(eid).artifact_location == (clean_env / "store" / "mlartifacts" / "specdec-validation").as_uri()


def test_dead_server_is_registry_unavailable_quickly(clean_env):
    from registry.errors import RegistryUnavailable
    from registry.service import Registry, mlflow_errors
    from registry.settings import get_settings as registry_settings
    from registry.settings import redact_uri
    from tests.support.net import free_port

    dead = f"http://user:pw@127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(RegistryUnavailable) as e:
        Registry(registry_settings(), tracking_uri=dead)
    assert "pw" not in str(e.value) and "127.0.0.1" in str(e.value)
    # a server that dies after the client was built: MLflow's retry error becomes RegistryUnavailable too
    client = Registry(registry_settings(), tracking_uri=dead, check=False).client
    with pytest.raises(RegistryUnavailable, match="unreachable"):
        with mlflow_errors(client.tracking_uri):
            client.get_registered_model("specdec-pair")
    assert time.monotonic() - t0 < 30
    assert redact_uri("https://u:secret@host:8443/prefix?token=abc") == "https://host:8443/prefix"
