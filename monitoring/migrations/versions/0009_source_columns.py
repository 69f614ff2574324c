"""engine and production source are columns: validation_runs.engine, validation_runs.production_source

Until 0008 a row's origin lived in prefixes of other strings: an engine check had ``source =
engine:<engine>`` and ``heldout_name = engine:<engine>:<held-out name>``; a production window had
``heldout_name = production:<source>:<model>``. Now ``source`` is one of ``nightly`` | ``production`` |
``engine``, the new ``engine`` column holds the serving engine (an engine check's, a production window's)
and the new ``production_source`` column a production window's source name; ``heldout_name`` holds the
plain held-out name (an engine check) or the model label (a production window). Existing rows are
backfilled from their prefixed strings (the engine of a check from its stored config's ``engine`` when
there, a window's engine from its config or ``drafter_kind``). ``config_hash`` is unchanged, so a night or
window recorded again matches its migrated row.

Downgrade writes the prefixes back from the columns and drops them.

Revision ID: 0009_source_columns
Revises: 0008_floor_on_acceptance_rate
Create Date: 2026-12-05

"""
from typing import Any, Sequence, Union

from alembic import op
import sqlalchemy as sa

# revision identifiers, used by Alembic.
revision: str = '0009_source_columns'
down_revision: Union[str, Sequence[str], None] = '0008_floor_on_acceptance_rate'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

ENGINE_PREFIX, PRODUCTION_PREFIX = "engine:", "production:"


def _runs(*extra: str) -> sa.TableClause:
    cols = [sa.column("id", sa.Integer), sa.column("source", sa.String), sa.column("heldout_name", sa.String),
            sa.column("config", sa.JSON), sa.column("drafter_kind", sa.String)]
    return sa.table("validation_runs", *cols, *(sa.column(n, sa.String) for n in extra))


def unprefixed(row: Any) -> dict[str, Any] | None:
    """The new column values of one 0008 row (``source``, ``engine``, ``production_source``, ``heldout_name``),
    or None for a nightly row (nothing to change)."""
    config = row["config"] or {}
    if row["source"].startswith(ENGINE_PREFIX):  # heldout_name = f"{source}:{held-out name}", source maybe cut at 20
        name = row["heldout_name"]
        held = name[len(row["source"]) + 1:] if name.startswith(row["source"] + ":") else name
        return {"source": "engine", "engine": config.get("engine") or row["source"][len(ENGINE_PREFIX):],
                "production_source": None, "heldout_name": held}
    if row["source"] == "production" and row["heldout_name"].startswith(PRODUCTION_PREFIX):
        name, _, model = row["heldout_name"][len(PRODUCTION_PREFIX):].partition(":")  # source names have no ':'
        return {"source": "production", "engine": config.get("engine") or row["drafter_kind"],
                "production_source": name, "heldout_name": model}
    return None


def prefixed(row: Any) -> dict[str, Any] | None:
    """The 0008 values (``source``, ``heldout_name``) of one row, or None for a nightly row."""
    if row["source"] == "engine":
        source = f"{ENGINE_PREFIX}{row['engine']}"[:20]
        return {"source": source, "heldout_name": f"{source}:{row['heldout_name']}"[:200]}
    if row["source"] == "production":
        return {"source": "production",
                "heldout_name": f"{PRODUCTION_PREFIX}{row['production_source']}:{row['heldout_name']}"[:200]}
    return None


def upgrade() -> None:
    """Add the columns and move the prefixes into them."""
    with op.batch_alter_table('validation_runs') as batch:
        batch.add_column(sa.Column('engine', sa.String(length=32), nullable=True))
        batch.add_column(sa.Column('production_source', sa.String(length=200), nullable=True))
    bind = op.get_bind()
    runs = _runs("engine", "production_source")
    rows = bind.execute(sa.select(runs).where(runs.c.source != "nightly")).mappings().all()
    for row in rows:
        values = unprefixed(row)
        if values is not None:
            bind.execute(sa.update(runs).where(runs.c.id == row["id"]).values(**values))


def downgrade() -> None:
    """Write the prefixes back from the columns; drop the columns."""
    bind = op.get_bind()
    runs = _runs("engine", "production_source")
    for row in bind.execute(sa.select(runs).where(runs.c.source != "nightly")).mappings().all():
        values = prefixed(row)
        if values is not None:
            bind.execute(sa.update(runs).where(runs.c.id == row["id"]).values(**values))
    for name in ('production_source', 'engine'):
        if bind.dialect.name == 'sqlite':  # in place (SQLite >= 3.35): a batch rebuild drops the table, and with
            op.execute(f'ALTER TABLE validation_runs DROP COLUMN {name}')  # foreign keys on that deletes prompt_results
        else:
            op.drop_column('validation_runs', name)
