"""``specdec db upgrade``, ``specdec history``, ``specdec alerts test`` through the real CLI app."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from monitoring.db import head_revision
from typer.testing import CliRunner

from monitoring import history
from monitoring.cli import sparkline
from monitoring.db import connect
from monitoring.history import Lineage, RunKey
from monitoring.receiver import WebhookReceiver
from tests.support.net import free_port
from tests.support.reports import make_report
from specdec.cli import app

SECRET = "T0/B0/cliSECRETtoken"


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SPECDEC_DB_URL", raising=False)
    monkeypatch.delenv("SPECDEC_ALERT_CHANNELS", raising=False)
    monkeypatch.setenv("SPECDEC_DELIVERY__MAX_ATTEMPTS", "2")
    monkeypatch.setenv("SPECDEC_DELIVERY__BACKOFF_INITIAL_S", "0.01")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_sparkline_scale():
    assert sparkline([0.0, 0.5, 1.0, None]) == "▁▅█·"


def test_db_upgrade_creates_history_db_under_specdec_home(env):
    r = CliRunner().invoke(app, ["db", "upgrade"])
    assert r.exit_code == 0, r.output
    assert (env / "home" / "history.db").exists() and f"revision {head_revision()}" in r.output
    r = CliRunner().invoke(app, ["db", "current"])
    assert r.exit_code == 0 and head_revision() in r.output


def test_history_table_and_trend(env):
    db = connect(url=f"sqlite:///{env / 'home' / 'history.db'}")
    day = dt.date(2026, 11, 20)
    for i, acc in enumerate([0.63, 0.62, 0.29, 0.61]):
        rep = make_report(acc)
        key = RunKey.build("pair-a", str(i + 1), rep.heldout_name, "1", rep.config, day + dt.timedelta(days=i))
        history.record_run(db, rep, key, Lineage("t", "d"), alias="champion")
    history.record_run(db, make_report(0.5), RunKey.build("pair-b", "1", "h", "1", {}, day), Lineage())
    db.dispose()
    r = CliRunner().invoke(app, ["history", "--pair", "pair-a", "--limit", "10"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "pair-a v4" in r.output and "pair-b" not in r.output
    assert "0.290 (0.260-0.320)" in r.output
    assert "acceptance trend pair-a: ▆▅▃▅" in r.output  # oldest -> newest, 8 levels on 0..1
    r = CliRunner().invoke(app, ["history", "--limit", "2"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and r.output.count(" v") >= 2 and "pair-a v4" in r.output


def test_history_unreachable_database_is_a_clean_error(env):
    r = CliRunner().invoke(app, ["history", "--db-url", "postgresql+psycopg://u:pw-SECRET@127.0.0.1:1/x"])
    assert r.exit_code == 1 and "cannot open history store" in r.output
    assert "pw-SECRET" not in r.output and "Traceback" not in r.output


def test_alerts_test_ok_and_failure_exit_codes_without_leaking_urls(env, monkeypatch):
    with WebhookReceiver() as receiver:
        channels = [{"type": "slack", "url": receiver.url(f"/services/{SECRET}")},
                    {"type": "webhook", "url": receiver.url(f"/hook/{SECRET}"), "name": "ops"}]
        monkeypatch.setenv("SPECDEC_ALERT_CHANNELS", json.dumps(channels))
        r = CliRunner().invoke(app, ["alerts", "test"])
        assert r.exit_code == 0, r.output
        assert len(receiver.accepted) == 2 and "ok" in r.output and "ops" in r.output
        assert SECRET not in r.output
        slack_body = next(x.body for x in receiver.accepted if x.path.startswith("/services"))
        assert set(slack_body) == {"text", "blocks"}
    channels.append({"type": "webhook", "url": f"http://127.0.0.1:{free_port()}/down/{SECRET}", "name": "down"})
    monkeypatch.setenv("SPECDEC_ALERT_CHANNELS", json.dumps(channels[2:]))
    r = CliRunner().invoke(app, ["alerts", "test"])
    assert r.exit_code == 1 and "FAIL" in r.output and "down" in r.output
    assert SECRET not in r.output


def test_alerts_test_without_channels_exits_1(env):
    r = CliRunner().invoke(app, ["alerts", "test"])
    assert r.exit_code == 1 and "no alert channels configured" in r.output
