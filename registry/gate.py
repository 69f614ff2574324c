"""The promotion gate: pure functions of a validation run's metrics.

The same function decides the ``validation_status`` tag written after a validation run and whether
:func:`registry.promotion.promote` may move an alias, so the two can never disagree for one gate.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from specdec.policy import METRICS
from specdec.settings.policy import get_policy


@dataclass(frozen=True)
class GateConfig:
    """Promotion criteria.

    Defaults come from the acceptance policy (:class:`specdec.policy.AcceptancePolicy`,
    ``SPECDEC_POLICY__*``), the same one the drift rules, plots and Evidently report read.

    Attributes:
        min_acceptance_rate: the ``gate_side`` end of the judged metric's 95% CI (default the
            lower end of the per-token acceptance, metric ``per_token_acceptance_ci_low``) must be at least
            this (policy threshold).
        gate_side: ``lower`` | ``point`` | ``upper`` (policy).
        estimator: the judged metric (policy): ``per_token`` (``per_token_acceptance``, the same at every k)
            or ``pooled`` (``acceptance_rate``, vLLM's accepted/drafted at the pair's k).
        require_exactness_clean: the greedy exactness audit must report 0 mismatches
            (metric ``exactness_mismatches``). An audit that did not run (sampling) counts as clean.
        min_predicted_speedup: if set, metric ``predicted_speedup`` must be at least this. Off by
            default: speedup depends on the hardware where validation ran.
        require_matching_config: the validation must have used the pair version's k and sampling
            (metric ``config_mismatch`` = 0, written by :func:`registry.runs.log_validation`).
        min_num_prompts / min_draft_tokens: minimum evidence behind the CI (metrics ``num_prompts``,
            ``num_draft_tokens``). The CI is a bootstrap over prompts: with a handful of prompts it
            collapses towards the point estimate, so a tiny validation must not promote.
        gated_aliases: aliases that require a passing gate. ``challenger`` is not gated by default:
            it names the candidate that the nightly job validates next.
    """

    min_acceptance_rate: float = field(default_factory=lambda: get_policy().threshold)
    require_exactness_clean: bool = True
    min_predicted_speedup: float | None = None
    require_matching_config: bool = True
    min_num_prompts: int = field(default_factory=lambda: get_policy().min_prompts)
    min_draft_tokens: int = field(default_factory=lambda: get_policy().min_draft_tokens)
    gate_side: str = field(default_factory=lambda: get_policy().gate_side)
    estimator: str = field(default_factory=lambda: get_policy().estimator)
    gated_aliases: tuple[str, ...] = ("champion",)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (for tags / logs)."""
        return asdict(self)


@dataclass
class GateResult:
    """Outcome of :func:`evaluate_gate`.

    Attributes:
        passed: True when every criterion holds.
        reasons: one human-readable line per failed criterion (empty when passed).
        run_id: the validation run judged, if any.
        metrics: the metric values the gate looked at.
    """

    passed: bool
    reasons: list[str] = field(default_factory=list)
    run_id: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def status(self) -> str:
        """``passed`` or ``failed`` (the ``validation_status`` tag value)."""
        return "passed" if self.passed else "failed"


def _num(metrics: Mapping[str, Any], key: str) -> float | None:
    v = metrics.get(key)
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _acceptance(metrics: Mapping[str, Any], gate: GateConfig, reasons: list[str], seen: dict[str, float]) -> None:
    """The acceptance criterion: the gate side of the judged metric (named in the reason) against the
    threshold; vLLM's acceptance rate at k is shown beside a per-token verdict."""
    metric, _ci, label = METRICS[gate.estimator]
    key, what = {"lower": (f"{metric}_ci_low", "CI lower bound"), "point": (metric, "point estimate"),
                 "upper": (f"{metric}_ci_high", "CI upper bound")}[gate.gate_side]
    side, point = _num(metrics, key), _num(metrics, metric)
    for name, v in ((metric, point), ("acceptance_rate", _num(metrics, "acceptance_rate"))):
        if v is not None:
            seen[name] = v
    if side is None:
        reasons.append(f"{label} ({metric}) {what} is missing (no drafted tokens, or CI not computed)")
        return
    seen[key] = side
    if side < gate.min_acceptance_rate:
        shown = f" (point estimate {point:.3f})" if point is not None and key != metric else ""
        k, rate = _num(metrics, "num_speculative_tokens"), seen.get("acceptance_rate")
        beside = (f"; acceptance rate {rate:.3f} at k={int(k) if k else '?'}"
                  if metric != "acceptance_rate" and rate is not None else "")
        reasons.append(f"{label} ({metric}) {what} {side:.3f} < {gate.min_acceptance_rate:.2f}{shown}{beside}")


def evaluate_gate(metrics: Mapping[str, Any], gate: GateConfig | None = None, run_id: str | None = None) -> GateResult:
    """Judge one validation's metrics against ``gate``.

    Args:
        metrics: metric name -> value, with the names logged by :func:`registry.runs.log_validation`
            (``per_token_acceptance``, ``per_token_acceptance_ci_low``, ``acceptance_rate``, ``exactness_mismatches``,
            ``predicted_speedup``). Missing or NaN values fail the criterion that needs them.
        gate: the criteria.
        run_id: recorded in the result.
    Returns:
        :class:`GateResult` with every failed criterion listed in ``reasons``.
    """
    gate = gate or GateConfig()
    reasons: list[str] = []
    seen: dict[str, float] = {}
    _acceptance(metrics, gate, reasons, seen)
    if gate.require_exactness_clean:
        mism = _num(metrics, "exactness_mismatches")
        if mism is not None:
            seen["exactness_mismatches"] = mism
            if mism > 0:
                checked = _num(metrics, "exactness_checked")
                of = f" of {int(checked)} audited prompts" if checked is not None else ""
                reasons.append(f"exactness audit found {int(mism)} mismatch(es){of}: speculative output differs from target-only")
    if gate.require_matching_config:
        mism = _num(metrics, "config_mismatch")
        if mism is not None and mism > 0:
            seen["config_mismatch"] = mism
            reasons.append("the validation used a different decoding config (k or sampling) than the pair version serves")
    for key, floor, what in (("num_prompts", gate.min_num_prompts, "prompts"),
                             ("num_draft_tokens", gate.min_draft_tokens, "drafted tokens")):
        if floor:
            n = _num(metrics, key)
            if n is None or n < floor:
                shown = "unknown" if n is None else str(int(n))
                reasons.append(f"too little evidence: {shown} {what} validated (< {floor}); the CI is not trustworthy")
            else:
                seen[key] = n
    if gate.min_predicted_speedup is not None:
        sp = _num(metrics, "predicted_speedup")
        if sp is None:
            reasons.append("predicted speedup is missing")
        else:
            seen["predicted_speedup"] = sp
            if sp < gate.min_predicted_speedup:
                reasons.append(f"predicted speedup {sp:.2f} < {gate.min_predicted_speedup:.2f}")
    return GateResult(passed=not reasons, reasons=reasons, run_id=run_id, metrics=seen)
