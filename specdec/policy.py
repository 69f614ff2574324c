"""The acceptance policy: one definition of "healthy" read by the drift rules, the promotion gate,
the plots and the Evidently report, and recorded with every run (issue 12, item 5).

Environment (all optional): ``SPECDEC_POLICY__THRESHOLD`` (default 0.40;
``SPECDEC_RULES__ABSOLUTE_THRESHOLD`` is read as an older name for it), ``SPECDEC_POLICY__ALERT_SIDE``
(``upper``), ``SPECDEC_POLICY__GATE_SIDE`` (``lower``), ``SPECDEC_POLICY__MIN_DRAFT_TOKENS`` (200),
``SPECDEC_POLICY__MIN_PROMPTS`` (5).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, Mapping

SIDES = ("lower", "point", "upper")
ESTIMATORS = ("pooled",)


@dataclass(frozen=True)
class AcceptancePolicy:
    """When a pair's acceptance rate is acceptable.

    Attributes:
        threshold: acceptance rate (probability in [0, 1]) a healthy pair reaches (0.40).
        estimator: ``pooled``: accepted / drafted tokens over all prompts (vLLM's acceptance
            rate), with its bootstrap 95% CI over prompts (docs/metrics.md).
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
    estimator: str = "pooled"
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

    def describe(self) -> str:
        """One line shown with verdicts, e.g. in ``specdec nightly run``."""
        return (f"acceptance policy: {self.estimator} acceptance rate vs {self.threshold:.2f}; alert when the "
                f"95% CI {self.alert_side} end is below it, promote when the {self.gate_side} end is at or above "
                f"it; evidence >= {self.min_draft_tokens} drafted tokens and >= {self.min_prompts} prompts")

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (recorded with each run)."""
        return asdict(self)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "AcceptancePolicy":
        """The policy from ``SPECDEC_POLICY__*`` (see the module docstring).

        Raises:
            ValueError: a malformed value (the message names the variable).
        """
        env = os.environ if env is None else env
        kw: dict[str, Any] = {}
        thr = env.get("SPECDEC_POLICY__THRESHOLD") or env.get("SPECDEC_RULES__ABSOLUTE_THRESHOLD")
        spec = {"THRESHOLD": ("threshold", float), "ESTIMATOR": ("estimator", str),
                "ALERT_SIDE": ("alert_side", str), "GATE_SIDE": ("gate_side", str),
                "MIN_DRAFT_TOKENS": ("min_draft_tokens", int), "MIN_PROMPTS": ("min_prompts", int)}
        for suffix, (name, typ) in spec.items():
            raw = thr if suffix == "THRESHOLD" else env.get(f"SPECDEC_POLICY__{suffix}")
            if raw in (None, ""):
                continue
            try:
                kw[name] = typ(raw.strip().lower() if typ is str else raw)
            except ValueError:
                raise ValueError(f"SPECDEC_POLICY__{suffix} must be {typ.__name__}, got {raw!r}") from None
        return cls(**kw)


def get_policy() -> AcceptancePolicy:
    """The current policy (read afresh from the environment)."""
    return AcceptancePolicy.from_env()
