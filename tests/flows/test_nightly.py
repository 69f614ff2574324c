"""The Prefect flows end-to-end on tiny models, under ``prefect_test_harness``: register, nightly
validation (history, MLflow run, Evidently, alerts) and promotion, plus the drift scenario:
a draft derived from target v1 against a perturbed target v2 fires exactly one alert; re-deriving
the draft from v2 resolves it."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from monitoring.receiver import WebhookReceiver
from tests.support.models import save_tiny_checkpoint
from tests.support.nightly import nightly_by_alias
from tests.support.registry import open_registry_at

PAIR = "tiny-pair"
DAY1, DAY2, DAY3 = dt.date(2026, 11, 1), dt.date(2026, 11, 2), dt.date(2026, 11, 3)


def _heldout(path):
    rows = []
    for i in range(12):
        cat = ["chat", "code"][i % 2]
        text = f"Question {i}: tell me about the {['sea', 'sky', 'land'][i % 3]} and count to {i + 3}."
        rows.append({"id": f"p{i}", "category": cat, "prompt": text})
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def env(tmp_path_factory, prefect_harness):
    tmp = tmp_path_factory.mktemp("flows")
    mp = pytest.MonkeyPatch()
    mp.setenv("SPECDEC_HOME", str(tmp / "home"))
    # a tiny Llama's timings say nothing about speed (its "draft" costs as much as its target): this
    # drift story is about acceptance; the speed rule has its own tests (tests/monitoring/test_speed.py)
    mp.setenv("SPECDEC_RULES__SPEED_ENABLED", "false")
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    mp.delenv("SPECDEC_TRACKING_URI", raising=False)
    receiver = WebhookReceiver().start()
    mp.setenv("SPECDEC_ALERT_CHANNELS", json.dumps([{"type": "webhook", "url": receiver.url("/hook"), "name": "ops"}]))
    v1 = save_tiny_checkpoint(tmp / "target-v1", seed=0, hidden_size=64)
    v2 = save_tiny_checkpoint(tmp / "target-v2", seed=0, hidden_size=64, perturb=0.05)
    from flows import model_cache

    model_cache.clear()
    yield {"tmp": tmp, "v1": str(v1), "v2": str(v2), "heldout": _heldout(tmp / "heldout.jsonl"), "receiver": receiver}
    receiver.stop()
    mp.undo()


def _nightly(env, day):
    return nightly_by_alias(PAIR, env["heldout"], day)


def test_drift_scenario_fires_once_and_resolves(env):
    from flows.promote import promote_flow
    from flows.register import register_pair_flow
    from registry import get_pair_version, resolve_alias

    kw = dict(name=PAIR, target_name="tiny-target", draft_name="tiny-int8", max_new_tokens=24)
    pv1 = register_pair_flow(env["v1"], "derived:int8", **kw)
    registry = open_registry_at()
    assert pv1["version"] == "1" and resolve_alias(PAIR, "challenger", registry=registry) == "1"

    night1 = _nightly(env, DAY1)
    assert night1["champion"].status == "skipped"  # nobody is champion yet
    assert night1["challenger"].status == "passed", night1["challenger"]
    assert night1["challenger"].mlflow_run_id
    promote_flow(PAIR, "1")
    assert resolve_alias(PAIR, "champion", registry=registry) == "1"

    # target-only change: new target version, the OLD derived draft (derived from target v1)
    old_draft = f"models:/tiny-int8/{1}"
    pv2 = register_pair_flow(env["v2"], old_draft, **kw)
    assert pv2["changed"] == "target"
    night2 = _nightly(env, DAY2)
    ch = night2["challenger"]
    assert night2["champion"].status == "passed"
    assert ch.status == "failed" and ch.alert_transition == "fire", ch
    assert ch.acceptance_rate_ci[1] < 0.40
    assert "target changed" in ch.root_cause_hint and "draft unchanged" in ch.root_cause_hint
    fired = [r.body for r in env["receiver"].accepted]
    assert len(fired) == 1, fired
    text = json.dumps(fired[0])
    assert "tiny-pair" in text and "re-derive" in text and "MLflow run" in text
    # the floor first (the acceptance rate at k, issue 41), with what changed
    assert fired[0]["text"].splitlines()[1].startswith("acceptance rate ")
    assert "at k = 4 after a target-only change: target changed, draft unchanged" in fired[0]["text"].splitlines()[1]
    _one_word(ch, fired[0])

    # the same night retried: one history row, no second alert
    again = _nightly(env, DAY2)
    assert again["challenger"].history_run_id == ch.history_run_id
    assert len(env["receiver"].accepted) == 1

    # re-derive the draft from target v2 -> v3 passes and the incident resolves
    pv3 = register_pair_flow(f"models:/tiny-target/{pv2['target_uri'].rsplit('/', 1)[1]}", "derived:int8", **kw)
    assert pv3["changed"] == "draft"
    night3 = _nightly(env, DAY3)
    assert night3["challenger"].status == "passed" and night3["challenger"].alert_transition == "resolve"
    bodies = [r.body for r in env["receiver"].accepted]
    assert len(bodies) == 2 and "resolve" in json.dumps(bodies[1]).lower()
    _one_word(night3["challenger"], bodies[1])
    result = promote_flow(PAIR, pv3["version"])
    assert resolve_alias(PAIR, "champion", registry=registry) == pv3["version"]
    assert get_pair_version(PAIR, "champion", download=False, registry=registry).validation_status == "passed"
    assert result["alias"] == "champion"


def _one_word(res, alert: dict) -> None:
    """Issue 41: one verdict word for one run in the nightly table, the history, the MLflow run, the pair
    version's tag and description, ``pair show`` and the alert."""
    from typer.testing import CliRunner

    import monitoring
    from flows.summary import summary_markdown
    from monitoring import history
    from registry.service import Registry
    from registry.settings import get_settings as registry_settings
    from specdec.cli import app

    word = res.status
    assert word in ("passed", "failed")
    assert f"| **{word}** |" in summary_markdown([res])
    assert history.get_run(monitoring.connect(monitoring.get_settings()), res.history_run_id).status == word
    client = Registry(registry_settings()).client
    assert client.get_run(res.mlflow_run_id).data.tags["validation_status"] == word
    mv = client.get_model_version(PAIR, res.version)
    assert mv.tags["validation_status"] == word and mv.description.startswith(f"{word}: acc ")
    shown = CliRunner().invoke(app, ["pair", "show", PAIR, res.version], catch_exceptions=False, env={"COLUMNS": "200"})
    assert f"{word} (the run's verdict" in shown.output, shown.output
    assert alert["facts"]["Verdict"] == word


def test_promote_flow_refuses_unvalidated_version(env):
    from flows.promote import promote_flow
    from flows.register import register_pair_flow
    from registry import PromotionRefused

    pv = register_pair_flow(env["v1"], "ngram", name=PAIR, target_name="tiny-target", max_new_tokens=24, alias=None)
    with pytest.raises(PromotionRefused):
        promote_flow(PAIR, pv["version"])
