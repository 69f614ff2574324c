"""History store on real SQLite files: migrations, idempotent upserts, concurrent claims."""

from __future__ import annotations

import datetime as dt
import multiprocessing as mp
import threading

import pytest

from monitoring.db import head_revision
from sqlalchemy import func, inspect, select

from monitoring import history
from monitoring.db import Base, Database, PromptRow, ValidationRun, connect
from monitoring.history import Lineage, RunAlreadyClaimed, RunKey
from tests.support.reports import make_report

DAY = dt.date(2026, 11, 29)
T0 = dt.datetime(2026, 11, 29, 2, 0, tzinfo=dt.timezone.utc)
LIN = Lineage(target_hash="t1", draft_hash="d1", heldout_version="1", code_version="0.1.0")


def key(version="1", date=DAY, config=None) -> RunKey:
    return RunKey.build("pair-a", version, "spec-bench-mini", "1", config or {"num_speculative_tokens": 4}, date)


@pytest.fixture
def db(tmp_path) -> Database:
    d = connect(url=f"sqlite:///{tmp_path / 'history.db'}")
    yield d
    d.dispose()


def test_migrations_on_empty_db_create_the_schema_and_match_the_models(tmp_path):
    from alembic import command
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from monitoring.db import alembic_config

    path = tmp_path / "sub" / "fresh.db"
    db = Database(f"sqlite:///{path}")
    assert db.current_revision() is None
    db.upgrade()
    assert path.exists() and db.current_revision() == head_revision()
    tables = set(inspect(db.engine).get_table_names())
    assert {"validation_runs", "prompt_results", "incidents", "alert_deliveries", "alembic_version"} <= tables
    with db.engine.connect() as conn:  # the run key is a unique index holding the alias (0011; SQLAlchemy does not
        sql = conn.exec_driver_sql("SELECT sql FROM sqlite_master WHERE name = 'uq_validation_runs_key'").scalar()
    assert sql.startswith("CREATE UNIQUE INDEX") and "coalesce(alias, '')" in sql  # reflect expression indexes)
    with db.engine.connect() as conn:  # migrations and models agree (no autogenerate diff)
        assert compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata) == []
    db.upgrade()  # idempotent
    cfg = alembic_config(db.url)
    with db.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "base")
    assert "validation_runs" not in inspect(db.engine).get_table_names()
    db.upgrade()
    assert db.current_revision() == head_revision()
    db.dispose()


def test_default_url_is_history_db_under_specdec_home(tmp_path, monkeypatch):
    from monitoring.settings import get_settings

    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SPECDEC_DB_URL", raising=False)
    s = get_settings()
    assert s.db_url == f"sqlite:///{tmp_path / 'home' / 'history.db'}"
    monkeypatch.setenv("SPECDEC_DB_URL", "postgresql+psycopg://u:hunter2@db:5432/specdec")
    s = get_settings()
    assert s.db_url.startswith("postgresql+psycopg://")
    assert "hunter2" not in repr(Database(s.db_url))  # Database repr masks the password


def test_duplicated_nightly_run_stays_one_row_and_retry_updates_it(db):
    k = key()
    claim = history.claim_run(db, k, alias="champion", now=T0)
    rid = history.record_run(db, make_report(0.60, num_prompts=10), k, LIN, claim=claim, alias="champion", now=T0)
    # the nightly run is retried (same key): re-claim, new numbers, same row
    claim2 = history.claim_run(db, k, now=T0 + dt.timedelta(hours=1))
    assert claim2.run_id == rid and claim2.previous_status == "completed" and claim2.attempts == 2
    rid2 = history.record_run(db, make_report(0.55, num_prompts=8), k, LIN, claim=claim2,
                              now=T0 + dt.timedelta(hours=1))
    # and once more without a claim (plain upsert)
    rid3 = history.record_run(db, make_report(0.50, num_prompts=6), k, LIN)
    assert rid == rid2 == rid3
    with db.session() as s:
        assert s.scalar(select(func.count()).select_from(ValidationRun)) == 1
        assert s.scalar(select(func.count()).select_from(PromptRow)) == 6  # replaced, not appended
        row = s.get(ValidationRun, rid)
        assert row.acceptance_rate == pytest.approx(0.50)
        assert row.alias == "champion" and row.status == "completed" and row.attempts == 2
        assert row.acceptance_rate_ci_low == pytest.approx(0.47) and row.num_speculative_tokens == 4
        assert row.config["num_speculative_tokens"] == 4 and row.config_hash == k.config_hash
        assert row.mlflow_logged is False and row.mlflow_run_id is None
    # a different scheduled date is a different run
    other = history.record_run(db, make_report(0.6), key(date=DAY + dt.timedelta(days=1)), LIN)
    assert other != rid
    assert len(history.list_runs(db, pair_name="pair-a")) == 2


def test_prompt_rows_round_trip_with_nan(db):
    rep = make_report(0.6, num_prompts=4)
    rep.prompts[1].alpha_tf = float("nan")
    rep.prompts[2].status, rep.prompts[2].skip_reason = "skipped", "over-length prompt"
    rid = history.record_run(db, rep, key(), LIN)
    back = history.prompt_results(db, rid)
    assert [p.prompt_id for p in back] == [p.prompt_id for p in rep.prompts]
    assert back[1].alpha_tf != back[1].alpha_tf  # nan survives as nan
    assert back[2].skip_reason == "over-length prompt"
    assert back[0].acceptance_rate == pytest.approx(rep.prompts[0].acceptance_rate)
    snap = history.snapshot(db, rid)
    assert snap.overall.acceptance_rate == pytest.approx(0.6)
    assert snap.overall.acceptance_rate_ci == pytest.approx([0.57, 0.63])
    assert snap.lineage == LIN


def test_duplicate_prompt_ids_are_refused_without_writing(db):
    rep = make_report(0.6, num_prompts=3)
    rep.prompts[1].prompt_id = rep.prompts[0].prompt_id
    with pytest.raises(ValueError, match="duplicate prompt ids"):
        history.record_run(db, rep, key(), LIN)
    assert history.find_run(db, key()) is None


def test_live_claim_blocks_second_run_and_stale_claim_is_taken_over(db):
    k = key()
    first = history.claim_run(db, k, now=T0)
    with pytest.raises(RunAlreadyClaimed) as e:
        history.claim_run(db, k, now=T0 + dt.timedelta(minutes=5))
    assert e.value.run_id == first.run_id and "already running" in str(e.value)
    history.heartbeat(db, first, now=T0 + dt.timedelta(hours=5))
    with pytest.raises(RunAlreadyClaimed):  # heartbeat keeps it alive past 6 h since the claim
        history.claim_run(db, k, now=T0 + dt.timedelta(hours=7))
    # the first run crashed: after stale_after_s without heartbeat the key can be taken over
    second = history.claim_run(db, k, now=T0 + dt.timedelta(hours=11, minutes=1))
    assert second.run_id == first.run_id and second.previous_status == "running (stale)"
    with pytest.raises(RunAlreadyClaimed, match="claim lost"):  # the zombie cannot write
        history.record_run(db, make_report(0.6), k, LIN, claim=first)
    history.record_run(db, make_report(0.6), k, LIN, claim=second)
    assert history.find_run(db, k).status == "completed"


def test_error_is_recorded_and_the_key_can_be_retried(db):
    k = key()
    c = history.claim_run(db, k, now=T0)
    history.mark_error(db, c, "CUDA out of memory", now=T0)
    row = history.find_run(db, k)
    assert row.status == "error" and "out of memory" in row.error
    c2 = history.claim_run(db, k, now=T0 + dt.timedelta(minutes=1))
    assert c2.previous_status == "error"


def _claim_in_process(url: str, barrier, results) -> None:
    from monitoring.db import Database
    from monitoring import history as h

    db = Database(url)
    k = h.RunKey.build("pair-a", "1", "spec-bench-mini", "1", {"num_draft_tokens": 4}, "2026-11-29")
    barrier.wait()
    try:
        c = h.claim_run(db, k)
        results.put(("won", c.run_id))
    except h.RunAlreadyClaimed as e:
        results.put(("claimed", e.run_id))
    except Exception as e:  # pragma: no cover - reported to the parent
        results.put(("error", repr(e)))


def test_two_processes_same_key_one_wins_the_other_exits_cleanly(db):
    # fork: two real OS processes without re-importing torch; each opens its own engine
    db.dispose()
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_claim_in_process, args=(db.url, barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    outcomes = sorted(results.get(timeout=5) for _ in range(2))
    assert [o[0] for o in outcomes] == ["claimed", "won"], outcomes
    assert outcomes[0][1] == outcomes[1][1]
    with db.session() as s:
        assert s.scalar(select(func.count()).select_from(ValidationRun)) == 1


def test_many_threads_same_key_exactly_one_claim(db):
    k = key()
    barrier = threading.Barrier(6)
    won, refused, errors = [], [], []

    def worker() -> None:
        barrier.wait()
        try:
            won.append(history.claim_run(db, k).run_id)
        except RunAlreadyClaimed:
            refused.append(1)
        except Exception as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == [] and len(won) == 1 and len(refused) == 5


def test_mlflow_pending_and_baseline_lookup(db):
    d1, d2, d3 = DAY, DAY + dt.timedelta(days=1), DAY + dt.timedelta(days=2)
    r1 = history.record_run(db, make_report(0.62), key("1", d1), LIN, alias="champion")
    history.set_evaluation(db, r1, status="passed", rule_results=[], root_cause_hint=None, baseline_run_id=None)
    r2 = history.record_run(db, make_report(0.61), key("1", d2), LIN, alias="champion")
    history.set_evaluation(db, r2, status="failed", rule_results=[], root_cause_hint=None, baseline_run_id=None)
    r3 = history.record_run(db, make_report(0.30), key("2", d3), LIN, alias="challenger")
    assert [r.id for r in history.runs_pending_mlflow(db)] == [r1, r2, r3]
    history.mark_mlflow_logged(db, r1, "abc123")
    assert [r.id for r in history.runs_pending_mlflow(db)] == [r2, r3]
    assert history.get_run(db, r1).mlflow_run_id == "abc123"
    # last *passing* run of the champion (by alias, or by explicit version)
    assert history.find_baseline(db, r3).id == r1
    assert history.find_baseline(db, r3, champion_version="1").id == r1
    assert history.find_baseline(db, r3, champion_version="7") is None
    # a different config (k) is not comparable
    r4 = history.record_run(db, make_report(0.3), key("2", d3, config={"num_draft_tokens": 8}), LIN)
    assert history.find_baseline(db, r4) is None
