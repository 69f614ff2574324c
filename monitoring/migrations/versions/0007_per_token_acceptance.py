"""per-token acceptance: fill alpha_hat (+ 95% CI) of existing rows from their stored counters

The floor's metric is now the per-token acceptance α̂ = accepted / (accepted + rejected steps)
(``AcceptancePolicy.estimator = "per_token"``, docs/metrics.md "Per-token acceptance"), so every
history row needs it for trends and baselines to go on. Rows that lack it (production windows
stored no CI; windows without all k per-position counters stored none) or that still hold the
estimator used before 2026-11-29 (position-0 acceptance, accepted_per_position[0] / num_drafts,
where that differs from the MLE) get it from their stored counters: rejected steps =
num_drafts - accepted_per_position[k-1], and a normal 95% CI with the draft as the unit
(``specdec.core.stats.per_token_from_positions``), in the ``alpha_hat*`` columns and in the stored
``overall`` / ``categories`` JSON. Rows without the counters keep NULL. A row whose alpha_hat is
already the MLE with a CI (nightly runs since 2026-11-29) is left alone: its value and bootstrap CI
over prompts come from the exact step counters.

Downgrade keeps the values (they are estimates of a quantity every revision defines).

Revision ID: 0007_per_token_acceptance
Revises: 0006_webhook_deliveries
Create Date: 2026-12-02

"""
import math
from typing import Any, Sequence, Union

from alembic import op
import sqlalchemy as sa

from specdec.core.stats import per_token_from_positions

# revision identifiers, used by Alembic.
revision: str = '0007_per_token_acceptance'
down_revision: Union[str, Sequence[str], None] = '0006_webhook_deliveries'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def refill(group: dict, k: int | None) -> tuple[float, list[float]] | None:
    """The per-token value and CI a stored GroupMetrics dict should carry, or None to leave it."""
    pp, drafts = list(group.get("accepted_per_position") or []), group.get("num_drafts") or 0
    k = k or group.get("num_speculative_tokens") or len(pp)
    alpha, ci = per_token_from_positions(int(drafts), [int(x) for x in pp], int(k or 0))
    if not _finite(alpha):
        return None
    stored, stored_ci = group.get("alpha_hat"), list(group.get("alpha_hat_ci") or [])
    pos0 = pp[0] / drafts if pp and drafts else None
    old_estimator = _finite(stored) and pos0 is not None and abs(stored - pos0) < 1e-9 and abs(stored - alpha) > 1e-6
    has_ci = len(stored_ci) == 2 and all(_finite(c) for c in stored_ci)
    if _finite(stored) and has_ci and not old_estimator:
        return None
    return alpha, ci


def _clean(ci: list[float]) -> list[float | None]:
    return [c if _finite(c) else None for c in ci]


def upgrade() -> None:
    """Fill alpha_hat / alpha_hat_ci_low / alpha_hat_ci_high (and the JSON) from stored counters."""
    bind = op.get_bind()
    runs = sa.table("validation_runs", sa.column("id", sa.Integer), sa.column("num_speculative_tokens", sa.Integer),
                    sa.column("alpha_hat", sa.Float), sa.column("alpha_hat_ci_low", sa.Float),
                    sa.column("alpha_hat_ci_high", sa.Float), sa.column("overall", sa.JSON),
                    sa.column("categories", sa.JSON))
    for row in bind.execute(sa.select(runs)).mappings().all():
        overall, cats, k = row["overall"], row["categories"], row["num_speculative_tokens"]
        if not overall:
            continue
        values: dict[str, Any] = {}
        new = refill(overall, k)
        if new is not None:
            lo, hi = _clean(new[1])
            values.update(alpha_hat=new[0], alpha_hat_ci_low=lo, alpha_hat_ci_high=hi,
                          overall={**overall, "alpha_hat": new[0], "alpha_hat_ci": [lo, hi]})
        filled = {name: refill(g, k) for name, g in (cats or {}).items()}
        if any(v is not None for v in filled.values()):
            values["categories"] = {name: g if filled[name] is None else
                                    {**g, "alpha_hat": filled[name][0], "alpha_hat_ci": _clean(filled[name][1])}
                                    for name, g in cats.items()}
        if values:
            bind.execute(sa.update(runs).where(runs.c.id == row["id"]).values(**values))


def downgrade() -> None:
    """Nothing to undo: the filled values stay (older revisions read alpha_hat as they always did)."""
