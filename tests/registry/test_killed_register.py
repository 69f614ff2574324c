"""A ``kill -9`` of a registration leaves no MLflow run RUNNING forever (issue 25, item 6).

A real process registers a tiny pair on a real MLflow SQLite store and is killed with SIGKILL
while it uploads the model artifacts (its run is RUNNING then). The next registration marks that
run FAILED; the run of a live process is never touched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from tests.support.models import save_tiny_checkpoint
from tests.support.store import model_store
from tests.support.registry import open_registry_at


def test_the_next_registration_fails_the_run_a_kill_left_running(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from registry.register import register_pair_from_refs
    from registry.settings import REGISTRY_EXPERIMENT, get_settings

    home = tmp_path / "home"
    monkeypatch.setenv("SPECDEC_HOME", str(home))
    for v in ("MLFLOW_TRACKING_URI", "SPECDEC_TRACKING_URI"):
        monkeypatch.delenv(v, raising=False)
    ckpt = save_tiny_checkpoint(tmp_path / "tiny")
    code = textwrap.dedent(f"""
        import os, signal
        from mlflow import MlflowClient
        def die(*a, **k):
            os.kill(os.getpid(), signal.SIGKILL)  # killed mid-upload, as kill -9 would
        MlflowClient.log_model_artifacts = die
        from registry.register import register_pair_from_refs
        from registry.service import Registry
        from registry.settings import get_settings as registry_settings
        from specdec.models import ModelStore
        from specdec.settings import get_settings
        register_pair_from_refs({str(ckpt)!r}, "ngram", name="kp", target_name="kp-target",
                                store=ModelStore(get_settings().models_dir), registry=Registry(registry_settings()))
    """)
    env = {**os.environ, "SPECDEC_HOME": str(home), "PYTHONPATH": os.getcwd()}
    for v in ("MLFLOW_TRACKING_URI", "SPECDEC_TRACKING_URI"):
        env.pop(v, None)
    p = subprocess.run([sys.executable, "-c", code], env=env, timeout=300, capture_output=True, text=True)
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    client = MlflowClient(get_settings().tracking_uri)
    exp = client.get_experiment_by_name(REGISTRY_EXPERIMENT)
    (left,) = client.search_runs([exp.experiment_id], "attributes.status = 'RUNNING'")

    reg = register_pair_from_refs(str(ckpt), "ngram", name="kp", target_name="kp-target", store=model_store(), registry=open_registry_at())
    assert reg.pair.version
    assert client.get_run(left.info.run_id).info.status == "FAILED"
    assert client.search_runs([exp.experiment_id], "attributes.status = 'RUNNING'") == []
