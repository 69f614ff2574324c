"""LoRA adapters and both acceptance rules: six nullable columns on validation_runs

``target_adapter`` / ``draft_adapter`` (the registered adapter's name; NULL: the base model as it is),
``target_adapter_hash`` (the adapter weights hash), ``acceptance_rule`` (``exact`` | ``argmax``: the rule the
pair is served under and the floor judges) and both rules' overall rates, ``exact_rule_acceptance`` and
``argmax_rule_acceptance`` (docs/metrics.md). Existing rows keep NULL: nothing measured them.

Revision ID: 0010_adapters_and_rules
Revises: 0009_source_columns
Create Date: 2026-12-07

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa

revision: str = '0010_adapters_and_rules'
down_revision: Union[str, Sequence[str], None] = '0009_source_columns'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

COLUMNS = (("target_adapter", sa.String(200)), ("target_adapter_hash", sa.String(128)),
           ("draft_adapter", sa.String(200)), ("acceptance_rule", sa.String(16)),
           ("exact_rule_acceptance", sa.Float()), ("argmax_rule_acceptance", sa.Float()))


def upgrade() -> None:
    """Add the six nullable columns (in place on every backend: ADD COLUMN needs no table rebuild)."""
    for name, type_ in COLUMNS:
        op.add_column("validation_runs", sa.Column(name, type_, nullable=True))


def downgrade() -> None:
    """Drop them in place (SQLite >= 3.35: a batch rebuild drops the table, and with foreign keys on that deletes
    prompt_results, as 0009's downgrade notes)."""
    for name, _ in reversed(COLUMNS):
        if op.get_bind().dialect.name == "sqlite":
            op.execute(f"ALTER TABLE validation_runs DROP COLUMN {name}")
        else:
            op.drop_column("validation_runs", name)
