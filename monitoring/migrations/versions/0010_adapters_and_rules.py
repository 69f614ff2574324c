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
    with op.batch_alter_table("validation_runs") as batch:
        for name, type_ in COLUMNS:
            batch.add_column(sa.Column(name, type_, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("validation_runs") as batch:
        for name, _ in reversed(COLUMNS):
            batch.drop_column(name)
