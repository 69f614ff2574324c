"""Alert lifecycle and delivery against real HTTP receivers on 127.0.0.1 and a real SQLite file."""

from __future__ import annotations

import datetime as dt
import logging
import threading

import pytest
from sqlalchemy import select

from monitoring import alerts, rules
from monitoring.settings import RuleSettings
from monitoring.alerts import AlertContext
from monitoring.db import AlertDelivery, Incident, connect
from monitoring.settings import ChannelConfig, DeliverySettings, MonitoringSettings
from monitoring.receiver import WebhookReceiver
from tests.support.net import free_port
from tests.support.reports import make_report

T0 = dt.datetime(2026, 11, 29, 2, 0, tzinfo=dt.timezone.utc)
SECRET = "T0SECRET/B0SECRET/xoxSECRETtoken"
BAD = rules.evaluate(make_report(0.29, categories={"chat": 0.30, "code": 0.22, "math": 0.5},
                                 category_tokens=800), None, RuleSettings())
GOOD = rules.evaluate(make_report(0.63), None, RuleSettings())
WIDE = rules.evaluate(make_report(0.35, ci_half=0.10), None, RuleSettings())  # CI too wide: inconclusive
FAST = DeliverySettings(max_attempts=3, backoff_initial_s=0.01, backoff_max_s=0.05, timeout_s=2)


def ctx(version="2", run_id=None) -> AlertContext:
    return AlertContext(
        pair_name="pair-a", pair_version=version, run_id=run_id, alias="champion",
        heldout="spec-bench-mini@1", num_speculative_tokens=4, target_hash="ab" * 32, draft_hash="cd" * 32,
        baseline="pair-a v1 (run 1, 2026-11-28)",
        root_cause_hint="target changed since the last passing run, draft unchanged: re-derive or retrain the draft",
        links={"MLflow run": "http://mlflow.local/#/experiments/1/runs/abc", "Evidently report": "/tmp/r/drift.html"},
    )


def settings_for(tmp_path, *channels: ChannelConfig, **kw) -> MonitoringSettings:
    return MonitoringSettings(db_url=f"sqlite:///{tmp_path / 'history.db'}", alert_channels=list(channels),
                              delivery=kw.pop("delivery", FAST), **kw)


@pytest.fixture
def receiver():
    with WebhookReceiver() as r:
        yield r


def events(receiver: WebhookReceiver) -> list[str]:
    return [r.body["event"] for r in receiver.accepted]


def test_incident_lifecycle_fire_remind_resolve(tmp_path, receiver):
    s = settings_for(tmp_path, ChannelConfig(type="webhook", url=receiver.url(f"/hook/{SECRET}")),
                     reminder_interval_hours=24)
    db = connect(s)
    h = dt.timedelta(hours=1)
    steps = [(T0, BAD, "fire"), (T0 + h, BAD, None), (T0 + 23 * h, BAD, None),
             (T0 + 25 * h, BAD, "remind-1"), (T0 + 26 * h, BAD, None), (T0 + 27 * h, WIDE, None),
             (T0 + 49 * h, BAD, "remind-2"), (T0 + 50 * h, WIDE, None), (T0 + 51 * h, GOOD, "resolve"),
             (T0 + 52 * h, GOOD, None), (T0 + 53 * h, WIDE, None), (T0 + 54 * h, BAD, "fire")]
    incident_ids = []
    for now, results, expected in steps:
        out = alerts.process(db, ctx(), results, settings=s, now=now)
        assert out.transition == expected, (now, expected)
        assert out.all_delivered
        if expected:
            incident_ids.append(out.incident_id)
    assert events(receiver) == ["fire", "remind-1", "remind-2", "resolve", "fire"]
    assert len(set(incident_ids[:4])) == 1 and incident_ids[4] != incident_ids[0]  # new incident
    fire = receiver.accepted[0].body
    # the message carries pair and versions, metric, value with CI, threshold, baseline,
    # categories that fell, the root-cause hint and the links
    assert fire["pair_name"] == "pair-a" and fire["pair_version"] == "2"
    assert "0.290 (95% CI 0.260-0.320)" in fire["text"] and "floor 0.400 (policy default)" in fire["text"]
    assert fire["text"].splitlines()[1] == "acceptance rate 29.0% < 40% at k = 4 (floor from policy default)"  # floor first
    assert fire["facts"]["Verdict"] == "failed"
    assert fire["facts"]["Baseline"] == "pair-a v1 (run 1, 2026-11-28)"
    assert fire["categories_fell"] == ["chat", "code"]
    assert "re-derive or retrain the draft" in fire["text"]
    assert fire["links"]["MLflow run"].startswith("http://mlflow.local") and "drift.html" in fire["text"]
    assert "Resolved" in receiver.accepted[3].body["title"]
    with db.session() as sess:
        incs = list(sess.scalars(select(Incident).order_by(Incident.id)))
        assert [i.status for i in incs] == ["resolved", "firing"] and incs[0].reminder_count == 2
    db.dispose()


def test_500_500_200_delivers_exactly_one_message(tmp_path, receiver):
    receiver.script([500, 500])
    s = settings_for(tmp_path, ChannelConfig(type="webhook", url=receiver.url(f"/hook/{SECRET}")))
    db = connect(s)
    out = alerts.process(db, ctx(), BAD, settings=s, now=T0)
    assert [r.status for r in receiver.requests] == [500, 500, 200]
    assert len(receiver.accepted) == 1
    keys = {r.headers["Idempotency-Key"] for r in receiver.requests}
    assert len(keys) == 1 and keys == {out.deliveries[0].idempotency_key}  # same key on every retry
    assert receiver.accepted[0].body["idempotency_key"] == out.deliveries[0].idempotency_key
    (d,) = out.deliveries
    assert d.status == "delivered" and d.attempts == 3 and d.response_status == 200
    # later runs never send it again
    assert alerts.deliver_pending(db, settings=s, now=T0 + dt.timedelta(minutes=5)) == []
    alerts.process(db, ctx(), BAD, settings=s, now=T0 + dt.timedelta(hours=1))
    assert len(receiver.requests) == 3
    db.dispose()


def test_receiver_down_for_a_whole_run_gets_its_message_on_the_next_run(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}/hook/{SECRET}"
    s = settings_for(tmp_path, ChannelConfig(type="webhook", url=url, name="ops"))
    db = connect(s)
    out = alerts.process(db, ctx(), BAD, settings=s, now=T0)  # nobody listens: connection refused
    assert out.transition == "fire"
    (d,) = out.deliveries
    assert d.status == "pending" and d.attempts == 3 and "ConnectError" in d.last_error
    assert [p.id for p in alerts.pending_deliveries(db)] == [d.id]
    with WebhookReceiver(port=port) as receiver:  # the receiver is back for the next nightly run
        nxt = alerts.process(db, ctx(), BAD, settings=s, now=T0 + dt.timedelta(hours=1))
        assert nxt.transition is None  # no new transition, but the pending fire goes out now
        assert [x.status for x in nxt.deliveries] == ["delivered"]
        assert events(receiver) == ["fire"] and len(receiver.requests) == 1
        assert alerts.deliver_pending(db, settings=s, now=T0 + dt.timedelta(hours=2)) == []
        assert len(receiver.requests) == 1
    assert alerts.pending_deliveries(db) == []
    db.dispose()


def test_pending_fire_is_sent_before_its_resolve(tmp_path):
    port = free_port()
    s = settings_for(tmp_path, ChannelConfig(type="webhook", url=f"http://127.0.0.1:{port}/h"))
    db = connect(s)
    alerts.process(db, ctx(), BAD, settings=s, now=T0)
    out = alerts.process(db, ctx("3"), GOOD, settings=s, now=T0 + dt.timedelta(hours=1))
    assert out.transition == "resolve" and [d.status for d in out.deliveries] == ["pending", "pending"]
    # the fire was tried again (3 more attempts, 6 in all); the resolve was held back, not tried
    assert out.deliveries[0].attempts == 6 and out.deliveries[1].attempts == 0
    with WebhookReceiver(port=port) as receiver:
        alerts.deliver_pending(db, settings=s, now=T0 + dt.timedelta(hours=2))
        assert events(receiver) == ["fire", "resolve"]
    db.dispose()


def test_concurrent_deliveries_never_send_twice(tmp_path):
    with WebhookReceiver() as receiver:
        port = free_port()
        s_down = settings_for(tmp_path, ChannelConfig(type="webhook", url=f"http://127.0.0.1:{port}/h", name="ops"),
                              delivery=DeliverySettings(max_attempts=1, timeout_s=2))
        db = connect(s_down)
        for pair in ("p1", "p2", "p3"):  # three pending messages
            c = ctx()
            c.pair_name = pair
            alerts.process(db, c, BAD, settings=s_down, now=T0)
        s_up = settings_for(tmp_path, ChannelConfig(type="webhook", url=receiver.url("/h"), name="ops"))
        barrier = threading.Barrier(4)

        def run() -> None:
            barrier.wait()
            alerts.deliver_pending(db, settings=s_up, now=T0 + dt.timedelta(hours=1))

        threads = [threading.Thread(target=run) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(r.body["pair_name"] for r in receiver.requests) == ["p1", "p2", "p3"]
        db.dispose()


def test_slack_body_has_text_and_blocks_and_several_channels_each_get_one(tmp_path):
    with WebhookReceiver() as slack, WebhookReceiver() as hook:
        s = settings_for(tmp_path, ChannelConfig(type="slack", url=slack.url(f"/services/{SECRET}")),
                         ChannelConfig(type="webhook", url=hook.url("/generic")))
        db = connect(s)
        out = alerts.process(db, ctx(), BAD, settings=s, now=T0)
        assert len(out.deliveries) == 2 and out.all_delivered
        (msg,) = [r.body for r in slack.accepted]
        assert set(msg) == {"text", "blocks"}
        assert "pair-a v2" in msg["text"] and msg["blocks"][0]["type"] == "header"
        assert any("Likely cause" in b.get("text", {}).get("text", "") for b in msg["blocks"])
        assert any(b["type"] == "context" and "<http://mlflow.local" in b["elements"][0]["text"]
                   for b in msg["blocks"])
        assert len(hook.accepted) == 1 and hook.accepted[0].body["event"] == "fire"
        db.dispose()


def test_secrets_absent_from_logs_stdout_db_and_exception_text(tmp_path, caplog, capsys):
    caplog.set_level(logging.DEBUG)
    port = free_port()
    with WebhookReceiver([500, 500, 500]) as receiver:
        s = settings_for(tmp_path, ChannelConfig(type="slack", url=receiver.url(f"/services/{SECRET}")),
                         ChannelConfig(type="webhook", url=f"http://127.0.0.1:{port}/x/{SECRET}"))
        db = connect(s)
        out = alerts.process(db, ctx(), BAD, settings=s, now=T0)
        results = alerts.send_test(s)
    assert [d.status for d in out.deliveries] == ["pending", "pending"]  # 500 x3; connection refused
    assert [r.ok for _, r in results] == [True, False]  # test message: slack up again, webhook down
    assert "HTTP Request: POST" in caplog.text  # httpx did log the requests ...
    assert "127.0.0.1" in caplog.text  # ... with scheme + host only
    texts = [caplog.text, capsys.readouterr().out, repr(s), str(s), s.model_dump_json(),
             *(d.last_error or "" for d in out.deliveries), *(r.error or "" for _, r in results),
             *(c.display for c in s.alert_channels)]
    with db.session() as sess:
        texts += [repr((d.payload, d.last_error, d.channel_id, d.idempotency_key))
                  for d in sess.scalars(select(AlertDelivery))]
    for t in texts:
        assert "SECRET" not in t
    with pytest.raises(Exception) as e:  # a malformed URL is reported without echoing it
        ChannelConfig(type="slack", url=f"ftp://hooks.example/{SECRET}")
    assert "SECRET" not in str(e.value) and "ftp://hooks.example/" in str(e.value)
    with pytest.raises(Exception) as e:
        MonitoringSettings(alert_channels=[{"type": "teams", "url": f"https://x/{SECRET}"}])
    assert "SECRET" not in str(e.value)
    db.dispose()


def test_no_channels_still_tracks_the_incident(tmp_path, caplog):
    s = settings_for(tmp_path)
    db = connect(s)
    out = alerts.process(db, ctx(), BAD, settings=s, now=T0)
    assert out.transition == "fire" and out.deliveries == []
    assert "no alert channels configured" in caplog.text
    assert alerts.open_incident(db, "pair-a") is not None
    db.dispose()
