"""Alembic 0011 puts the alias into a row's identity (issue 51: re-validating a version the same day under another
alias overwrote the earlier run's row). A history written before (the 0008 fixture of issue 42, brought to 0010,
with a baseline reference and an open incident pointing at its runs) is upgraded on SQLite and PostgreSQL: every
row, prompt row, baseline and incident reference is kept (SQLite rebuilds the table, and its drop cascades with
foreign keys on), the migrated night continues its row, another alias gets its own; downgrade gives 0010 back."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa
from alembic import command

from monitoring import history
from monitoring.db import Database, alembic_config
from tests.monitoring.test_migration_source_columns import FIXTURE, load_0008, store_url  # noqa: F401 (fixture)
from tests.support.reports import make_report

BEFORE = "0010_adapters_and_rules"


def _state(db) -> dict:
    with db.engine.connect() as conn:
        q = lambda sql: [tuple(r) for r in conn.execute(sa.text(sql))]  # noqa: E731
        return {"runs": q("SELECT id, pair_version, alias, status, acceptance_rate FROM validation_runs ORDER BY id"),
                "prompts": q("SELECT id, run_id, prompt_id FROM prompt_results ORDER BY id"),
                "baselines": q("SELECT id, baseline_run_id FROM validation_runs WHERE baseline_run_id IS NOT NULL"),
                "incidents": q("SELECT id, opened_run_id, last_run_id FROM incidents ORDER BY id")}


def _load_0010(db) -> list[int]:
    load_0008(db)
    db.upgrade(BEFORE)
    ids = FIXTURE["ids"]["nightly"]
    t = dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc)
    with db.engine.begin() as conn:
        conn.execute(sa.text("UPDATE validation_runs SET baseline_run_id = :b WHERE id = :i"), {"b": ids[0], "i": ids[-1]})
        conn.execute(sa.text("INSERT INTO incidents (pair_name, scope, status, opened_at, last_notified_at, "
                             "reminder_count, opened_run_id, last_run_id) VALUES ('pair-a', 'champion', 'firing', "
                             ":t, :t, 0, :o, :l)"), {"t": t, "o": ids[0], "l": ids[-1]})
    return ids


def _downgrade(db, revision: str) -> None:
    cfg = alembic_config(db.url)
    with db.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)


def test_upgrade_keeps_every_row_and_reference_and_one_row_per_alias_follows(store_url):  # noqa: F811
    db = Database(store_url)
    ids = _load_0010(db)
    before = _state(db)
    assert before["prompts"] and before["baselines"] and before["incidents"]
    db.upgrade()
    assert _state(db) == before
    row = history.get_run(db, ids[-1])
    key = history.RunKey(row.pair_name, row.pair_version, row.heldout_name, row.heldout_version, row.config_hash,
                         row.scheduled_date)
    assert history.claim_run(db, key, alias=row.alias).run_id == row.id  # the migrated night continues its row
    other = "challenger" if row.alias != "challenger" else "champion"
    claim = history.claim_run(db, key, alias=other)
    assert claim.run_id != row.id
    history.record_run(db, make_report(0.5), key, history.Lineage(), claim=claim, alias=other)
    assert len(_state(db)["runs"]) == len(before["runs"]) + 1
    with pytest.raises(sa.exc.IntegrityError):  # where two rows differ by alias only: refused, nothing deleted
        _downgrade(db, BEFORE)
    after = _state(db)
    kept = [p for p in before["prompts"] if p[1] != row.id]  # the re-claimed row's own were cleared for its retry
    assert len(after["runs"]) == len(before["runs"]) + 1 and [p for p in after["prompts"] if p[1] != claim.run_id] == kept
    db.dispose()


def test_downgrade_gives_0010_back_with_every_prompt_row(store_url):  # noqa: F811
    db = Database(store_url)
    _load_0010(db)
    before = _state(db)
    db.upgrade()
    _downgrade(db, BEFORE)
    assert _state(db) == before
    with db.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar() == BEFORE
    db.dispose()
