"""production acceptance: validation_runs.source (+ window bounds), production_scrapes

Rows ingested from a serving engine's counters (``monitoring.production``) share
``validation_runs`` with the nightly validations; ``source`` tells them apart (existing rows
become ``nightly``). ``production_scrapes`` keeps the last direct ``/metrics`` scrape per source.

Revision ID: 0003_production
Revises: 0002
Create Date: 2026-12-01

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0003_production'
down_revision: Union[str, Sequence[str], None] = '0002'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.add_column('validation_runs', sa.Column('source', sa.String(length=20), nullable=False,
                                               server_default='nightly'))
    op.add_column('validation_runs', sa.Column('window_start', sa.DateTime(timezone=True), nullable=True))
    op.add_column('validation_runs', sa.Column('window_end', sa.DateTime(timezone=True), nullable=True))
    op.create_index('ix_validation_runs_source_pair', 'validation_runs', ['source', 'pair_name'], unique=False)
    op.create_table('production_scrapes',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('source', sa.String(length=200), nullable=False),
    sa.Column('engine', sa.String(length=32), nullable=False),
    sa.Column('scraped_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('process_start_time', sa.Float(), nullable=True),
    sa.Column('series', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('source')
    )


def downgrade() -> None:
    """Downgrade schema (production rows are deleted: they have no meaning without ``source``)."""
    op.drop_table('production_scrapes')
    op.execute("DELETE FROM validation_runs WHERE source = 'production'")
    op.drop_index('ix_validation_runs_source_pair', table_name='validation_runs')
    with op.batch_alter_table('validation_runs') as batch:
        batch.drop_column('window_end')
        batch.drop_column('window_start')
        batch.drop_column('source')
