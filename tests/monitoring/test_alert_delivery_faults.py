"""Alert delivery under receiver faults, against real HTTP receivers on 127.0.0.1 (issue 12, item 2).

Each fault is a real server behaviour: a receiver that records the request and hangs past the
client timeout, 5xx, 429 with Retry-After, a refused connection (nothing listens on the port).
The promise tested: at most one duplicate per incident transition and channel (a copy counts when
the request reached the receiver, answered or not), nothing lost while the receiver keeps
refusing, and no outbox row stuck in ``sending`` whatever raises at send time.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time

import pytest
from sqlalchemy import select

from monitoring import alerts, rules
from monitoring.settings import RuleSettings
from monitoring.alerts import AlertContext
from monitoring.db import DELIVERED, AlertDelivery, connect
from monitoring.settings import ChannelConfig, DeliverySettings, MonitoringSettings
from monitoring.receiver import Reply, WebhookReceiver
from tests.support.net import free_port
from tests.support.reports import make_report

T0 = dt.datetime(2026, 11, 29, 2, 0, tzinfo=dt.timezone.utc)
BAD = rules.evaluate(make_report(0.29), None, RuleSettings())
HANG = Reply(200, delay_s=30)  # recorded on arrival, answers long after the client's timeout
FAST = DeliverySettings(max_attempts=4, backoff_initial_s=0.01, backoff_max_s=2, timeout_s=0.5)


def _settings(tmp_path, url: str, **kw) -> MonitoringSettings:
    return MonitoringSettings(db_url=f"sqlite:///{tmp_path / 'history.db'}", delivery=kw.pop("delivery", FAST),
                              alert_channels=[ChannelConfig(type="webhook", url=url, name="ops")], **kw)


def _ctx() -> AlertContext:
    return AlertContext(pair_name="pair-a", pair_version="2", alias="champion")


def _copies(receiver: WebhookReceiver, key_part: str = ":fire:") -> int:
    return sum(1 for r in receiver.requests if key_part in r.headers.get("Idempotency-Key", ""))


def _rows(db) -> list[AlertDelivery]:
    with db.session() as s:
        return list(s.scalars(select(AlertDelivery).order_by(AlertDelivery.id)))


def test_hanging_receiver_gets_at_most_two_copies_over_many_runs(tmp_path):
    with WebhookReceiver(default_status=HANG) as rx:
        s = _settings(tmp_path, rx.url("/hook"))
        db = connect(s)
        out = alerts.process(db, _ctx(), BAD, settings=s, now=T0)
        assert out.transition == "fire"
        assert _copies(rx) == 1, "a timed-out request may have arrived: no retry within the run"
        for night in range(1, 5):  # the receiver keeps hanging, night after night
            alerts.deliver_pending(db, settings=s, now=T0 + dt.timedelta(days=night))
        assert _copies(rx) == 2, "worst case: one duplicate per transition"
        (row,) = _rows(db)
        assert row.status == alerts.UNCONFIRMED and "may have been delivered" in row.last_error


def test_alerts_test_command_sends_one_copy_to_a_hanging_receiver(tmp_path):
    """``specdec alerts test`` as a real process against a receiver that hangs: 1 copy, exit 1."""
    with WebhookReceiver(default_status=HANG) as rx:
        env = {"SPECDEC_HOME": str(tmp_path), "SPECDEC_DELIVERY__TIMEOUT_S": "1",
               "SPECDEC_ALERT_CHANNELS": json.dumps([{"type": "webhook", "url": rx.url("/hook"), "name": "ops"}])}
        import os

        p = subprocess.run([sys.executable, "-m", "specdec.cli", "alerts", "test"], capture_output=True, text=True,
                           env={**os.environ, **env}, timeout=120)
        assert p.returncode == 1, p.stdout + p.stderr
        assert len(rx.requests) == 1, [r.headers.get("Idempotency-Key") for r in rx.requests]
        assert "may have been delivered" in p.stderr


def test_5xx_is_retried_within_the_run_and_delivered_once(tmp_path):
    with WebhookReceiver([503, 500]) as rx:
        s = _settings(tmp_path, rx.url("/hook"))
        db = connect(s)
        out = alerts.process(db, _ctx(), BAD, settings=s, now=T0)
        assert [d.status for d in out.deliveries] == ["delivered"]
        assert len(rx.accepted) == 1 and len(rx.requests) == 3


def test_429_waits_for_retry_after(tmp_path):
    with WebhookReceiver([Reply(429, (("Retry-After", "1"),))]) as rx:
        s = _settings(tmp_path, rx.url("/hook"))
        db = connect(s)
        t0 = time.monotonic()
        out = alerts.process(db, _ctx(), BAD, settings=s, now=T0)
        assert [d.status for d in out.deliveries] == ["delivered"]
        assert len(rx.requests) == 2 and len(rx.accepted) == 1
        assert time.monotonic() - t0 >= 0.95, "the second request came before Retry-After elapsed"


def test_429_retry_after_beyond_the_backoff_cap_is_left_for_the_next_run(tmp_path):
    with WebhookReceiver([Reply(429, (("Retry-After", "3600"),))]) as rx:
        s = _settings(tmp_path, rx.url("/hook"))
        db = connect(s)
        out = alerts.process(db, _ctx(), BAD, settings=s, now=T0)
        assert [d.status for d in out.deliveries] == ["pending"]
        assert len(rx.requests) == 1 and "Retry-After" in out.deliveries[0].last_error
        again = alerts.deliver_pending(db, settings=s, now=T0 + dt.timedelta(hours=2))
        assert [d.status for d in again] == ["delivered"] and len(rx.accepted) == 1


def test_refused_connection_stays_pending_and_is_delivered_once_later(tmp_path):
    port = free_port()
    s = _settings(tmp_path, f"http://127.0.0.1:{port}/hook")
    db = connect(s)
    out = alerts.process(db, _ctx(), BAD, settings=s, now=T0)
    assert [d.status for d in out.deliveries] == ["pending"] and out.deliveries[0].attempts == FAST.max_attempts
    alerts.deliver_pending(db, settings=s, now=T0 + dt.timedelta(hours=1))  # still down
    with WebhookReceiver(port=port) as rx:
        alerts.deliver_pending(db, settings=s, now=T0 + dt.timedelta(days=1))
        alerts.deliver_pending(db, settings=s, now=T0 + dt.timedelta(days=2))
        assert len(rx.requests) == 1 and len(rx.accepted) == 1
    assert [r.status for r in _rows(db)] == ["delivered"]


def test_any_exception_at_send_time_leaves_the_row_retryable(tmp_path, monkeypatch):
    with WebhookReceiver() as rx:
        s = _settings(tmp_path, rx.url("/hook"))
        db = connect(s)
        boom = RuntimeError("renderer bug")

        def broken(*a, **k):
            raise boom

        monkeypatch.setattr(alerts.ch, "render_webhook", broken)
        out = alerts.process(db, _ctx(), BAD, settings=s, now=T0)
        assert [d.status for d in out.deliveries] == ["pending"]
        assert "RuntimeError" in out.deliveries[0].last_error
        monkeypatch.undo()
        again = alerts.deliver_pending(db, settings=s, now=T0 + dt.timedelta(minutes=1))
        assert [d.status for d in again] == ["delivered"] and len(rx.accepted) == 1


@pytest.mark.parametrize("url", ["http://exa mple.com/hook", "http://[::1/hook", "https://:99999/x", "http:///nohost"])
def test_unparseable_channel_url_is_refused_at_settings_load(url, monkeypatch):
    from pydantic import ValidationError

    monkeypatch.setenv("SPECDEC_ALERT_CHANNELS", json.dumps([{"type": "webhook", "url": url}]))
    with pytest.raises(ValidationError, match="alert channel URL"):
        MonitoringSettings()


def _alerts_test(tmp_path, channels: list[dict], **env) -> subprocess.CompletedProcess:
    import os

    base = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    return subprocess.run([sys.executable, "-m", "specdec.cli", "alerts", "test"], capture_output=True, text=True,
                          env={**base, "SPECDEC_HOME": str(tmp_path), "SPECDEC_DELIVERY__TIMEOUT_S": "5",
                               "SPECDEC_ALERT_CHANNELS": json.dumps(channels), **env}, timeout=120)


def test_a_channel_named_in_any_script_delivers(tmp_path):
    """issue 32, item 3: a non-ASCII channel name went into the Idempotency-Key header, every delivery
    failed with UnicodeEncodeError, ``alerts test`` showed a traceback and the row stayed pending."""
    from urllib.parse import unquote

    name = "équipe-опс-運用"
    with WebhookReceiver() as rx:
        p = _alerts_test(tmp_path, [{"type": "webhook", "url": rx.url("/hook"), "name": name}])
        out = p.stdout + p.stderr
        assert p.returncode == 0 and "Traceback" not in out, out[-3000:]
        (req,) = rx.requests
    key = unquote(req.headers["Idempotency-Key"])
    assert name in key and req.body["idempotency_key"] == key
    with WebhookReceiver() as rx:  # the outbox: the nightly's fire message is delivered, not left pending
        s = MonitoringSettings(db_url=f"sqlite:///{tmp_path / 'outbox.db'}", delivery=FAST,
                               alert_channels=[ChannelConfig(type="webhook", url=rx.url("/hook"), name=name)])
        db = connect(s)
        assert alerts.process(db, _ctx(), BAD, settings=s, now=T0).transition == "fire"
        assert [(r.channel_id, r.status) for r in _rows(db)] == [(name, DELIVERED)]
        assert _copies(rx) == 1


def test_an_internationalised_host_name_is_converted_and_delivered(tmp_path):
    """A valid IDN host is converted to its ASCII form (before: refused as "no valid host name"). No DNS
    here resolves it, so the receiver is the HTTP proxy the client is told to use (``HTTP_PROXY``): it
    receives the request for the converted host."""
    assert ChannelConfig(type="webhook", url="https://bücher.example:8443/höök?q=ä").url.get_secret_value() == \
        "https://xn--bcher-kva.example:8443/höök?q=ä"
    with pytest.raises(ValueError, match="internationalised"):
        ChannelConfig(type="webhook", url="https://a\u200db.example/x")  # a joiner outside its context
    with WebhookReceiver() as rx:
        p = _alerts_test(tmp_path, [{"type": "webhook", "url": "http://bücher.example/hook", "name": "ops"}],
                         HTTP_PROXY=rx.url("").rstrip("/"), NO_PROXY="")
        out = p.stdout + p.stderr
        assert p.returncode == 0 and "Traceback" not in out, out[-3000:]
        (req,) = rx.requests
    assert req.path == "http://xn--bcher-kva.example/hook" and req.headers["Host"] == "xn--bcher-kva.example"
