"""Per-pair tags are checked before any model is loaded (issue 51): a malformed ``acceptance_floor`` tag on a pair
version was read only after the whole validation ran, and the error read like a storage fault ("recording the
validation failed"). Through the real nightly flow on a real MLflow store: the version ends at once in one line
naming the tag, its value and the version; no model was loaded for it and no history row claimed; the healthy
alias is still validated."""

from __future__ import annotations

import datetime as dt
import json

from monitoring import history
from monitoring.db import connect
from tests.support.gate import policy_gate
from tests.support.models import save_tiny_checkpoint
from tests.support.registry import open_registry_at
from tests.support.store import model_store


def test_a_malformed_floor_tag_ends_the_version_before_any_model_is_loaded(tmp_path, monkeypatch, prefect_harness):
    from mlflow import MlflowClient

    from flows import model_cache
    from flows.nightly import nightly_validation_flow
    from registry import promote
    from registry.register import register_pair_from_refs
    from specdec import SpeculativeConfig

    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("SPECDEC_TRACKING_URI", raising=False)
    monkeypatch.delenv("SPECDEC_ALERT_CHANNELS", raising=False)
    rows = [{"id": f"p{i}", "category": "a", "prompt": f"abc abc abc {i} abc"} for i in range(3)]
    (tmp_path / "h.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    registry = open_registry_at()
    reg = register_pair_from_refs(str(save_tiny_checkpoint(tmp_path / "t", seed=3)), "ngram", name="tp",
                                  target_name="tp-target", config=SpeculativeConfig(max_new_tokens=8),
                                  store=model_store(), registry=registry)
    promote("tp", reg.pair.version, "champion", force=True, reason="test setup", gate=policy_gate(), registry=registry)
    MlflowClient(registry.uri).set_model_version_tag("tp", str(reg.pair.version), "acceptance_floor", "forty percent")
    model_cache.clear()

    res = {r.alias: r for r in nightly_validation_flow(pairs=["tp"], heldout=str(tmp_path / "h.jsonl"), limit=None,
                                                       device="cpu", dtype="float32", scheduled_date=dt.date(2026, 12, 7))}
    bad = res["champion"]
    assert bad.status == "error" and bad.history_run_id is None
    assert "\n" not in bad.message and f"tp@champion v{reg.pair.version}" in bad.message
    assert "acceptance_floor" in bad.message and "'forty percent'" in bad.message and "malformed" in bad.message
    assert "recording" not in bad.message
    assert len(model_cache._CACHE) == 0  # nothing was loaded for it
    from monitoring.settings import get_settings

    db = connect(get_settings())
    assert history.list_runs(db, pair_name="tp") == []  # nothing claimed
    db.dispose()
