"""the floor judges the acceptance rate at the validated k: stored verdicts re-derived

The floor's default estimator is now ``pooled`` (accepted / drafted at the pair's validated k, the
rate vLLM and llama.cpp print; :mod:`specdec.policy`), and the relative rule always compares the
per-token acceptance (k-invariant). Existing rows keep every number; their verdict (``status``) and
stored rule results are re-derived from those numbers under the new default
(:func:`monitoring.rules.rederive`): the floor overall and per category at the threshold each stored
result used, and the relative rule against the row's own baseline run. Every other stored rule result
(collapse, measurement, speed, gate) is kept. Rows without metrics, still running or in error are left
alone; open incidents are not touched (the next evaluated run moves them). Only nightly rows are re-derived: a
production window or an engine check is judged by its own rules (:mod:`monitoring.production.rules`,
:mod:`monitoring.engine_checks`), and re-deriving it with the nightly floor turned a stored ``passed`` window
into ``failed`` (issue 51); their stored verdicts are kept as they are.

Downgrade leaves the re-derived verdicts (a verdict is not a schema change).

Revision ID: 0008_floor_on_acceptance_rate
Revises: 0007_per_token_acceptance
Create Date: 2026-12-04

"""
from dataclasses import replace
from typing import Any, Sequence, Union

from alembic import op
import sqlalchemy as sa

from monitoring.rules import rederive
from monitoring.settings import RuleSettings
from specdec.validation.report import group_metrics_from_dict, nan_to_none

# revision identifiers, used by Alembic.
revision: str = '0008_floor_on_acceptance_rate'
down_revision: Union[str, Sequence[str], None] = '0007_per_token_acceptance'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

VERDICT_STATUSES = ("passed", "failed", "inconclusive")


class _Snapshot:
    """The stored metrics of one row (what :func:`monitoring.rules.rederive` reads)."""

    def __init__(self, overall: dict, categories: dict | None) -> None:
        self.overall = group_metrics_from_dict(overall)
        self.categories = {k: group_metrics_from_dict(v) for k, v in (categories or {}).items()}


def upgrade() -> None:
    """Re-derive ``status`` and ``rule_results`` of every evaluated nightly row."""
    bind = op.get_bind()
    runs = sa.table("validation_runs", sa.column("id", sa.Integer), sa.column("status", sa.String),
                    sa.column("overall", sa.JSON), sa.column("categories", sa.JSON),
                    sa.column("rule_results", sa.JSON), sa.column("baseline_run_id", sa.Integer),
                    sa.column("source", sa.String))
    rows = bind.execute(sa.select(runs.c.id, runs.c.status, runs.c.overall, runs.c.categories, runs.c.rule_results,
                                  runs.c.baseline_run_id).where(runs.c.status.in_(VERDICT_STATUSES),
                                                                runs.c.source == "nightly")).mappings().all()
    overall_of = {r["id"]: r["overall"] for r in rows}
    settings = RuleSettings()  # the environment's policy, judged on the acceptance rate
    settings = settings.model_copy(update={"policy": replace(settings.policy, estimator="pooled")})
    for row in rows:
        if not row["overall"] or not row["rule_results"]:
            continue
        base: Any = overall_of.get(row["baseline_run_id"]) if row["baseline_run_id"] else None
        word, results = rederive(row["rule_results"], _Snapshot(row["overall"], row["categories"]),
                                 group_metrics_from_dict(base) if base else None, settings)
        bind.execute(sa.update(runs).where(runs.c.id == row["id"]).values(
            status=word, rule_results=nan_to_none([r.to_dict() for r in results])))


def downgrade() -> None:
    """Nothing to undo in the schema."""
