"""One bad alias does not hide the rest (issue 12, item 3): @champion points at a pair version whose
target model version was deleted from the registry; the healthy @challenger is still validated,
and the broken one becomes one error result, one log line and one alert (not repeated the same
day, resolved once that alias validates again)."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from monitoring.receiver import WebhookReceiver
from tests.support.models import save_tiny_checkpoint
from tests.support.gate import policy_gate
from tests.support.store import model_store
from tests.support.registry import open_registry_at


def test_broken_champion_alerts_once_and_challenger_is_validated(tmp_path, monkeypatch, prefect_harness):
    from mlflow import MlflowClient

    from flows import model_cache
    from flows.nightly import nightly_validation_flow
    from registry import promote
    from specdec import SpeculativeConfig
    from registry.register import register_pair_from_refs

    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("SPECDEC_TRACKING_URI", raising=False)
    rows = [{"id": f"p{i}", "category": "a", "prompt": f"abc abc abc {i} abc"} for i in range(4)]
    (tmp_path / "h.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    model_cache.clear()
    cfg = SpeculativeConfig(max_new_tokens=8)
    registry = open_registry_at()
    old = register_pair_from_refs(str(save_tiny_checkpoint(tmp_path / "a", seed=1)), "ngram", name="bp",
                                  target_name="old-target", config=cfg, store=model_store(), registry=registry)
    new = register_pair_from_refs(str(save_tiny_checkpoint(tmp_path / "b", seed=2)), "ngram", name="bp",
                                  target_name="new-target", config=cfg, store=model_store(), registry=registry)
    promote("bp", old.pair.version, "champion", force=True, reason="test setup", gate=policy_gate(), registry=registry)
    promote("bp", new.pair.version, "challenger", gate=policy_gate(), registry=registry)
    MlflowClient(registry.uri).delete_model_version("old-target", old.target.version)

    with WebhookReceiver() as rx:
        monkeypatch.setenv("SPECDEC_ALERT_CHANNELS", json.dumps([{"type": "webhook", "url": rx.url(), "name": "ops"}]))
        for _ in range(2):  # the same night twice: still one alert
            res = {r.alias: r for r in nightly_validation_flow(
                pairs=["bp"], heldout=str(tmp_path / "h.jsonl"), limit=None, device="cpu", dtype="float32",
                scheduled_date=dt.date(2026, 11, 5))}
            assert res["champion"].status == "error" and "old-target" in res["champion"].message
            assert res["challenger"].status in ("passed", "failed", "inconclusive"), res["challenger"]
            assert res["challenger"].history_run_id is not None
        fired = [r.body for r in rx.accepted]
        assert len(fired) == 1, fired
        assert fired[0]["alias"] == "champion" and "old-target" in json.dumps(fired[0])
