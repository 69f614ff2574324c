"""Only a 2xx is a delivery (issue 25, item 1), against real HTTP(S) receivers on 127.0.0.1.

A receiver that redirects is not a delivery: a 302 (a plain-http hook pointing at its https
address) is reported with its target and marks the row ``failed`` once; a 307/308 to https keeps the
POST and is followed (checked against a real TLS receiver); a redirect to plain http is not
followed. A permanent 4xx (400, 404, 410) marks the row ``failed`` once, is logged, is not re-sent
on later runs, and a channel-health alert goes to the other channels. ``specdec alerts test``
against a 302 receiver exits 1 naming the redirect.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import ssl
import subprocess
import sys

import httpx
import pytest
from sqlalchemy import select

from monitoring import alerts, rules
from monitoring.settings import RuleSettings
from monitoring.alerts import AlertContext
from monitoring.db import AlertDelivery, connect
from monitoring.settings import ChannelConfig, DeliverySettings, MonitoringSettings
from monitoring.receiver import Reply, WebhookReceiver
from tests.support.reports import make_report

T0 = dt.datetime(2026, 11, 29, 2, 0, tzinfo=dt.timezone.utc)
BAD = rules.evaluate(make_report(0.29), None, RuleSettings())
FAST = DeliverySettings(max_attempts=3, backoff_initial_s=0.01, backoff_max_s=1, timeout_s=2)


def _settings(tmp_path, *channels: tuple[str, str]) -> MonitoringSettings:
    return MonitoringSettings(db_url=f"sqlite:///{tmp_path / 'history.db'}", delivery=FAST,
                              alert_channels=[ChannelConfig(type="webhook", url=u, name=n) for n, u in channels])


def _ctx() -> AlertContext:
    return AlertContext(pair_name="pair-a", pair_version="2", alias="champion")


def _rows(db) -> list[AlertDelivery]:
    with db.session() as s:
        return list(s.scalars(select(AlertDelivery).order_by(AlertDelivery.id)))


def _redirect(status: int, to: str) -> Reply:
    return Reply(status, headers=(("Location", to),))


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1: (server context, client context)."""
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(d / "k.pem"), "-out", str(d / "c.pem")],
                   check=True, capture_output=True)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(d / "c.pem", d / "k.pem")
    return server, ssl.create_default_context(cafile=str(d / "c.pem"))


def _https(rx: WebhookReceiver, server_ctx: ssl.SSLContext) -> str:
    rx.server.socket = server_ctx.wrap_socket(rx.server.socket, server_side=True)
    return f"https://127.0.0.1:{rx.port}"


def test_302_is_not_a_delivery_row_failed_once_and_other_channel_told(tmp_path, caplog):
    with WebhookReceiver(default_status=_redirect(302, "https://hooks.example.com/services/T0/B0/SECRETPATH")) as rx, \
            WebhookReceiver() as other:
        s = _settings(tmp_path, ("redirecting", rx.url("/hook")), ("ops", other.url("/hook")))
        db = connect(s)
        with caplog.at_level(logging.ERROR, logger="monitoring.alerts"):
            out = alerts.process(db, _ctx(), BAD, settings=s, now=T0)
        assert not out.all_delivered
        for night in range(1, 4):  # later runs do not re-send it
            alerts.deliver_pending(db, settings=s, now=T0 + dt.timedelta(days=night))
        assert len(rx.requests) == 1, "a refused row is sent once"
        rows = {(r.channel_id, r.transition): r for r in _rows(db)}
        bad = rows[("redirecting", "fire")]
        assert bad.status == alerts.REFUSED and bad.response_status == 302
        assert "redirect to https://hooks.example.com/" in bad.last_error and "SECRETPATH" not in bad.last_error
        assert "FAILED" in caplog.text and "302" in caplog.text
        health = [r for r in other.accepted if r.body.get("event") == alerts.CHANNEL_HEALTH]
        assert len(health) == 1 and "redirecting" in health[0].body["title"]
        assert "302" in health[0].body["text"]
        assert not [r for r in rx.requests if r.body.get("event") == alerts.CHANNEL_HEALTH]
        assert rows[("ops", "fire")].status == "delivered"


@pytest.mark.parametrize("status", [400, 404, 410])
def test_permanent_4xx_marks_the_row_failed_once(tmp_path, status):
    with WebhookReceiver(default_status=status) as rx, WebhookReceiver() as other:
        s = _settings(tmp_path, ("gone", rx.url("/hook")), ("ops", other.url("/hook")))
        db = connect(s)
        alerts.process(db, _ctx(), BAD, settings=s, now=T0)
        for night in range(1, 4):
            alerts.deliver_pending(db, settings=s, now=T0 + dt.timedelta(days=night))
        assert len(rx.requests) == 1, f"HTTP {status} is permanent: one request, not one per run"
        row = next(r for r in _rows(db) if r.channel_id == "gone")
        assert row.status == alerts.REFUSED and f"HTTP {status}" in row.last_error
        assert [r.body["event"] for r in other.accepted].count(alerts.CHANNEL_HEALTH) == 1
        assert row.id in {d.id for d in alerts.pending_deliveries(db)}, "listed as not delivered"


def test_transient_statuses_still_retry(tmp_path):
    with WebhookReceiver([408, 503]) as rx:
        s = _settings(tmp_path, ("ops", rx.url("/hook")))
        out = alerts.process(connect(s), _ctx(), BAD, settings=s, now=T0)
        assert out.all_delivered and len(rx.requests) == 3


def test_307_to_https_is_followed_keeping_the_post(tmp_path, tls):
    server_ctx, client_ctx = tls
    with WebhookReceiver() as target_rx:
        base = _https(target_rx, server_ctx)
        with WebhookReceiver(default_status=_redirect(307, f"{base}/new-hook")) as rx:
            s = _settings(tmp_path, ("ops", rx.url("/hook")))
            with httpx.Client(verify=client_ctx) as client:
                out = alerts.process(connect(s), _ctx(), BAD, settings=s, now=T0, client=client)
            assert out.all_delivered
            assert len(rx.requests) == 1 and len(target_rx.accepted) == 1
            got = target_rx.accepted[0]
            assert got.path == "/new-hook" and got.body["event"] == "fire"
            assert got.headers["Idempotency-Key"] == rx.requests[0].headers["Idempotency-Key"]


def test_redirect_to_plain_http_is_not_followed(tmp_path):
    with WebhookReceiver() as target_rx:
        with WebhookReceiver(default_status=_redirect(308, target_rx.url("/x"))) as rx:
            s = _settings(tmp_path, ("ops", rx.url("/hook")))
            db = connect(s)
            alerts.process(db, _ctx(), BAD, settings=s, now=T0)
            assert target_rx.requests == []
            (row,) = _rows(db)
            assert row.status == alerts.REFUSED and "308" in row.last_error and "http://127.0.0.1" in row.last_error


def test_alerts_test_command_against_a_302_exits_1_naming_the_redirect(tmp_path):
    with WebhookReceiver(default_status=_redirect(302, "https://hooks.example.com/services/new")) as rx:
        env = {"SPECDEC_HOME": str(tmp_path),
               "SPECDEC_ALERT_CHANNELS": json.dumps([{"type": "webhook", "url": rx.url("/hook"), "name": "ops"}])}
        p = subprocess.run([sys.executable, "-m", "specdec.cli", "alerts", "test"], capture_output=True, text=True,
                           env={**os.environ, **env}, timeout=120)
        text = p.stdout + p.stderr
        assert p.returncode == 1, text
        assert "302" in text and "redirect to https://hooks.example.com/" in text, text
        assert "ok" not in p.stdout
