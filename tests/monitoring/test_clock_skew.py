"""Heartbeats across hosts whose clocks differ, on a real PostgreSQL (issue 43, item 7).

A host whose clock is one hour ahead claims a night and beats, then dies. Before: its heartbeat was
written on its own clock (one hour in the future), so every other host saw a heartbeat "-3600 s ago"
and refused the night as already running for the skew plus the stale window. Now claims and heartbeats
are written and compared on the database server's clock (:func:`monitoring.history.store_now`): the
dead claim is taken over once the stale window has passed, and a live skewed holder still keeps it.
The skewed host is this process with its clock (``monitoring.history.utcnow``) moved one hour ahead.
"""

from __future__ import annotations

import datetime as dt
import time

import pytest

from monitoring import history
from monitoring.db import Database, utcnow
from monitoring.history import RunAlreadyClaimed, RunKey
from tests.postgres import postgres_cluster

pytestmark = pytest.mark.server
STALE_S = 3.0


@pytest.fixture(scope="module")
def db():
    with postgres_cluster("specdec") as (port, _):
        d = Database(f"postgresql+psycopg://specdec@127.0.0.1:{port}/postgres")
        d.upgrade()
        yield d


def _key(day: str) -> RunKey:
    return RunKey.build("skew-pair", "1", "h", "1", {"k": 4}, day)


def _as_host_an_hour_ahead(monkeypatch, fn):
    with monkeypatch.context() as m:
        m.setattr(history, "utcnow", lambda: utcnow() + dt.timedelta(hours=1))
        return fn()


def test_a_dead_claim_of_a_host_an_hour_ahead_is_taken_over_after_the_stale_window(db, monkeypatch):
    key = _key("2026-12-01")
    claim = _as_host_an_hour_ahead(monkeypatch, lambda: history.claim_run(db, key, stale_after_s=STALE_S))
    _as_host_an_hour_ahead(monkeypatch, lambda: history.heartbeat(db, claim))  # then the host dies
    with pytest.raises(RunAlreadyClaimed):  # within the stale window: still its claim
        history.claim_run(db, key, stale_after_s=STALE_S)
    time.sleep(STALE_S + 1)
    taken = history.claim_run(db, key, stale_after_s=STALE_S)  # before: refused for one hour more
    assert taken.run_id == claim.run_id and taken.previous_status == "running (stale)"


def test_a_live_claim_of_a_host_an_hour_ahead_is_kept(db, monkeypatch):
    key = _key("2026-12-02")
    claim = _as_host_an_hour_ahead(monkeypatch, lambda: history.claim_run(db, key, stale_after_s=STALE_S))
    for _ in range(3):  # the holder beats every second, past the stale window
        time.sleep(1.0)
        _as_host_an_hour_ahead(monkeypatch, lambda: history.heartbeat(db, claim))
    with pytest.raises(RunAlreadyClaimed):
        history.claim_run(db, key, stale_after_s=STALE_S)
