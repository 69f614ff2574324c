"""speed evidence: validation_runs.speedup_ci_low/high, load_avg_1m, num_cpus

The nightly measures speedup paired per prompt with a bootstrap CI, and the machine load the
timings were taken under (monitoring.speed_rule: "speculation no longer pays", speed-inconclusive
on an overloaded machine). Older rows keep NULL (their overall JSON has no such fields).

Revision ID: 0004_speed
Revises: 0003_production
Create Date: 2026-11-30

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0004_speed'
down_revision: Union[str, Sequence[str], None] = '0003_production'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table('validation_runs') as batch:
        batch.add_column(sa.Column('speedup_ci_low', sa.Float(), nullable=True))
        batch.add_column(sa.Column('speedup_ci_high', sa.Float(), nullable=True))
        batch.add_column(sa.Column('load_avg_1m', sa.Float(), nullable=True))
        batch.add_column(sa.Column('num_cpus', sa.Integer(), nullable=True))


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table('validation_runs') as batch:
        batch.drop_column('num_cpus')
        batch.drop_column('load_avg_1m')
        batch.drop_column('speedup_ci_high')
        batch.drop_column('speedup_ci_low')
