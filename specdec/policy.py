"""The acceptance policy: one definition of "healthy" read by the drift rules, the promotion gate,
the plots and the Evidently report, and recorded with every run.

This module is the value type only; the environment (``SPECDEC_POLICY__*``) is read by the settings
tree, :mod:`specdec.settings.policy` (``get_policy()``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

SIDES = ("lower", "point", "upper")
#: the floor's metric: ``per_token`` (default, k-invariant) or ``pooled`` (vLLM's accepted/drafted at k)
ESTIMATORS = ("per_token", "pooled")
#: per estimator: (GroupMetrics field of the point estimate, field of its 95% CI, name shown to users)
METRICS = {"per_token": ("per_token_acceptance", "per_token_acceptance_ci", "per-token acceptance"),
           "pooled": ("acceptance_rate", "acceptance_rate_ci", "acceptance rate")}


@dataclass(frozen=True)
class AcceptancePolicy:
    """When a pair's acceptance rate is acceptable.

    Attributes:
        threshold: acceptance (probability in [0, 1]) a healthy pair reaches (0.40), in the
            estimator's metric.
        estimator: ``per_token`` (default): Leviathan's per-token acceptance α whose i.i.d. model
            gives the measured mean accepted length at the measured proposal length
            (:func:`specdec.core.stats.iid_alpha`; GroupMetrics ``per_token_acceptance``), the
            candidate that moved least from k = 2 to k = 8 on the real pairs
            (``benchmarks/results/*-alpha-k-invariance-cpu.json``); ``pooled``: accepted / drafted
            tokens (vLLM's acceptance rate), which falls as k grows. Both with their bootstrap 95%
            CI over prompts (docs/metrics.md, "Per-token acceptance").
        alert_side: which end of the 95% CI must fall below ``threshold`` for the drift rule to
            alert (``upper``: alert only when the pair is credibly below; ``point`` / ``lower`` alert
            earlier and more often).
        gate_side: which end must be at or above ``threshold`` for promotion (``lower``: promote
            only when credibly above).
        min_draft_tokens / min_prompts: minimum evidence; below it the rules do not alert
            (inconclusive) and the gate does not promote.
    Raises:
        ValueError: out-of-range values.
    """

    threshold: float = 0.40
    estimator: str = "per_token"
    alert_side: str = "upper"
    gate_side: str = "lower"
    min_draft_tokens: int = 200
    min_prompts: int = 5

    def __post_init__(self) -> None:
        if isinstance(self.threshold, bool) or not 0.0 <= float(self.threshold) <= 1.0:
            raise ValueError(f"policy threshold must be in [0, 1], got {self.threshold!r}")
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"policy estimator must be one of {ESTIMATORS}, got {self.estimator!r}")
        for name in ("alert_side", "gate_side"):
            if getattr(self, name) not in SIDES:
                raise ValueError(f"policy {name} must be one of {SIDES}, got {getattr(self, name)!r}")
        for name in ("min_draft_tokens", "min_prompts"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"policy {name} must be an int >= 0, got {v!r}")

    @staticmethod
    def side_value(side: str, point: float | None, ci: tuple[float, float] | list | None) -> float | None:
        """The value of ``side`` (``lower`` | ``point`` | ``upper``) of an estimate and its CI."""
        if side == "point":
            return point
        if not ci or len(ci) < 2:
            return None
        return ci[0] if side == "lower" else ci[1]

    @property
    def metric(self) -> str:
        """The :class:`~specdec.validation.report.GroupMetrics` field the floor judges
        (``per_token_acceptance`` or ``acceptance_rate``); its CI is ``<metric>_ci``."""
        return METRICS[self.estimator][0]

    @property
    def metric_label(self) -> str:
        """The judged metric's name for people: ``per-token acceptance`` or ``acceptance rate``."""
        return METRICS[self.estimator][2]

    def judged(self, g: Any) -> tuple[float | None, tuple[float, float] | None]:
        """(point, 95% CI) of the judged metric of a GroupMetrics-like ``g`` (NaN -> None)."""
        point = _finite(getattr(g, METRICS[self.estimator][0], None))
        ci = list(getattr(g, METRICS[self.estimator][1], None) or [])
        lo, hi = (_finite(ci[0]), _finite(ci[1])) if len(ci) == 2 else (None, None)
        return point, ((lo, hi) if lo is not None and hi is not None else None)

    def describe(self) -> str:
        """One line shown with verdicts, e.g. in ``specdec nightly run``."""
        return (f"acceptance policy: {self.metric_label} ({self.estimator}) vs {self.threshold:.2f}; alert when the "
                f"95% CI {self.alert_side} end is below it, promote when the {self.gate_side} end is at or above "
                f"it; evidence >= {self.min_draft_tokens} drafted tokens and >= {self.min_prompts} prompts")

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (recorded with each run), with the judged ``metric``."""
        return {**asdict(self), "metric": self.metric}


def _finite(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None
