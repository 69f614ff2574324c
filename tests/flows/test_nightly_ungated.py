"""A champion moved by hand in MLflow (what the UI's alias editor does) to a version that was never
validated: the next nightly validates it first and raises one "ungated promotion" alert naming the
version and when it was noticed; once specdec moves the alias, the next nightly resolves it.
Tiny models under ``prefect_test_harness``, a real webhook receiver, the local MLflow store."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from monitoring.receiver import WebhookReceiver
from tests.support.models import save_tiny_checkpoint
from tests.support.nightly import nightly_by_alias
from tests.support.gate import policy_gate
from tests.support.registry import open_registry_at

PAIR = "ungated-pair"


@pytest.fixture(scope="module")
def env(tmp_path_factory, prefect_harness):
    tmp = tmp_path_factory.mktemp("ungated-flow")
    mp = pytest.MonkeyPatch()
    mp.setenv("SPECDEC_HOME", str(tmp / "home"))
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    mp.delenv("SPECDEC_TRACKING_URI", raising=False)
    receiver = WebhookReceiver().start()
    mp.setenv("SPECDEC_ALERT_CHANNELS", json.dumps([{"type": "webhook", "url": receiver.url("/hook"), "name": "ops"}]))
    rows = [{"id": f"p{i}", "category": ["chat", "code"][i % 2],
             "prompt": f"Question {i}: tell me about the {['sea', 'sky', 'land'][i % 3]} and count to {i + 3}."}
            for i in range(12)]
    (tmp / "heldout.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    from flows import model_cache

    model_cache.clear()
    yield {"v1": str(save_tiny_checkpoint(tmp / "target-v1", seed=0, hidden_size=64)),
           "v2": str(save_tiny_checkpoint(tmp / "target-v2", seed=0, hidden_size=64, perturb=0.2)),  # stale enough per token
           "heldout": str(tmp / "heldout.jsonl"), "receiver": receiver}
    receiver.stop()
    mp.undo()


def _nightly(env, day):
    return nightly_by_alias(PAIR, env["heldout"], day)


def test_hand_moved_champion_is_validated_first_and_alerted(env):
    from mlflow import MlflowClient

    from flows.register import register_pair_flow
    from registry import get_pair_version, promote
    from registry.settings import get_settings

    kw = dict(name=PAIR, target_name="tiny-target", draft_name="tiny-int8", max_new_tokens=24, alias=None)
    register_pair_flow(env["v1"], "derived:int8", **kw)  # v1
    register_pair_flow(env["v2"], "models:/tiny-int8/1", **kw)  # v2: new target, draft still derived from v1
    uri = get_settings().tracking_uri
    MlflowClient(uri, registry_uri=uri).set_registered_model_alias(PAIR, "champion", "2")  # by hand, no gate

    night1 = _nightly(env, dt.date(2026, 11, 1))
    champ = night1["champion"]
    assert champ.version == "2" and champ.status == "failed" and champ.mlflow_run_id  # validated tonight
    assert champ.ungated_alert == "fire"
    assert f"{PAIR}@champion points at v2" in champ.ungated_promotion and "Noticed 20" in champ.ungated_promotion
    assert "Validated first tonight: failed, acceptance" in champ.ungated_promotion
    bodies = [r.body for r in env["receiver"].accepted]
    ungated = [b for b in bodies if b["title"].startswith("Ungated promotion")]
    assert len(ungated) == 1 and ungated[0]["title"] == f"Ungated promotion: {PAIR} v2 (champion)"
    assert "never validated" in ungated[0]["text"] and "specdec never set it" in ungated[0]["text"]
    registry = open_registry_at()
    pv2 = get_pair_version(PAIR, "2", download=False, registry=registry)
    assert pv2.description.startswith("failed: acc ") and "@champion outside specdec, noticed" in pv2.description

    # specdec moves the alias (forced, with a reason): the next nightly resolves the ungated incident
    promote(PAIR, "1", force=True, reason="roll back the hand promotion", actor="ops", gate=policy_gate(), registry=registry)
    night2 = _nightly(env, dt.date(2026, 11, 2))
    assert night2["champion"].version == "1" and night2["champion"].ungated_alert == "resolve"
    assert night2["champion"].ungated_promotion is None
    events = [(b["title"].split(":")[0], b["event"]) for b in (r.body for r in env["receiver"].accepted)]
    assert events.count(("Ungated promotion", "fire")) == 1 and ("Resolved", "resolve") in events
