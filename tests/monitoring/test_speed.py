"""The "speculation no longer pays" rule, speed-inconclusive on an overloaded machine, and speed in
the history row and the alert text (real SQLite file, real webhook receiver on 127.0.0.1)."""

from __future__ import annotations

import datetime as dt

import pytest

from monitoring import history, pipeline, rules
from monitoring.alerts import build_message
from monitoring.db import connect
from monitoring.history import Lineage, RunKey, RunSnapshot
from monitoring.rules import FIRING, INSUFFICIENT, NOT_APPLICABLE, OK, SPEED_INCONCLUSIVE
from monitoring.settings import ChannelConfig, DeliverySettings, MonitoringSettings, RuleSettings
from monitoring.receiver import WebhookReceiver
from tests.support.reports import make_report

T0 = dt.datetime(2026, 11, 29, 2, 0, tzinfo=dt.timezone.utc)


def report(acc=0.9, speedup=1.2, ci=(1.1, 1.3), load=2.0, cpus=2, prompts=12, **kw):
    rep = make_report(acc, num_prompts=prompts, **kw)
    g = rep.overall
    g.num_prompts, g.speedup, g.speedup_ci = prompts, speedup, list(ci)
    g.load_avg_1m, g.load_avg_1m_max, g.num_cpus = load, load, cpus
    return rep


def speed(results):
    (r,) = [x for x in results if x.rule == "speed"]
    return r


def ev(rep, base=None, settings=None):
    snap = RunSnapshot.from_report(rep, Lineage())
    bsnap = RunSnapshot.from_report(base, Lineage()) if base is not None else None
    return rules.evaluate(snap, bsnap, settings or RuleSettings())


def test_fires_when_the_ci_lies_below_one_with_its_own_severity():
    res = ev(report(speedup=0.71, ci=(0.64, 0.80)), base=report(speedup=1.21))
    r = speed(res)
    assert r.status == FIRING and r.severity == "warning" and r.baseline == pytest.approx(1.21)
    assert "speculation no longer pays" in r.message and "0.71x" in r.message and "was 1.21x" in r.message
    assert rules.verdict(res) == "failed"
    absolute = [x for x in res if x.rule == "absolute"]
    assert all(x.severity == "critical" and not x.firing for x in absolute)  # acceptance is fine
    assert rules.severity_of(res) == "warning"
    crit = ev(report(speedup=0.71, ci=(0.64, 0.80)), settings=RuleSettings(speed_severity="critical"))
    assert speed(crit).severity == "critical"


@pytest.mark.parametrize("sp, ci, status", [
    (0.95, (0.85, 1.04), INSUFFICIENT),  # point below 1, CI reaches above: no alert yet
    (1.02, (0.97, 1.08), OK),
    (1.30, (1.20, 1.40), OK),
])
def test_not_credibly_slower_does_not_fire(sp, ci, status):
    res = ev(report(speedup=sp, ci=ci))
    assert speed(res).status == status and rules.verdict(res) == "passed"


def test_a_credible_fall_below_the_baseline_fires_although_the_ci_reaches_one():
    """The demo's stale night on six prompts: 1.42x [1.20, 1.50] -> 0.73x [0.61, 1.03]."""
    base = report(speedup=1.42, ci=(1.20, 1.50))
    r = speed(ev(report(speedup=0.73, ci=(0.61, 1.03)), base=base))
    assert r.status == FIRING and "credibly below the baseline's 1.42x (95% CI 1.20-1.50x)" in r.message
    assert speed(ev(report(speedup=0.73, ci=(0.61, 1.03)))).status == INSUFFICIENT  # no baseline: no claim
    assert speed(ev(report(speedup=0.95, ci=(0.85, 1.25)), base=base)).status == INSUFFICIENT  # CIs overlap
    assert speed(ev(report(speedup=1.05, ci=(0.95, 1.15)), base=base)).status == OK  # still pays: no alert


def test_overloaded_machine_is_speed_inconclusive_and_never_alerts():
    rep = report(speedup=0.6, ci=(0.5, 0.7), load=4.3, cpus=2)  # 2.15 per CPU > 1.25
    res = ev(rep)
    r = speed(res)
    assert r.status == SPEED_INCONCLUSIVE and not r.firing
    assert "speed-inconclusive" in r.message and "load 4.30 on 2 CPUs" in r.message
    assert rules.verdict(res) == "inconclusive"
    # the same numbers at an ordinary load fire; a looser limit accepts the loaded run
    assert speed(ev(report(speedup=0.6, ci=(0.5, 0.7), load=2.2, cpus=2))).status == FIRING
    assert speed(ev(rep, settings=RuleSettings(speed_max_load_per_cpu=3.0))).status == FIRING
    # a clear gain measured under load still counts: the load only withholds judgement on bad news
    fast = ev(report(speedup=1.3, ci=(1.2, 1.4), load=4.3, cpus=2))
    assert speed(fast).status == OK and rules.verdict(fast) == "passed"


def test_a_speed_model_miss_never_silences_a_credible_slowdown():
    # issue 30's night 2: measured 0.51x [0.48, 0.69], the model said 0.66x (0.76, outside the band), load fine
    rep = report(speedup=0.51, ci=(0.48, 0.69), load=2.04, cpus=2)
    rep.overall.timing_suspect, rep.overall.measured_over_predicted = True, 0.76
    rep.overall.predicted_speedup, rep.overall.num_remeasured = 0.66, 12
    res = ev(rep)
    r = speed(res)
    assert r.status == FIRING and rules.verdict(res) == "failed"
    assert "0.51x (95% CI 0.48-0.69x)" in r.message and "speed model's 0.66x" in r.message
    assert "measured/predicted 0.76" in r.message and "the verdict uses the measured speedup" in r.message
    assert "12 prompt(s) re-timed" in r.message and "overloaded" not in r.message
    # a suspect slowdown whose CI still reaches 1.0x waits, and says why (not "machine overloaded")
    unsure = report(speedup=0.8, ci=(0.6, 1.1), load=2.0, cpus=2)
    unsure.overall.timing_suspect, unsure.overall.measured_over_predicted, unsure.overall.predicted_speedup = True, 0.7, 1.14
    u = speed(ev(unsure))
    assert u.status == SPEED_INCONCLUSIVE and not u.firing
    assert "disagrees with the speed model's 1.14x" in u.message and "overloaded" not in u.message
    fast = report(speedup=1.3, ci=(1.2, 1.4))
    fast.overall.timing_suspect = True  # a suspect gain withholds nothing
    assert speed(ev(fast)).status == OK


def test_too_few_prompts_disabled_and_unmeasured():
    assert speed(ev(report(speedup=0.5, ci=(0.4, 0.6), prompts=3))).status == INSUFFICIENT
    assert speed(ev(report(speedup=0.5, ci=(0.4, 0.6)), settings=RuleSettings(speed_enabled=False))).status == NOT_APPLICABLE
    rep = report()
    rep.overall.speedup = float("nan")
    assert speed(ev(rep)).status == NOT_APPLICABLE


def test_alert_text_names_acceptance_and_speedup_changes():
    base = report(acc=0.93, speedup=1.24, ci=(1.15, 1.33))
    cur = report(acc=0.23, speedup=0.55, ci=(0.49, 0.62), ci_half=0.03)
    res = ev(cur, base=base)
    from monitoring.alerts import AlertContext

    msg = build_message("fire", AlertContext(pair_name="p", pair_version="2", run_id=1, scope="challenger",
                                             alias="challenger", heldout="h@1", num_speculative_tokens=4),
                        res)
    assert "Since baseline: per-token acceptance 0.930 -> 0.230, speedup 1.24x -> 0.55x" in msg["text"]
    # every acceptance line names the metric it judged (the acceptance rate at k, issue 41) and its floor,
    # with the per-token acceptance beside it; the floor comes first, then the relative rule and speed
    lines = msg["text"].splitlines()
    assert lines[1].startswith("acceptance rate 23.0% < 40% at k = 4") and lines[2].startswith("Since baseline")
    assert "absolute (critical): acceptance rate 0.230" in msg["text"] and "floor 0.400 (policy default)" in msg["text"]
    assert "per-token acceptance 0.230" in msg["text"] and "Categories that fell: chat 0.230 < 0.40" in msg["text"]
    assert msg["facts"]["Speedup"].startswith("0.55x (95% CI 0.49-0.62x)")
    assert msg["facts"]["Severity"] == "critical"  # acceptance collapsed too
    assert "*speed* (warning): speculation no longer pays" in "\n".join(msg["lines"])


def test_history_row_and_end_to_end_alert(tmp_path):
    with WebhookReceiver() as receiver:
        s = MonitoringSettings(
            db_url=f"sqlite:///{tmp_path / 'history.db'}", reports_dir=tmp_path / "reports", rules=RuleSettings(),
            alert_channels=[ChannelConfig(type="webhook", url=receiver.url("/hook"))],
            delivery=DeliverySettings(max_attempts=2, backoff_initial_s=0.01, timeout_s=2),
        )
        db = connect(s)
        cfg = {"num_speculative_tokens": 4}

        def night(version, day, rep, alias, target):
            key = RunKey.build("pair-s", version, rep.heldout_name, rep.heldout_version, cfg,
                               T0.date() + dt.timedelta(days=day))
            claim = history.claim_run(db, key, alias=alias, now=T0 + dt.timedelta(days=day))
            return pipeline.record_and_evaluate(
                db, rep, key, Lineage.from_report(rep, target_hash=target, draft_hash="d1"), claim=claim,
                alias=alias, settings=s, evidently=False, now=T0 + dt.timedelta(days=day))

        n1 = night("1", 0, report(acc=0.93, speedup=1.24, ci=(1.15, 1.33)), "champion", "t1")
        row = history.get_run(db, n1.run_id)
        assert (row.speedup, row.speedup_ci_low, row.speedup_ci_high) == pytest.approx((1.24, 1.15, 1.33))
        assert (row.load_avg_1m, row.num_cpus) == (2.0, 2)
        assert history.snapshot(db, n1.run_id).overall.speedup_ci == pytest.approx([1.15, 1.33])
        # acceptance still above 0.40 but speed lost: only the speed rule fires, with the lineage hint
        n2 = night("2", 1, report(acc=0.85, speedup=0.80, ci=(0.72, 0.90)), "challenger", "t2")
        assert [r.rule for r in n2.evaluation.firing] == ["speed"]
        assert n2.alert.transition == "fire"
        text = receiver.accepted[0].body["text"]
        assert "speedup 1.24x -> 0.80x" in text and "per-token acceptance 0.930 -> 0.850" in text
        assert "target changed since the last passing run" in text
        # an overloaded night with the same bad speed neither resolves nor re-fires
        n3 = night("2", 2, report(acc=0.85, speedup=0.80, ci=(0.72, 0.90), load=5.0), "challenger", "t2")
        assert speed(n3.evaluation.results).status == SPEED_INCONCLUSIVE
        assert n3.evaluation.verdict == "inconclusive" and n3.alert.transition is None
        # a night at ordinary load with speed back resolves it
        n4 = night("2", 3, report(acc=0.9, speedup=1.2, ci=(1.1, 1.3)), "challenger", "t2")
        assert n4.evaluation.verdict == "passed" and n4.alert.transition == "resolve"
        db.dispose()
