"""Alembic 0009 moves a row's origin out of string prefixes into columns (issue 42): ``source`` becomes
``nightly`` | ``production`` | ``engine``, the engine and a production window's source name get their own
columns, ``heldout_name`` loses its prefix. A history written by the code before (schema 0008: nightly runs,
production windows, engine checks; ``data/history_0008_prefixed.json``, with what every read gave on it) is
loaded at 0008, upgraded, and read again: the history table, the ``--source`` filters, the trend points, the
baselines, the re-evaluations and the alert contexts are the same; recording the same night or window again
updates its migrated row; downgrade gives the 0008 rows back. On SQLite and on PostgreSQL (where installed)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command

from monitoring import alerts, engine_checks, history, pipeline
from monitoring.cli import _history_cells
from monitoring.db import Database, alembic_config
from monitoring.production import ingest, store
from monitoring.production.rules import evaluate_window
from monitoring.settings import MonitoringSettings
from tests.postgres import postgres_cluster
from tests.support.reports import make_report

FIXTURE = json.loads((Path(__file__).parent / "data" / "history_0008_prefixed.json").read_text())
BEFORE = "0008_floor_on_acceptance_rate"


def _jsonable(x):
    if isinstance(x, (dt.datetime, dt.date)):
        return x.isoformat()
    raise TypeError(type(x))


def same(a, b) -> bool:
    """Equal as JSON (NaN equal to NaN; datetimes as ISO strings)."""
    def dump(x):
        return json.dumps(x, sort_keys=True, default=_jsonable)
    return dump(a) == dump(b)


def _value(v, col: sa.Column):
    """A fixture value (SQLite's text) as the Python value of ``col``'s type."""
    if v is None:
        return None
    if isinstance(col.type, sa.JSON):
        return json.loads(v) if isinstance(v, str) else v
    if isinstance(col.type, sa.DateTime):
        t = dt.datetime.fromisoformat(v)
        return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)
    if isinstance(col.type, sa.Date):
        return dt.date.fromisoformat(v)
    if isinstance(col.type, sa.Boolean):
        return bool(v)
    return v


def load_0008(db: Database) -> None:
    """The fixture's rows in a store at 0008 (ids kept; Postgres' id sequences moved past them)."""
    db.upgrade(BEFORE)
    meta = sa.MetaData()
    with db.engine.begin() as conn:
        for name in ("validation_runs", "prompt_results"):
            table = sa.Table(name, meta, autoload_with=conn)
            rows = [{k: _value(v, table.c[k]) for k, v in r.items()} for r in FIXTURE["tables"][name]]
            conn.execute(table.insert(), rows)
            if conn.dialect.name == "postgresql":
                conn.execute(sa.text(f"SELECT setval(pg_get_serial_sequence('{name}', 'id'), (SELECT max(id) FROM {name}))"))


def evaluation(e) -> dict:
    return {"verdict": e.verdict, "results": [r.to_dict() for r in e.results], "hint": e.root_cause_hint,
            "baseline_run_id": e.baseline_run_id, "baseline_label": e.baseline_label,
            "representativeness": e.representativeness.to_dict() if e.representativeness else None,
            "nightly_run_id": e.nightly_run_id, "nightly_label": e.nightly_label}


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'h.db'}"
        return
    with postgres_cluster("specdec") as (port, _):
        yield f"postgresql+psycopg://specdec@127.0.0.1:{port}/postgres"


def test_upgrade_backfills_the_columns_and_every_read_is_unchanged(store_url, tmp_path, monkeypatch):
    db = Database(store_url)
    load_0008(db)
    db.upgrade()
    ids, reads = FIXTURE["ids"], FIXTURE["reads"]
    with db.engine.connect() as conn:
        got = {r.id: (r.source, r.engine, r.production_source, r.heldout_name, r.heldout_version) for r in conn.execute(
            sa.text("SELECT id, source, engine, production_source, heldout_name, heldout_version FROM validation_runs"))}
    assert [got[i] for i in ids["nightly"]] == [("nightly", None, None, "spec-bench-mini", "1")] * 3
    assert [got[i][:4] for i in ids["production"]] == [("production", "vllm", "vllm-test", "tiny")] * 3
    assert got[ids["production"][0]][4] == "2026-11-30T10:15:00.000Z"  # the window's label stays the unique key's part
    assert [got[i] for i in ids["engine"]] == [("engine", "llamacpp", None, "spec-bench-mini", "1")] * 2

    assert [list(_history_cells(r)) for r in history.list_runs(db, pair_name="pair-a", limit=50)] == reads["cells"]
    assert {label: [r.id for r in history.list_runs(db, limit=50, **dict(zip(("source", "engine"),
                                                                               history.parse_source_label(label))))]
            for label in reads["by_source"]} == reads["by_source"]
    assert same(history.trend_points(db, "pair-a"), reads["trend"])
    newer_window = store.newer_evaluated_window(db, ids["production"][0])
    newer_run = history.newer_evaluated_run(db, ids["nightly"][0], alias="champion")
    assert {"find_baseline": history.find_baseline(db, ids["nightly"][-1]).id,
            "previous_passing_window": store.previous_passing_window(db, ids["production"][-1]).id,
            "newer_evaluated_window": newer_window.id if newer_window else None,
            "nightly_reference": store.nightly_reference(db, "pair-a", "1", "champion").id,
            "newer_evaluated_run": newer_run.id if newer_run else None} == reads["baselines"]

    ms = MonitoringSettings(db_url=store_url, home=tmp_path, alert_channels=[])
    evals = {"nightly": evaluation(pipeline.evaluate_run(db, ids["nightly"][-1], settings=ms)),
             "production": evaluation(evaluate_window(db, ids["production"][-1], settings=ms)),
             "engine": evaluation(engine_checks.evaluate_engine_check(db, ids["engine"][-1], settings=ms))}
    assert same(evals, reads["evaluations"])

    captured = []

    class _Outcome:
        transition = None

    monkeypatch.setattr(alerts, "process", lambda _db, ctx, _results, **kw: (captured.append(vars(ctx).copy()), _Outcome())[1])
    ingest.alert_window(db, evaluate_window(db, ids["production"][-1], settings=ms), source="vllm-test", settings=ms)
    engine_checks.alert_engine_check(db, engine_checks.evaluate_engine_check(db, ids["engine"][-1], settings=ms),
                                     settings=ms)
    engine_checks.alert_engine_error(db, pair="pair-a", version="1", alias="champion", engine="llamacpp",
                                     url="http://127.0.0.1:8080", message="unreachable", settings=ms)
    pipeline.alert(db, pipeline.evaluate_run(db, ids["nightly"][-1], settings=ms), settings=ms)
    assert same(captured, reads["alert_contexts"])


def test_recording_again_updates_the_migrated_rows_and_downgrade_gives_the_prefixes_back(store_url):
    db = Database(store_url)
    load_0008(db)
    db.upgrade()
    ids = FIXTURE["ids"]
    # the last window again (as ingested before the migration): its migrated row, not a new one
    end = dt.datetime(2026, 11, 30, 10, 45, tzinfo=dt.timezone.utc)
    g = make_report(0.20, ci_half=0.03, num_draft_tokens=2000, k=3, alpha_hat=0.20, hat_half=0.03).overall
    window = store.Window(pair="pair-a", version="1", alias="champion", source="vllm-test", engine="vllm", model="tiny",
                          start=end - dt.timedelta(minutes=15), end=end, metrics=g,
                          config={"source": "vllm-test", "engine": "vllm", "model": "tiny", "window_seconds": 900.0,
                                  "num_speculative_tokens": 3}, code_version="0.1.0")
    assert store.record_window(db, window, now=end) == ids["production"][-1]
    # the last engine check again, under its unchanged config hash: its migrated row
    row = history.get_run(db, ids["engine"][-1])
    again = history.RunRecord(source="engine", engine="llamacpp", overall=g, config=dict(row.config), alias="champion",
                              key=history.RunKey("pair-a", "1", "spec-bench-mini", "1", row.config_hash,
                                                 row.scheduled_date))
    assert history.upsert(db, again) == ids["engine"][-1]
    with db.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM validation_runs")).scalar() == len(FIXTURE["tables"]["validation_runs"])

    cfg = alembic_config(db.url)
    with db.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, BEFORE)
    with db.engine.connect() as conn:
        cols = {c["name"] for c in sa.inspect(conn).get_columns("validation_runs")}
        rows = {r.id: (r.source, r.heldout_name, r.heldout_version) for r in conn.execute(
            sa.text("SELECT id, source, heldout_name, heldout_version FROM validation_runs"))}
        prompts = conn.execute(sa.text("SELECT count(*) FROM prompt_results")).scalar()
    assert not {"engine", "production_source"} & cols
    assert rows == {r["id"]: (r["source"], r["heldout_name"], r["heldout_version"])
                    for r in FIXTURE["tables"]["validation_runs"]}
    assert prompts == len(FIXTURE["tables"]["prompt_results"])  # the table rebuild kept every prompt row


def test_sqlite_downgrades_that_rebuild_the_runs_table_keep_every_prompt_row(tmp_path):
    """SQLite's batch migrations drop and recreate ``validation_runs``; with foreign keys on, the drop cascades to
    ``prompt_results``. A downgrade is a DBA's ``alembic downgrade`` (no specdec command runs one): Alembic's own
    connection (``env.py`` from the URL) leaves SQLite's foreign keys off, so every downgrade down to 0002
    (0008 -> 0003 rebuild the table) keeps the prompt rows of the runs it keeps."""
    db = Database(f"sqlite:///{tmp_path / 'h.db'}")
    load_0008(db)
    db.dispose()
    command.downgrade(alembic_config(db.url), "0002")  # as `alembic downgrade 0002` runs it
    with Database(db.url).engine.connect() as conn:
        runs = {r.id for r in conn.execute(sa.text("SELECT id FROM validation_runs"))}
        prompts = conn.execute(sa.text("SELECT count(*) FROM prompt_results")).scalar()
    kept = [p for p in FIXTURE["tables"]["prompt_results"] if p["run_id"] in runs]
    assert runs and kept and prompts == len(kept)
