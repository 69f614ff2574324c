"""replay: validation_runs.method, replay_decode_agreement, replay_beyond_numerics

``specdec validate --method replay|both`` measures acceptance for every k from a teacher-forced
replay and, with ``both``, checks it against decoding on a subsample (replay_decode_agreement;
disagreements that rounding cannot explain feed the measurement-health rule). Older rows keep
NULL (decode-only runs).

Revision ID: 0005_replay
Revises: 0004_speed
Create Date: 2026-12-01

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0005_replay'
down_revision: Union[str, Sequence[str], None] = '0004_speed'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table('validation_runs') as batch:
        batch.add_column(sa.Column('method', sa.String(length=16), nullable=True))
        batch.add_column(sa.Column('replay_decode_agreement', sa.Float(), nullable=True))
        batch.add_column(sa.Column('replay_beyond_numerics', sa.Integer(), nullable=True))


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table('validation_runs') as batch:
        batch.drop_column('replay_beyond_numerics')
        batch.drop_column('replay_decode_agreement')
        batch.drop_column('method')
