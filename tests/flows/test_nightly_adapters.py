"""One base, two LoRA adapter pairs, one shared unadapted draft, through the real nightly flow (Prefect harness, SQLite
MLflow store and history, a webhook receiver): each adapter pair gets its own history row and verdict; the base loads
once a night; a new adapter version that moves the target away from the shared draft fails the floor and alerts on
its own pair only, with the hint naming the adapter."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from monitoring.receiver import WebhookReceiver
from tests.support.adapters import save_lora_adapter
from tests.support.models import save_tiny_checkpoint
from tests.support.nightly import nightly_by_alias

DAY1, DAY2 = dt.date(2026, 11, 1), dt.date(2026, 11, 2)


def _heldout(path):
    rows = [{"id": f"p{i}", "category": ["chat", "code"][i % 2],
             "prompt": f"Question {i}: tell me about the {['sea', 'sky', 'land'][i % 3]} and count to {i + 3}."}
            for i in range(12)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def env(tmp_path_factory, prefect_harness):
    tmp = tmp_path_factory.mktemp("adapter-nights")
    mp = pytest.MonkeyPatch()
    mp.setenv("SPECDEC_HOME", str(tmp / "home"))
    mp.setenv("SPECDEC_RULES__SPEED_ENABLED", "false")  # a tiny Llama's timings say nothing about speed
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    mp.delenv("SPECDEC_TRACKING_URI", raising=False)
    receiver = WebhookReceiver().start()
    mp.setenv("SPECDEC_ALERT_CHANNELS", json.dumps([{"type": "webhook", "url": receiver.url("/hook"), "name": "ops"}]))
    base = save_tiny_checkpoint(tmp / "base", seed=0, hidden_size=64)
    from flows import model_cache

    model_cache.clear()
    yield {"base": str(base), "heldout": _heldout(tmp / "heldout.jsonl"), "receiver": receiver, "mp": mp,
           # a light adapter keeps the shared draft (the base itself) accepted; a heavy one moves the target away
           "support-v3": str(save_lora_adapter(base, tmp / "support-v3", seed=1, b_std=0.005)),
           "support-v4": str(save_lora_adapter(base, tmp / "support-v4", seed=2, b_std=0.3)),
           "sql-v1": str(save_lora_adapter(base, tmp / "sql-v1", seed=3, b_std=0.005))}
    receiver.stop()
    mp.undo()


def _night(env, day):
    from flows import model_cache
    from flows.loading import _RegistryLoader
    from flows.nightly import nightly_validation_flow

    loads: list[str] = []
    real = _RegistryLoader.load

    def counted(self, uri):
        loads.append(uri)
        return real(self, uri)

    model_cache.clear()  # a fresh worker: tonight's loads are counted from nothing
    env["mp"].setattr(_RegistryLoader, "load", counted)
    try:
        results = nightly_validation_flow(pairs=["support-pair", "sql-pair"], heldout=env["heldout"], limit=None,
                                          device="cpu", dtype="float32", scheduled_date=day)
    finally:
        env["mp"].setattr(_RegistryLoader, "load", real)
    return {(r.pair, r.alias): r for r in results}, loads


def test_adapter_pairs_get_a_row_a_verdict_and_an_alert_of_their_own(env):
    import monitoring
    from flows.register import register_pair_flow
    from monitoring import history

    common = dict(target_name="base", draft_name="shared-draft", max_new_tokens=24)
    register_pair_flow(env["base"], env["base"], name="support-pair", target_adapter=env["support-v3"], **common)
    register_pair_flow(env["base"], env["base"], name="sql-pair", target_adapter=env["sql-v1"], **common)
    night1, loads = _night(env, DAY1)
    assert [night1[(p, "challenger")].status for p in ("support-pair", "sql-pair")] == ["passed", "passed"]
    assert loads.count("models:/base/1") == 1  # one base load for both adapters (the draft is the base's checkpoint)
    assert env["receiver"].accepted == []
    from flows.promote import promote_flow

    promote_flow("support-pair", "1")  # the baseline the next night compares with

    pv = register_pair_flow(env["base"], env["base"], name="support-pair", target_adapter=env["support-v4"], **common)
    assert pv["changed"] == "target" and pv["target_uri"] == "models:/base/1"
    night2, loads = _night(env, DAY2)
    failed, calm = night2[("support-pair", "challenger")], night2[("sql-pair", "challenger")]
    assert loads.count("models:/base/1") == 1  # three pair versions, two adapters and the champion's: one base load
    assert night2[("support-pair", "champion")].status == "passed"
    assert failed.status == "failed" and failed.alert_transition == "fire" and failed.acceptance_rate_ci[1] < 0.40
    assert failed.root_cause_hint.startswith("adapter support-v4 changed; draft shared, unchanged")
    assert calm.status == "passed" and calm.alert_transition is None
    fired = [r.body for r in env["receiver"].accepted]
    assert len(fired) == 1 and "support-pair" in json.dumps(fired[0]) and "sql-pair" not in json.dumps(fired[0])
    assert "adapter support-v4 changed; draft shared, unchanged" in json.dumps(fired[0])
    from registry.service import Registry
    from registry.settings import get_settings as registry_settings

    description = Registry(registry_settings()).client.get_model_version("support-pair", "2").description
    assert description.startswith("failed: ") and "+ adapter support-v4 (models:/support-v4/1)" in description
    db = monitoring.connect(monitoring.get_settings())
    rows = {r: history.get_run(db, night2[r].history_run_id) for r in night2 if night2[r].history_run_id}
    assert {(r.pair_name, r.target_adapter) for r in rows.values()} == {
        ("support-pair", "support-v3"), ("support-pair", "support-v4"), ("sql-pair", "sql-v1")}
    row = rows[("support-pair", "challenger")]
    assert row.target_adapter_hash and row.target_adapter_hash != rows[("sql-pair", "challenger")].target_adapter_hash
    assert row.draft_adapter is None and row.target_hash == rows[("sql-pair", "challenger")].target_hash
