"""The replay measurement-health rule: fires on disagreements beyond numerics, never on near-ties;
the replay columns in the history row (real SQLite file, migrations through 0005_replay)."""

from __future__ import annotations

import datetime as dt

import pytest

from monitoring import history, pipeline, rules
from monitoring.db import connect
from monitoring.history import Lineage, RunKey, RunSnapshot
from monitoring.rules import FIRING, NOT_APPLICABLE, OK
from monitoring.settings import MonitoringSettings, RuleSettings
from tests.support.reports import make_report
from specdec.validation.replay_curve import BEYOND_NUMERICS, NEAR_TIE, NUMERICS_MARGIN, UNSEEN_STOP, classify

T0 = dt.datetime(2026, 12, 1, 2, 0, tzinfo=dt.timezone.utc)


def replay(results):
    (r,) = [x for x in results if x.rule == "measurement" and x.scope == "replay"]
    return r


def report(agreement=None, beyond=None, method="both"):
    rep = make_report(0.9, num_prompts=24)
    rep.method = method
    rep.overall.replay_decode_agreement = float("nan") if agreement is None else agreement
    rep.overall.replay_beyond_numerics = beyond
    return rep


def ev(rep):
    return rules.evaluate(RunSnapshot.from_report(rep, Lineage()), None, RuleSettings())


@pytest.mark.parametrize("precision", sorted(NUMERICS_MARGIN))
def test_numerics_alone_never_fire(precision):
    # every flip at or below the precision's rounding bound is a near-tie, and a night made only of
    # near-ties has replay_beyond_numerics == 0: the rule stays ok
    bound = NUMERICS_MARGIN[precision]
    classes = [classify(m, precision) for m in (0.0, bound / 10, bound / 2, bound)]
    assert classes == [NEAR_TIE] * 4
    assert classify(bound * 1.5 + 0.01, precision) == BEYOND_NUMERICS
    res = ev(report(agreement=0.5, beyond=sum(c == BEYOND_NUMERICS for c in classes)))
    assert replay(res).status == OK and rules.verdict(res) == "passed"


def test_unexplained_differences_fire_as_a_warning():
    assert classify(None, "fp32") == BEYOND_NUMERICS  # counters differ but no draft token did: bookkeeping
    assert classify(None, "fp32", unseen_stop=True) == UNSEEN_STOP
    assert classify(0.5, "fp32") == BEYOND_NUMERICS and classify(0.5, "bf16") == NEAR_TIE
    res = ev(report(agreement=0.9, beyond=1))
    r = replay(res)
    assert r.status == FIRING and r.severity == "warning" and "beyond numerics on 1 prompt" in r.message
    assert rules.verdict(res) == "failed"
    assert replay(ev(report(method="decode"))).status == NOT_APPLICABLE  # nothing compared: not applicable


def test_replay_columns_in_the_history_row(tmp_path):
    s = MonitoringSettings(db_url=f"sqlite:///{tmp_path / 'history.db'}", reports_dir=tmp_path / "reports",
                           rules=RuleSettings(), alert_channels=[])
    db = connect(s)
    rep = report(agreement=0.75, beyond=2)
    key = RunKey.build("pair-r", "1", rep.heldout_name, rep.heldout_version, {"num_speculative_tokens": 4}, T0.date())
    claim = history.claim_run(db, key, alias="champion", now=T0)
    out = pipeline.record_and_evaluate(db, rep, key, Lineage.from_report(rep, target_hash="t", draft_hash="d"),
                                       claim=claim, alias="champion", settings=s, evidently=False, now=T0)
    row = history.get_run(db, out.run_id)
    assert (row.method, row.replay_decode_agreement, row.replay_beyond_numerics) == ("both", 0.75, 2)
    snap = history.snapshot(db, out.run_id)
    assert snap.overall.replay_beyond_numerics == 2
    assert replay(out.evaluation.results).status == FIRING
    db.dispose()
