"""initial schema: validation_runs, prompt_results, incidents, alert_deliveries

Revision ID: 0001
Revises: 
Create Date: 2026-11-29

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0001'
down_revision: Union[str, Sequence[str], None] = None
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table('validation_runs',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('pair_name', sa.String(length=200), nullable=False),
    sa.Column('pair_version', sa.String(length=64), nullable=False),
    sa.Column('heldout_name', sa.String(length=200), nullable=False),
    sa.Column('heldout_version', sa.String(length=64), nullable=False),
    sa.Column('config_hash', sa.String(length=64), nullable=False),
    sa.Column('scheduled_date', sa.Date(), nullable=False),
    sa.Column('alias', sa.String(length=64), nullable=True),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('claim_token', sa.String(length=36), nullable=True),
    sa.Column('claimed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('target_ref', sa.String(length=500), nullable=True),
    sa.Column('drafter_kind', sa.String(length=32), nullable=True),
    sa.Column('drafter_ref', sa.String(length=500), nullable=True),
    sa.Column('target_hash', sa.String(length=128), nullable=True),
    sa.Column('draft_hash', sa.String(length=128), nullable=True),
    sa.Column('code_version', sa.String(length=100), nullable=True),
    sa.Column('config', sa.JSON(), nullable=True),
    sa.Column('num_draft_tokens_k', sa.Integer(), nullable=True),
    sa.Column('device', sa.String(length=64), nullable=True),
    sa.Column('dtype', sa.String(length=32), nullable=True),
    sa.Column('report_created_at', sa.String(length=64), nullable=True),
    sa.Column('wall_seconds', sa.Float(), nullable=True),
    sa.Column('target_only_seconds', sa.Float(), nullable=True),
    sa.Column('speculative_seconds', sa.Float(), nullable=True),
    sa.Column('num_prompts', sa.Integer(), nullable=True),
    sa.Column('num_drafts', sa.Integer(), nullable=True),
    sa.Column('num_draft_tokens', sa.Integer(), nullable=True),
    sa.Column('num_accepted_tokens', sa.Integer(), nullable=True),
    sa.Column('acceptance_rate', sa.Float(), nullable=True),
    sa.Column('acceptance_rate_ci_low', sa.Float(), nullable=True),
    sa.Column('acceptance_rate_ci_high', sa.Float(), nullable=True),
    sa.Column('mean_accepted_length', sa.Float(), nullable=True),
    sa.Column('draft_tokens_per_step', sa.Float(), nullable=True),
    sa.Column('alpha_hat', sa.Float(), nullable=True),
    sa.Column('alpha_hat_ci_low', sa.Float(), nullable=True),
    sa.Column('alpha_hat_ci_high', sa.Float(), nullable=True),
    sa.Column('alpha_tf', sa.Float(), nullable=True),
    sa.Column('alpha_tf_ci_low', sa.Float(), nullable=True),
    sa.Column('alpha_tf_ci_high', sa.Float(), nullable=True),
    sa.Column('top1_agreement', sa.Float(), nullable=True),
    sa.Column('total_variation', sa.Float(), nullable=True),
    sa.Column('kl_divergence', sa.Float(), nullable=True),
    sa.Column('speedup', sa.Float(), nullable=True),
    sa.Column('predicted_speedup', sa.Float(), nullable=True),
    sa.Column('overall', sa.JSON(), nullable=True),
    sa.Column('categories', sa.JSON(), nullable=True),
    sa.Column('baseline_run_id', sa.Integer(), nullable=True),
    sa.Column('rule_results', sa.JSON(), nullable=True),
    sa.Column('root_cause_hint', sa.Text(), nullable=True),
    sa.Column('evidently_html', sa.String(length=1000), nullable=True),
    sa.Column('evidently_json', sa.String(length=1000), nullable=True),
    sa.Column('evidently_verdict', sa.JSON(), nullable=True),
    sa.Column('mlflow_run_id', sa.String(length=64), nullable=True),
    sa.Column('mlflow_logged', sa.Boolean(), nullable=False),
    sa.ForeignKeyConstraint(['baseline_run_id'], ['validation_runs.id'], ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('pair_name', 'pair_version', 'heldout_name', 'heldout_version', 'config_hash', 'scheduled_date', name='uq_validation_runs_key')
    )
    op.create_index('ix_validation_runs_alias', 'validation_runs', ['alias'], unique=False)
    op.create_index('ix_validation_runs_pair_status', 'validation_runs', ['pair_name', 'status'], unique=False)

    op.create_table('incidents',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('pair_name', sa.String(length=200), nullable=False),
    sa.Column('scope', sa.String(length=64), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('opened_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_notified_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('resolved_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('reminder_count', sa.Integer(), nullable=False),
    sa.Column('opened_run_id', sa.Integer(), nullable=True),
    sa.Column('last_run_id', sa.Integer(), nullable=True),
    sa.Column('resolved_run_id', sa.Integer(), nullable=True),
    sa.Column('summary', sa.JSON(), nullable=True),
    sa.ForeignKeyConstraint(['last_run_id'], ['validation_runs.id'], ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['opened_run_id'], ['validation_runs.id'], ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['resolved_run_id'], ['validation_runs.id'], ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('uq_incidents_open', 'incidents', ['pair_name', 'scope'], unique=True, sqlite_where=sa.text("status = 'firing'"), postgresql_where=sa.text("status = 'firing'"))

    op.create_table('prompt_results',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('prompt_id', sa.String(length=200), nullable=False),
    sa.Column('category', sa.String(length=100), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('skip_reason', sa.Text(), nullable=True),
    sa.Column('prompt_tokens', sa.Integer(), nullable=False),
    sa.Column('new_tokens', sa.Integer(), nullable=False),
    sa.Column('num_drafts', sa.Integer(), nullable=False),
    sa.Column('num_draft_tokens', sa.Integer(), nullable=False),
    sa.Column('num_accepted_tokens', sa.Integer(), nullable=False),
    sa.Column('acceptance_rate', sa.Float(), nullable=True),
    sa.Column('num_tf_positions', sa.Integer(), nullable=False),
    sa.Column('alpha_tf', sa.Float(), nullable=True),
    sa.Column('top1_agreement', sa.Float(), nullable=True),
    sa.Column('total_variation', sa.Float(), nullable=True),
    sa.Column('kl_divergence', sa.Float(), nullable=True),
    sa.Column('target_only_seconds', sa.Float(), nullable=True),
    sa.Column('speculative_seconds', sa.Float(), nullable=True),
    sa.Column('exact_match', sa.Boolean(), nullable=True),
    sa.Column('first_divergence', sa.Integer(), nullable=True),
    sa.Column('divergence_logit_margin', sa.Float(), nullable=True),
    sa.Column('alpha_hat', sa.Float(), nullable=True),
    sa.Column('mean_accepted_length', sa.Float(), nullable=True),
    sa.Column('data', sa.JSON(), nullable=True),
    sa.ForeignKeyConstraint(['run_id'], ['validation_runs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('run_id', 'prompt_id', name='uq_prompt_results_run_prompt')
    )
    op.create_index(op.f('ix_prompt_results_run_id'), 'prompt_results', ['run_id'], unique=False)

    op.create_table('alert_deliveries',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('incident_id', sa.Integer(), nullable=True),
    sa.Column('transition', sa.String(length=32), nullable=False),
    sa.Column('channel_id', sa.String(length=100), nullable=False),
    sa.Column('channel_type', sa.String(length=20), nullable=False),
    sa.Column('idempotency_key', sa.String(length=255), nullable=False),
    sa.Column('payload', sa.JSON(), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('response_status', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('delivered_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['incident_id'], ['incidents.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('idempotency_key')
    )
    op.create_index(op.f('ix_alert_deliveries_incident_id'), 'alert_deliveries', ['incident_id'], unique=False)
    op.create_index(op.f('ix_alert_deliveries_status'), 'alert_deliveries', ['status'], unique=False)



def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index(op.f('ix_alert_deliveries_status'), table_name='alert_deliveries')
    op.drop_index(op.f('ix_alert_deliveries_incident_id'), table_name='alert_deliveries')

    op.drop_table('alert_deliveries')
    op.drop_index(op.f('ix_prompt_results_run_id'), table_name='prompt_results')

    op.drop_table('prompt_results')
    op.drop_index('uq_incidents_open', table_name='incidents')

    op.drop_table('incidents')
    op.drop_index('ix_validation_runs_pair_status', table_name='validation_runs')
    op.drop_index('ix_validation_runs_alias', table_name='validation_runs')

    op.drop_table('validation_runs')
