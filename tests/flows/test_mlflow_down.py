"""MLflow goes down after validation: the history row is kept (mlflow_logged = false), and the next
run logs it once MLflow is back. Real ``mlflow server`` process, stopped and restarted on the same
port and store."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from tests.support.mlflow_server import MlflowServer
from tests.support.models import save_tiny_checkpoint
from tests.support.gate import policy_gate
from tests.support.registry import open_registry_at

pytestmark = pytest.mark.server


def test_history_kept_and_mlflow_logging_retried(tmp_path, monkeypatch, prefect_harness):
    import monitoring
    from flows import model_cache
    from flows.nightly import (
        Job, Night, Target, ValidationParams, log_to_mlflow, record_night, retry_pending_mlflow_logging, run_validation,
    )
    from flows.register import register_pair_flow
    from flows.tasks import report_dir_for
    from monitoring import history
    from registry import get_pair_version, latest_validation_run
    from registry.service import Registry
    from registry.settings import get_settings as registry_settings
    from specdec.settings import CoreSettings
    from specdec.validation.heldout import load_heldout

    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SPECDEC_ALERT_CHANNELS", raising=False)
    rows = [{"id": f"p{i}", "category": "a", "prompt": f"abc abc abc {i} abc"} for i in range(3)]
    (tmp_path / "h.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    server = MlflowServer(tmp_path / "mlflow").start()
    try:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
        model_cache.clear()
        pv = register_pair_flow(str(save_tiny_checkpoint(tmp_path / "tiny")), "ngram", name="down-pair",
                                target_name="tiny-target", max_new_tokens=8)
        held = load_heldout(str(tmp_path / "h.jsonl"))
        pvo = get_pair_version("down-pair", pv["version"], download=False, registry=open_registry_at())
        key = history.RunKey.build("down-pair", pv["version"], held.name, held.version,
                                   pvo.config.to_dict(), dt.date(2026, 11, 2))
        db = monitoring.connect(monitoring.get_settings())
        claim = history.claim_run(db, key, alias="challenger")
        out = report_dir_for(monitoring.get_settings().home, key)
        params = ValidationParams(str(tmp_path / "h.jsonl"), None, "cpu", "float32", 0, 1, "decode", 0.25)
        report = run_validation.fn(pvo, params, str(out))
        night = Night(key.scheduled_date, monitoring.get_settings(), db, Registry(registry_settings(), check=False), held, lease=None,
                      beat=None, holder_dead=None, core=CoreSettings(), gate=policy_gate())
        server.stop()  # MLflow goes down before the run is logged
        job = Job(Target("down-pair", "challenger", pvo, None), key, claim, out, future=None)
        monkeypatch.setattr("flows.nightly.log_to_mlflow", log_to_mlflow.with_options(retries=0))  # fail now, not in 65 s
        res = record_night(night, job, report)
        assert res.mlflow_run_id is None and res.history_run_id is not None
        pending = history.runs_pending_mlflow(db)
        assert [r.id for r in pending] == [res.history_run_id]
        assert (out / "report.json").exists()
    finally:
        server.stop()

    back = MlflowServer(tmp_path / "mlflow", port=server.port, keep_existing=True).start()
    try:
        registry = Registry(registry_settings())
        logged = retry_pending_mlflow_logging.fn(db, night.home, registry, gate=policy_gate())
        assert len(logged) == 1
        assert history.runs_pending_mlflow(db) == []
        assert history.get_run(db, res.history_run_id).mlflow_run_id == logged[0]
        assert latest_validation_run("down-pair", pv["version"], registry=registry).info.run_id == logged[0]
        assert retry_pending_mlflow_logging.fn(db, night.home, registry, gate=policy_gate()) == []  # never logged twice
    finally:
        back.stop()
