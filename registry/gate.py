"""The promotion gate: pure functions of a validation run's metrics.

The same function decides the ``validation_status`` tag written after a validation run and whether
:func:`registry.promotion.promote` may move an alias, so the two can never disagree for one gate.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from specdec.policy import FAILED, INCONCLUSIVE, METRICS, PASSED, AcceptancePolicy, Floor, combine, floor_for, judge


@dataclass(frozen=True, kw_only=True)
class GateConfig:
    """Promotion criteria.

    The policy's values (floor, evidence minimums, sides, estimator) come from the caller's acceptance
    policy (:class:`specdec.policy.AcceptancePolicy`, ``SPECDEC_POLICY__*``, read at the edge), the same one
    the drift rules, plots and Evidently report read: build one with :meth:`from_policy`.

    Attributes:
        min_acceptance_rate: the floor: the ``gate_side`` end of the judged metric's 95% CI (default the
            lower end of the acceptance rate at the validated k, metric ``acceptance_rate_ci_low``) must be
            at least this (policy threshold, or the pair version's own: :meth:`for_pair`).
        floor_source: where ``min_acceptance_rate`` came from, named in every gate reason.
        gate_side: ``lower`` | ``point`` | ``upper`` (policy); alert_side: the end whose value below the
            floor makes the criterion *fail* rather than be inconclusive (policy, :func:`specdec.policy.judge`).
        estimator: the judged metric (policy): ``pooled`` (``acceptance_rate``, accepted/drafted at the
            pair's k, as engines print it) or ``per_token`` (``per_token_acceptance``, the same at every k).
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

    min_acceptance_rate: float
    require_exactness_clean: bool = True
    min_predicted_speedup: float | None = None
    require_matching_config: bool = True
    min_num_prompts: int
    min_draft_tokens: int
    gate_side: str
    estimator: str
    gated_aliases: tuple[str, ...] = ("champion",)
    floor_source: str
    alert_side: str

    @classmethod
    def from_policy(cls, policy: AcceptancePolicy, **overrides: Any) -> "GateConfig":
        """The gate of ``policy`` (threshold, floor source, evidence minimums, sides, estimator), with
        ``overrides`` (any field, e.g. ``min_predicted_speedup=``) replacing its values.

        Raises:
            TypeError: an override that is not a field.
        """
        values = dict(min_acceptance_rate=policy.threshold, min_num_prompts=policy.min_prompts,
                      min_draft_tokens=policy.min_draft_tokens, gate_side=policy.gate_side,
                      estimator=policy.estimator, floor_source=policy.floor_source, alert_side=policy.alert_side)
        return cls(**{**values, **overrides})

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (for tags / logs)."""
        return asdict(self)

    @property
    def floor(self) -> Floor:
        """The floor this gate judges by, with its source."""
        return Floor(float(self.min_acceptance_rate), self.floor_source)

    def for_pair(self, tags: Mapping[str, Any] | None) -> "GateConfig":
        """This gate with the pair version's own floor (tag ``acceptance_floor``) when it has one.

        Raises:
            ValueError: the tag is not a number in [0, 1].
        """
        from dataclasses import replace

        floor = floor_for(AcceptancePolicy(threshold=float(self.min_acceptance_rate), floor_source=self.floor_source), tags)
        return replace(self, min_acceptance_rate=floor.value, floor_source=floor.source)


@dataclass
class GateResult:
    """Outcome of :func:`evaluate_gate`.

    Attributes:
        passed: True when every criterion holds.
        reasons: one human-readable line per criterion that does not hold (empty when passed).
        run_id: the validation run judged, if any.
        metrics: the metric values the gate looked at.
        inconclusive: not passed, but no criterion *failed*: too little evidence, or the acceptance CI
            straddles the floor (:data:`specdec.policy.VERDICTS`).
    """

    passed: bool
    reasons: list[str] = field(default_factory=list)
    run_id: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    inconclusive: bool = False
    parts: dict[str, tuple[str, list[str]]] = field(default_factory=dict)

    def beyond_acceptance(self) -> tuple[str, list[str]]:
        """(verdict word, reasons) of the criteria other than acceptance (exactness, config, evidence,
        speed): what the gate adds to the drift rules' floor, which judges acceptance the same way."""
        words = [w for name, (w, _r) in self.parts.items() if name != "acceptance"]
        return combine(words), [r for name, (_w, rs) in self.parts.items() if name != "acceptance" for r in rs]

    @property
    def status(self) -> str:
        """The gate's verdict word: ``passed``, ``failed`` or ``inconclusive`` (:data:`specdec.policy.VERDICTS`)."""
        return PASSED if self.passed else INCONCLUSIVE if self.inconclusive else FAILED


def _num(metrics: Mapping[str, Any], key: str) -> float | None:
    v = metrics.get(key)
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _acceptance(metrics: Mapping[str, Any], gate: GateConfig, reasons: list[str], seen: dict[str, float]) -> str:
    """The acceptance criterion: :func:`specdec.policy.judge` of the judged metric against the floor (its
    value and source named in the reason); the other metric (per-token α beside the acceptance rate, or
    the rate at k beside α) is shown with it. Returns the criterion's verdict word."""
    metric, _ci, label = METRICS[gate.estimator]
    key, what = {"lower": (f"{metric}_ci_low", "CI lower bound"), "point": (metric, "point estimate"),
                 "upper": (f"{metric}_ci_high", "CI upper bound")}[gate.gate_side]
    point = _num(metrics, metric)
    ci = (_num(metrics, f"{metric}_ci_low"), _num(metrics, f"{metric}_ci_high"))
    for name in (metric, "acceptance_rate", "per_token_acceptance"):
        if _num(metrics, name) is not None:
            seen[name] = _num(metrics, name)
    side = _num(metrics, key)
    if side is None:
        reasons.append(f"{label} ({metric}) {what} is missing (no drafted tokens, or CI not computed)")
        return INCONCLUSIVE
    seen[key] = side
    word = judge(point, ci, gate.min_acceptance_rate,
                 fail_side=gate.alert_side, pass_side=gate.gate_side)
    if word == PASSED:
        return word
    k = _num(metrics, "num_speculative_tokens")
    at = f" at k={int(k)}" if k and metric == "acceptance_rate" else ""
    shown = f" (point estimate {point:.3f})" if point is not None and key != metric else ""
    other = "per_token_acceptance" if metric == "acceptance_rate" else "acceptance_rate"
    o = _num(metrics, other)
    beside = "" if o is None else (f"; per-token acceptance {o:.3f}" if other == "per_token_acceptance"
                                   else f"; acceptance rate {o:.3f} at k={int(k) if k else '?'}")
    verdict = "below" if word == FAILED else "inconclusive against"
    reasons.append(f"{label} ({metric}){at} {what} {side:.3f} < {gate.floor.label()}{shown}{beside}"
                   + ("" if word == FAILED else f" ({verdict} the floor: the CI reaches it)"))
    return word


def _integrity(metrics: Mapping[str, Any], gate: GateConfig, reasons: list[str], seen: dict[str, float]) -> str:
    """Exactness audit and matching config: ``failed`` when either does not hold."""
    n = len(reasons)
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
    return FAILED if len(reasons) > n else PASSED


def _evidence(metrics: Mapping[str, Any], gate: GateConfig, reasons: list[str], seen: dict[str, float]) -> str:
    """Minimum prompts and drafted tokens: ``inconclusive`` when too little was validated."""
    n = len(reasons)
    for key, floor, what in (("num_prompts", gate.min_num_prompts, "prompts"),
                             ("num_draft_tokens", gate.min_draft_tokens, "drafted tokens")):
        if floor:
            v = _num(metrics, key)
            if v is None or v < floor:
                shown = "unknown" if v is None else str(int(v))
                reasons.append(f"too little evidence: {shown} {what} validated (< {floor}); the CI is not trustworthy")
            else:
                seen[key] = v
    return INCONCLUSIVE if len(reasons) > n else PASSED


def _speed(metrics: Mapping[str, Any], gate: GateConfig, reasons: list[str], seen: dict[str, float]) -> str:
    """The optional predicted-speedup criterion: ``failed`` when missing or below it."""
    if gate.min_predicted_speedup is None:
        return PASSED
    sp = _num(metrics, "predicted_speedup")
    if sp is None:
        reasons.append("predicted speedup is missing")
        return FAILED
    seen["predicted_speedup"] = sp
    if sp < gate.min_predicted_speedup:
        reasons.append(f"predicted speedup {sp:.2f} < {gate.min_predicted_speedup:.2f}")
        return FAILED
    return PASSED


def evaluate_gate(metrics: Mapping[str, Any], gate: GateConfig, run_id: str | None = None) -> GateResult:
    """Judge one validation's metrics against ``gate``.

    Args:
        metrics: metric name -> value, with the names logged by :func:`registry.runs.log_validation`
            (``per_token_acceptance``, ``per_token_acceptance_ci_low``, ``acceptance_rate``, ``exactness_mismatches``,
            ``predicted_speedup``). Missing or NaN values fail the criterion that needs them.
        gate: the criteria.
        run_id: recorded in the result.
    Returns:
        :class:`GateResult` with every criterion that does not hold listed in ``reasons``; its ``status`` is
        the verdict word (:func:`specdec.policy.combine` of the criteria's: acceptance by
        :func:`specdec.policy.judge`, exactness/config ``failed``, too little evidence ``inconclusive``).
    """
    reasons: list[str] = []
    seen: dict[str, float] = {}
    parts: dict[str, tuple[str, list[str]]] = {}
    for name, part in (("acceptance", _acceptance), ("integrity", _integrity), ("evidence", _evidence),
                       ("speed", _speed)):
        before = len(reasons)
        parts[name] = (part(metrics, gate, reasons, seen), reasons[before:])
    word = combine(w for w, _r in parts.values())
    return GateResult(passed=word == PASSED, reasons=reasons, run_id=run_id, metrics=seen,
                      inconclusive=word == INCONCLUSIVE, parts=parts)
