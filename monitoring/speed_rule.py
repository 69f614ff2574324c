"""The rule "speculation no longer pays": the measured speedup's CI lies below 1.

Speculative decoding is only worth serving while it is faster than target-only decoding. The
validation measures both on the same prompts, paired per prompt (:mod:`specdec.speed`), and
bootstraps a 95% CI of the pooled speedup. This rule fires when the CI's upper end is below
``RuleSettings.speed_threshold`` (1.0) with at least ``speed_min_prompts`` prompts measured.

Timings depend on the machine as much as on the pair. Each run records the 1-minute load average
sampled after every prompt and the CPUs it could use; a run whose mean load per CPU exceeded
``speed_max_load_per_cpu`` is **speed-inconclusive** (status ``inconclusive``): its numbers are
stored and shown, but it neither fires nor counts as evidence that speed is fine. Pure function,
no I/O.
"""

from __future__ import annotations

import math

from monitoring.settings import RuleSettings
from specdec.report import GroupMetrics

SPEED_RULE = "speed"
#: status of a speed measurement taken on an overloaded machine (never alerts)
SPEED_INCONCLUSIVE = "inconclusive"


def _num(x) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def load_per_cpu(g: GroupMetrics) -> float | None:
    """Mean 1-minute load average per usable CPU during the run's timings, or ``None``."""
    load, cpus = _num(getattr(g, "load_avg_1m", None)), int(getattr(g, "num_cpus", 0) or 0)
    return load / cpus if load is not None and cpus > 0 else None


def speed_rule(current: GroupMetrics, baseline: GroupMetrics | None, settings: RuleSettings):
    """Evaluate "speculation no longer pays" on the overall metrics of a run.

    Args:
        current: the run's overall :class:`GroupMetrics` (``speedup``, ``speedup_ci``,
            ``num_prompts``, ``load_avg_1m``, ``num_cpus``).
        baseline: the baseline run's overall metrics (its ``speedup`` is reported as the
            baseline, for "speedup A x -> B x"), or ``None``.
        settings: thresholds and severity.
    Returns:
        :class:`monitoring.rules.RuleResult` with rule ``speed``, metric ``speedup``, the CI,
        threshold, baseline speedup and ``severity``; status ``firing``, ``ok``,
        ``insufficient_evidence``, ``inconclusive`` (overloaded machine) or ``not_applicable``.
    """
    from monitoring.rules import FIRING, INSUFFICIENT, NOT_APPLICABLE, OK, OVERALL, RuleResult

    value = _num(current.speedup)
    ci_raw = list(getattr(current, "speedup_ci", None) or [])
    ci = (_num(ci_raw[0]), _num(ci_raw[1])) if len(ci_raw) == 2 else (None, None)
    ci = ci if None not in ci else None
    base = _num(baseline.speedup) if baseline is not None else None
    common = dict(rule=SPEED_RULE, scope=OVERALL, metric="speedup", value=value, ci=ci,
                  threshold=settings.speed_threshold, baseline=base,
                  num_draft_tokens=int(current.num_draft_tokens or 0), severity=settings.speed_severity)
    if not settings.speed_enabled:
        return RuleResult(status=NOT_APPLICABLE, message="speed rule disabled", **common)
    if value is None:
        return RuleResult(status=NOT_APPLICABLE, message="speedup not measured", **common)
    shown = f"measured speedup {value:.2f}x" + (f" (95% CI {ci[0]:.2f}-{ci[1]:.2f}x)" if ci else "")
    lpc = load_per_cpu(current)
    if lpc is not None and lpc > settings.speed_max_load_per_cpu:
        return RuleResult(status=SPEED_INCONCLUSIVE, **common, message=(
            f"speed-inconclusive: {shown} taken at load {current.load_avg_1m:.2f} on {current.num_cpus} CPUs "
            f"({lpc:.2f}/CPU > {settings.speed_max_load_per_cpu:.2f}): machine overloaded, no speed alert"))
    n = int(current.num_prompts or 0)
    if n < settings.speed_min_prompts or ci is None:
        return RuleResult(status=INSUFFICIENT, **common, message=(
            f"{shown} on {n} prompts (< {settings.speed_min_prompts} needed or no CI): not enough evidence"))
    if value < settings.speed_threshold <= ci[1]:
        return RuleResult(status=INSUFFICIENT, **common, message=(
            f"{shown} below {settings.speed_threshold:.2f}x, but the CI reaches above it: no speed alert yet"))
    if ci[1] < settings.speed_threshold:
        was = f" (was {base:.2f}x at baseline)" if base is not None else ""
        return RuleResult(status=FIRING, **common, message=(
            f"speculation no longer pays: {shown}{was}, CI entirely below {settings.speed_threshold:.2f}x: "
            "serving target-only would be faster"))
    return RuleResult(status=OK, **common, message=f"{shown}: speculation pays or is not credibly slower")
