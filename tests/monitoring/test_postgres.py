"""The history store on a real PostgreSQL server (psycopg 3), started here as a throwaway cluster.

Skipped only where no PostgreSQL server binaries exist (see :func:`tests.postgres.postgres_cluster`).
"""

from __future__ import annotations

import datetime as dt
import threading

import pytest

from monitoring import alerts, history, rules
from monitoring.settings import RuleSettings
from monitoring.alerts import AlertContext
from monitoring.db import Database, head_revision
from monitoring.history import Lineage, RunAlreadyClaimed, RunKey
from monitoring.settings import MonitoringSettings
from tests.support.reports import make_report
from tests.postgres import postgres_cluster


@pytest.fixture(scope="module")
def pg_url():
    with postgres_cluster("specdec") as (port, _):
        yield f"postgresql+psycopg://specdec@127.0.0.1:{port}/postgres"


def test_postgres_migrate_upsert_claim_and_incident(pg_url):
    db = Database(pg_url)
    assert db.current_revision() is None
    db.upgrade()
    assert db.current_revision() == head_revision()
    from sqlalchemy import inspect

    assert "source" in {c["name"] for c in inspect(db.engine).get_columns("validation_runs")}
    rep = make_report(0.29, num_prompts=5)
    key = RunKey.build("pair-a", "2", rep.heldout_name, "1", rep.config, "2026-11-29")

    # concurrent claims from threads, each with its own connection: exactly one wins
    barrier, won, refused = threading.Barrier(4), [], []

    def worker() -> None:
        barrier.wait()
        try:
            won.append(history.claim_run(db, key))
        except RunAlreadyClaimed:
            refused.append(1)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(won) == 1 and len(refused) == 3
    rid = history.record_run(db, rep, key, Lineage("t2", "d1"), claim=won[0])
    assert history.record_run(db, rep, key, Lineage("t2", "d1")) == rid  # upsert, one row
    assert len(history.list_runs(db)) == 1 and len(history.prompt_results(db, rid)) == 5
    assert history.snapshot(db, rid).overall.acceptance_rate == pytest.approx(0.29)

    s = MonitoringSettings(db_url=pg_url)
    results = rules.evaluate(rep, None, RuleSettings())
    t0 = dt.datetime(2026, 11, 29, 2, tzinfo=dt.timezone.utc)
    ctx = AlertContext(pair_name="pair-a", pair_version="2", run_id=rid)
    assert alerts.process(db, ctx, results, settings=s, now=t0).transition == "fire"
    assert alerts.process(db, ctx, results, settings=s, now=t0 + dt.timedelta(hours=1)).transition is None
    assert alerts.open_incident(db, "pair-a").opened_at == t0  # timezone-aware round trip

    # a production window (monitoring.production) next to the nightly row, evaluated on Postgres
    from monitoring.production.counters import WindowCounters, window_metrics
    from monitoring.production.rules import evaluate_window
    from monitoring.production.store import Window, record_window

    g = window_metrics(WindowCounters("m", 300, 900, 520, [245, 180, 95]))
    pid = record_window(db, Window(pair="pair-a", version="2", alias="champion", source="vllm", engine="vllm", model="m",
                                   start=t0, end=t0 + dt.timedelta(minutes=15), metrics=g, config={"window_seconds": 900}))
    ev = evaluate_window(db, pid, settings=s)
    assert ev.verdict == "passed" and ev.representativeness.status == "not_applicable"  # nightly v2 not evaluated
    assert [r.id for r in history.list_runs(db, source="production")] == [pid]
    assert [r.id for r in history.list_runs(db, source="nightly")] == [rid]
    db.dispose()
