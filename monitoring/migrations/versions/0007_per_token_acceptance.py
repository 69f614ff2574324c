"""per-token acceptance: validation_runs.per_token_acceptance (+ 95% CI), filled from stored counters

The floor's metric is now the per-token acceptance (``AcceptancePolicy.estimator = "per_token"``,
docs/metrics.md "Per-token acceptance"): the i.i.d. α whose mean accepted length at the measured
proposal length equals the measured one (``specdec.core.stats.per_token_acceptance``). So that trends
and baselines go on, every existing row gets it from its stored counters (``num_drafts``,
``num_draft_tokens``, ``num_accepted_tokens`` of the ``overall`` JSON and of each category), with the
row's acceptance-rate 95% CI times drafted tokens per draft as the interval of accepted per draft,
mapped the same way; in the new columns and in the stored JSON. Rows without counters keep NULL.
(New nightly rows get a bootstrap over prompts of accepted per draft instead; for model drafters,
which propose k tokens a step, the two intervals agree.)

Revision ID: 0007_per_token_acceptance
Revises: 0006_webhook_deliveries
Create Date: 2026-12-02

"""
import math
from typing import Any, Sequence, Union

from alembic import op
import sqlalchemy as sa

from specdec.core.stats import per_token_acceptance

# revision identifiers, used by Alembic.
revision: str = '0007_per_token_acceptance'
down_revision: Union[str, Sequence[str], None] = '0006_webhook_deliveries'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

COLUMNS = ('per_token_acceptance', 'per_token_acceptance_ci_low', 'per_token_acceptance_ci_high')


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def from_counters(group: dict | None) -> tuple[float, list[float | None]] | None:
    """(per-token acceptance, [low, high]) of a stored GroupMetrics dict, or None without counters."""
    g = group or {}
    drafts, drafted, accepted = g.get("num_drafts"), g.get("num_draft_tokens"), g.get("num_accepted_tokens")
    if not (_finite(drafts) and drafts > 0 and _finite(drafted) and _finite(accepted)):
        return None
    rate_ci = list(g.get("acceptance_rate_ci") or [])
    mean_ci = [x * drafted / drafts for x in rate_ci] if len(rate_ci) == 2 and all(_finite(x) for x in rate_ci) else None
    alpha, ci = per_token_acceptance(drafts, drafted, accepted, mean_ci)
    return (alpha, [c if _finite(c) else None for c in ci]) if _finite(alpha) else None


def upgrade() -> None:
    """Add the columns, then fill them (and the JSON) for every row with counters."""
    with op.batch_alter_table('validation_runs') as batch:
        for name in COLUMNS:
            batch.add_column(sa.Column(name, sa.Float(), nullable=True))
    bind = op.get_bind()
    runs = sa.table("validation_runs", sa.column("id", sa.Integer), *(sa.column(c, sa.Float) for c in COLUMNS),
                    sa.column("overall", sa.JSON), sa.column("categories", sa.JSON))
    for row in bind.execute(sa.select(runs.c.id, runs.c.overall, runs.c.categories)).mappings().all():
        values: dict[str, Any] = {}
        got = from_counters(row["overall"])
        if got is not None:
            values = dict(zip(COLUMNS, (got[0], *got[1])))
            values["overall"] = {**row["overall"], "per_token_acceptance": got[0], "per_token_acceptance_ci": got[1]}
        cats = row["categories"] or {}
        filled = {name: from_counters(g) for name, g in cats.items()}
        if any(v is not None for v in filled.values()):
            values["categories"] = {name: g if filled[name] is None else
                                    {**g, "per_token_acceptance": filled[name][0],
                                     "per_token_acceptance_ci": filled[name][1]} for name, g in cats.items()}
        if values:
            bind.execute(sa.update(runs).where(runs.c.id == row["id"]).values(**values))


def downgrade() -> None:
    """Drop the columns (the JSON keeps its extra keys, which older revisions ignore)."""
    with op.batch_alter_table('validation_runs') as batch:
        for name in reversed(COLUMNS):
            batch.drop_column(name)
