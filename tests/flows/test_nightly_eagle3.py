"""The nightly validates an EAGLE-3 pair from the registry: the head version is downloaded and loaded
against the pair's target (flows.loading), and a target-only fine-tune that leaves the head stale
alerts with "re-train from head vN" (real MLflow SQLite store, real Prefect, real webhook receiver)."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from monitoring.receiver import WebhookReceiver
from tests.flows.test_nightly import _heldout
from tests.support.nightly import nightly_by_alias
from tests.support.store import model_store
from tests.training.eagle3_support import TINY_LAYER_IDS, quick_config, tiny_target_dir

PAIR = "tiny-eagle3"
DAY1, DAY2 = dt.date(2026, 11, 1), dt.date(2026, 11, 2)


@pytest.fixture(scope="module")
def env(tmp_path_factory, prefect_harness):
    from specdec.models import load_causal_lm
    from specdec.training import train_eagle3_head

    tmp = tmp_path_factory.mktemp("nightly-eagle3")
    mp = pytest.MonkeyPatch()
    mp.setenv("SPECDEC_HOME", str(tmp / "home"))
    mp.setenv("SPECDEC_RULES__SPEED_ENABLED", "false")  # tiny models' timings say nothing about speed
    # a head trained for seconds on a tiny target accepts ~5% of its drafts: the story is measured against
    # its own baseline (relative and collapse rules), not the 0.40 floor meant for served pairs
    mp.setenv("SPECDEC_RULES__ABSOLUTE_THRESHOLD", "0.01")
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    mp.delenv("SPECDEC_TRACKING_URI", raising=False)
    receiver = WebhookReceiver().start()
    mp.setenv("SPECDEC_ALERT_CHANNELS", json.dumps([{"type": "webhook", "url": receiver.url("/hook"), "name": "ops"}]))
    t1, t2 = tiny_target_dir(tmp / "t1"), tiny_target_dir(tmp / "t2", perturb=1.0)
    head = train_eagle3_head(load_causal_lm(str(t1), store=model_store()), out_dir=tmp / "h1", layer_ids=TINY_LAYER_IDS, progress=False,
                             config=quick_config()).out_dir
    from flows import model_cache

    model_cache.clear()
    yield {"t1": str(t1), "t2": str(t2), "head": str(head), "heldout": _heldout(tmp / "heldout.jsonl"),
           "receiver": receiver}
    receiver.stop()
    mp.undo()


def _nightly(env, day):
    return nightly_by_alias(PAIR, env["heldout"], day)


def test_nightly_validates_a_registered_head_and_names_the_stale_head(env):
    from flows.promote import promote_flow
    from flows.register import register_pair_flow

    kw = dict(name=PAIR, target_name="tiny-target", draft_name="tiny-head", max_new_tokens=24, num_speculative_tokens=3)
    pv1 = register_pair_flow(env["t1"], f"eagle3:{env['head']}", **kw)
    assert pv1["drafter_kind"] == "eagle3"
    night1 = _nightly(env, DAY1)["challenger"]
    assert night1.status == "passed", night1
    from specdec.validation.report import ValidationReport

    rep = ValidationReport.read(night1.report_dir)  # replay of every prompt, decoding of a subsample, compared
    assert rep.method == "both" and rep.drafter_kind == "eagle3"
    assert rep.replay["num_compared"] > 0 and rep.replay["replay_decode_agreement"] == 1.0, rep.replay["disagreements"]
    promote_flow(PAIR, pv1["version"])

    pv2 = register_pair_flow(env["t2"], "eagle3:models:/tiny-head/1", **kw)
    assert pv2["changed"] == "target"
    night2 = _nightly(env, DAY2)["challenger"]
    assert night2.status == "failed" and night2.alert_transition == "fire", night2
    assert night2.acceptance_rate < night1.acceptance_rate
    assert "re-train" in night2.root_cause_hint and "tiny-head/1" in night2.root_cause_hint
    (fired,) = [r.body for r in env["receiver"].accepted]
    assert "re-train" in json.dumps(fired)
