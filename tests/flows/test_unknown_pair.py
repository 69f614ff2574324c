"""``nightly run --pair NAME`` with a name that is not registered ends in one line, before any flow starts, with
the closest registered pair (issue 51: it printed about 20 lines per alias: an ungated-promotion error, the alias
error, two channel warnings, a table and the policy). The real ``specdec`` command as a process, a real MLflow
SQLite store."""

from __future__ import annotations

import os
import subprocess
import sys


def _nightly(tmp_path, uri: str, pair: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, SPECDEC_HOME=str(tmp_path / "home"), SPECDEC_TRACKING_URI=uri, COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "specdec.cli", "nightly", "run", "--pair", pair, "--limit", "1"],
                          capture_output=True, text=True, env=env, timeout=300)


def test_a_pair_typo_is_one_line_with_the_closest_name(tmp_path):
    from mlflow import MlflowClient

    from registry.pairs import PAIR_MODEL_DESCRIPTION

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.create_registered_model("support-pair", description=PAIR_MODEL_DESCRIPTION)
    client.create_registered_model("support-pair-target", description="a target, not a pair")
    p = _nightly(tmp_path, uri, "suport-pair")
    said = (p.stdout + p.stderr).strip()
    assert p.returncode == 1, said
    assert said == ("error: pair 'suport-pair' is not registered: did you mean 'support-pair'? "
                    "(`specdec pair list` lists the 1 registered)")
    assert not list((tmp_path / "home").glob("logs/nightly-*.log"))  # no night started
    p = _nightly(tmp_path, uri, "zzz")
    said = (p.stdout + p.stderr).strip()
    assert p.returncode == 1 and said == "error: pair 'zzz' is not registered: (`specdec pair list` lists the 1 registered)"
