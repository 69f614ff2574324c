"""An alert says what fired, for which draft, and what to do (issue 51): a layer-skip draft was ``"Draft": null``
(its version's ``draft`` tag says none) and the alert named no action ("the cause cannot be narrowed down").
Through the real pipeline (a real SQLite history, the drift rules, the outbox) to a real HTTP receiver."""

from __future__ import annotations

import datetime as dt

from monitoring import pipeline
from monitoring.actions import FLOOR_ACTIONS, RULE_ACTIONS
from monitoring.db import connect
from monitoring.history import Lineage, RunKey
from monitoring.receiver import WebhookReceiver
from monitoring.settings import ChannelConfig, DeliverySettings, MonitoringSettings, RuleSettings
from tests.support.reports import make_report

FAST = DeliverySettings(max_attempts=2, backoff_initial_s=0.01, backoff_max_s=0.05, timeout_s=5)


def _layerskip(rate: float, **kw):
    report = make_report(rate, **kw)
    report.drafter_kind, report.drafter_ref = "layerskip", "num_layers=8"
    return report


def _night(db, settings, report, *, version: str, day: dt.date, lineage: Lineage):
    key = RunKey.build("ls-pair", version, report.heldout_name, "1", report.config, day)
    return pipeline.record_and_evaluate(db, report, key, lineage, alias="champion", champion_version="1",
                                        settings=settings, evidently=False)


def test_a_layerskip_draft_failing_the_floor_is_named_with_one_do_line_per_cause(tmp_path):
    with WebhookReceiver() as rx:
        settings = MonitoringSettings(db_url=f"sqlite:///{tmp_path / 'h.db'}", delivery=FAST,
                                      alert_channels=[ChannelConfig(type="webhook", url=rx.url())])
        db = connect(settings)
        healthy = _layerskip(0.70)
        _night(db, settings, healthy, version="1", day=dt.date(2026, 12, 5), lineage=Lineage("t1", None, "1", "0.1"))
        stale = _layerskip(0.20, categories={"chat": 0.2})
        out = _night(db, settings, stale, version="2", day=dt.date(2026, 12, 6), lineage=Lineage("t2", None, "1", "0.1"))
        assert out.alert.transition == "fire"
        [body] = [r.body for r in rx.accepted]
    assert body["facts"]["Draft"] == "layerskip num_layers=8"
    assert body["title"].endswith("ls-pair v2 (champion)")
    do = [ln for ln in body["lines"] if ln.startswith("Do: ")]
    fired = list(dict.fromkeys(r["rule"] for r in body["rules"]))
    assert len(do) == len([r for r in fired if r == "absolute" or r in RULE_ACTIONS]) >= 2
    assert do[0] == FLOOR_ACTIONS["target"]  # the target changed under the same draft
    assert body["actions"] == do and all(ln in body["text"] for ln in do)


def test_one_alert_per_version_per_night_across_aliases_and_sources(tmp_path):
    """The same failing version under @champion, @challenger and its engine check the same night: one message; the
    quiet incidents are tracked, send no reminder or resolve of their own, and speak again once the one that
    alerted is resolved."""
    from monitoring import alerts, rules
    from monitoring.alerts import AlertContext

    t0 = dt.datetime(2026, 12, 7, 2, 0, tzinfo=dt.timezone.utc)
    bad, good = (rules.evaluate(make_report(r), None, RuleSettings()) for r in (0.2, 0.7))
    with WebhookReceiver() as rx:
        settings = MonitoringSettings(db_url=f"sqlite:///{tmp_path / 'h.db'}", delivery=FAST,
                                      alert_channels=[ChannelConfig(type="webhook", url=rx.url())])
        db = connect(settings)

        def run(scope, results, at, version="3"):
            ctx = AlertContext(pair_name="p", pair_version=version, scope=scope, alias=scope or None)
            return alerts.process(db, ctx, results, settings=settings, now=at).transition

        assert [run("champion", bad, t0), run("challenger", bad, t0 + dt.timedelta(minutes=4)),
                run("engine:llamacpp", bad, t0 + dt.timedelta(minutes=9))] == ["fire", None, None]
        assert run("champion", bad, t0 + dt.timedelta(hours=1), version="4") is None  # still firing: no new fire
        assert run("challenger", good, t0 + dt.timedelta(hours=2)) is None  # a quiet incident resolves quietly
        assert run("champion", good, t0 + dt.timedelta(hours=3)) == "resolve"
        assert run("engine:llamacpp", bad, t0 + dt.timedelta(hours=30)) == "remind-1"  # speaks for itself again
        assert [r.body["event"] for r in rx.accepted] == ["fire", "resolve", "remind-1"]


def test_a_hand_moved_champion_alerts_although_its_version_failed_tonight(tmp_path):
    """The quiet twin is for measurements of the same version; @champion moved by hand to that failing version is
    an act someone must undo, and always speaks (tests/flows/test_watch.py's ungated alert never came)."""
    from monitoring import alerts, promotion_alerts, rules
    from monitoring.alerts import AlertContext

    t0 = dt.datetime(2026, 12, 7, 2, 0, tzinfo=dt.timezone.utc)
    bad = rules.evaluate(make_report(0.2), None, RuleSettings())
    with WebhookReceiver() as rx:
        settings = MonitoringSettings(db_url=f"sqlite:///{tmp_path / 'h.db'}", delivery=FAST,
                                      alert_channels=[ChannelConfig(type="webhook", url=rx.url())])
        db = connect(settings)
        ctx = AlertContext(pair_name="p", pair_version="2", scope="challenger", alias="challenger")
        assert alerts.process(db, ctx, bad, settings=settings, now=t0).transition == "fire"
        out = promotion_alerts.alert_ungated_promotion(db, "p", "champion", version="2", firing=True,
                                                       message="@champion moved to v2 by hand", settings=settings,
                                                       now=t0 + dt.timedelta(minutes=5))
        assert out.transition == "fire"
        assert [r.body["event"] for r in rx.accepted] == ["fire", "fire"]
