"""the alias a version was validated under is part of a row's identity: one row per run

Until now a validation row was one per (pair, version, held-out name and version, config hash, scheduled date):
re-validating a version the same day under another alias (``@challenger`` in the morning, ``@champion`` after its
promotion) re-claimed the first run's row and overwrote it, while MLflow kept both runs and an incident's alert
pointed at a row that now held the other run. The unique key ``uq_validation_runs_key`` now also holds the alias
(``coalesce(alias, '')``: a row without one is its own identity), as a unique index on both backends.

Existing rows keep their ids, numbers, verdicts and prompt rows; a night recorded again under the same alias
continues its migrated row. SQLite cannot drop a table's constraint in place, so ``validation_runs`` is rebuilt
(Alembic batch); the rebuild drops the old table, which with foreign keys on deletes ``prompt_results`` and clears
the incidents' and baselines' run references through their ``ON DELETE`` actions, so those are saved first and
written back after.

Downgrade restores the plain unique constraint; it fails (nothing deleted) where two rows differ by alias only.

Revision ID: 0011_alias_in_run_key
Revises: 0010_adapters_and_rules
Create Date: 2026-12-07

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa

revision: str = '0011_alias_in_run_key'
down_revision: Union[str, Sequence[str], None] = '0010_adapters_and_rules'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

KEY = ("pair_name", "pair_version", "heldout_name", "heldout_version", "config_hash", "scheduled_date")
NAME = "uq_validation_runs_key"
#: what a SQLite rebuild of validation_runs would lose through ON DELETE actions: (temp table, SELECT, restore)
_SAVED = (
    ("_keep_prompts", "SELECT * FROM prompt_results",
     ["DELETE FROM prompt_results", "INSERT INTO prompt_results SELECT * FROM _keep_prompts"]),
    ("_keep_incidents", "SELECT id, opened_run_id, last_run_id, resolved_run_id FROM incidents",
     ["UPDATE incidents SET " + ", ".join(f"{c} = (SELECT k.{c} FROM _keep_incidents k WHERE k.id = incidents.id)"
                                         for c in ("opened_run_id", "last_run_id", "resolved_run_id"))]),
    ("_keep_baselines", "SELECT id, baseline_run_id FROM validation_runs WHERE baseline_run_id IS NOT NULL",
     ["UPDATE validation_runs SET baseline_run_id = (SELECT k.baseline_run_id FROM _keep_baselines k "
      "WHERE k.id = validation_runs.id) WHERE id IN (SELECT id FROM _keep_baselines)"]),
)


def _rebuild_sqlite(change) -> None:
    """Run ``change(batch)`` in a SQLite batch rebuild of validation_runs, keeping what ON DELETE would take."""
    for temp, select, _ in _SAVED:
        op.execute(f"CREATE TEMP TABLE {temp} AS {select}")
    with op.batch_alter_table("validation_runs", recreate="always") as batch:
        change(batch)
    for temp, _, restore in _SAVED:
        for statement in restore:
            op.execute(statement)
        op.execute(f"DROP TABLE {temp}")


def upgrade() -> None:
    """The unique key becomes a unique index that holds the alias."""
    if op.get_bind().dialect.name == "sqlite":
        _rebuild_sqlite(lambda batch: batch.drop_constraint(NAME, type_="unique"))
    else:
        op.drop_constraint(NAME, "validation_runs", type_="unique")
    op.execute(f"CREATE UNIQUE INDEX {NAME} ON validation_runs ({', '.join(KEY)}, coalesce(alias, ''))")


def downgrade() -> None:
    """Back to the unique constraint without the alias (fails where two rows differ by alias only)."""
    op.execute(f"DROP INDEX {NAME}")
    if op.get_bind().dialect.name == "sqlite":
        _rebuild_sqlite(lambda batch: batch.create_unique_constraint(NAME, list(KEY)))
    else:
        op.create_unique_constraint(NAME, "validation_runs", list(KEY))
