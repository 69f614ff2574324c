"""webhook_deliveries: MLflow registry webhook deliveries accepted by ``specdec pair watch``

Unique ``delivery_id`` (MLflow's X-MLflow-Delivery-Id) and unique ``trigger_key`` (one validation
per pair version and action), so duplicates and replays change nothing.

Revision ID: 0006_webhook_deliveries
Revises: 0005_replay
Create Date: 2026-12-01

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0006_webhook_deliveries'
down_revision: Union[str, Sequence[str], None] = '0005_replay'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        'webhook_deliveries',
        sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('delivery_id', sa.String(length=64), nullable=False),
        sa.Column('received_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('event', sa.String(length=64), nullable=False),
        sa.Column('model_name', sa.String(length=200), nullable=False),
        sa.Column('version', sa.String(length=32), nullable=True),
        sa.Column('action', sa.String(length=200), nullable=False),
        sa.Column('trigger_key', sa.String(length=300), nullable=True),
        sa.Column('flow_run_id', sa.String(length=64), nullable=True),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('delivery_id'),
        sa.UniqueConstraint('trigger_key'),
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_table('webhook_deliveries')
