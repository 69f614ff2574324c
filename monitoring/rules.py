"""Drift rules over a run and its baseline, and the root-cause hint. Pure functions, no I/O.

Rules (thresholds in :class:`monitoring.settings.RuleSettings`):

- ``absolute`` (the floor): the policy's acceptance metric below the floor (0.40, or the pair
  version's own, tag ``acceptance_floor``; the message names it and its source), overall and per
  category (own thresholds). By default that metric is the acceptance rate as engines print it
  (accepted / drafted at the validated k: vLLM's "Draft acceptance rate", llama.cpp's
  accepted/drafted), with the per-token acceptance α shown beside it; ``estimator="per_token"``
  judges α itself. Verdict by :func:`specdec.policy.judge`: fires when the upper end of the 95% CI is
  below the floor *and* at least N draft tokens were measured; ``ok`` when the CI's lower end is at or
  above it; otherwise ``insufficient_evidence`` (inconclusive: "no alert yet").
- ``relative``: the per-token acceptance (k-invariant, whatever the floor's estimator) more than 15%
  below the baseline (the last passing run of the current champion): fires when the CI upper bound
  is below ``(1 - 0.15) * baseline``; a baseline at another k still compares, so a k change is not drift.
- ``collapse``: ``draft_tokens_per_step`` falls by more than 30% against the baseline (a drafter
  that stopped proposing can show 100% acceptance on almost nothing).
- output length: when a night's mean output length (tokens per prompt) is outside
  :data:`OUTPUT_LENGTH_BAND` of its baseline's, a firing relative or collapse rule is not called drift: it
  becomes ``insufficient_evidence`` and says the outputs got shorter or longer (:func:`not_drift`).
- ``measurement``: the teacher-forced α (``alpha_tf``) and the decoding estimate of the same
  quantity (``alpha_hat``, the i.i.d. maximum-likelihood α from the decoding steps) have non-overlapping 95% CIs. For k > 1 the
  acceptance *rate* is a different quantity from α, so it is not compared with ``alpha_tf``.
- ``measurement`` (scope ``replay``): a ``--method both`` run whose replay and decoding disagree
  beyond numerics (:func:`replay_rule`); near-ties at the pair's rounding never fire it.
- ``speed``: "speculation no longer pays", the measured speedup's 95% CI lies below 1.0
  (:func:`speed_rule`); speed-inconclusive on an overloaded machine.

Statuses: ``ok``, ``firing``, ``insufficient_evidence``, ``not_applicable``, and ``inconclusive``
(speed rule only: measured on an overloaded machine). Every result carries a ``severity``
(``RuleSettings.acceptance_severity`` for the acceptance rules, ``speed_severity`` for speed).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping

from monitoring.settings import RuleSettings
from specdec.policy import (FAILED, INCONCLUSIVE, PASSED, TREND_ESTIMATOR, AcceptancePolicy, Floor, below_floor_note,
                            combine, judge, rates_by_k)
from specdec.validation.report import GroupMetrics

OK, FIRING, INSUFFICIENT, NOT_APPLICABLE = "ok", "firing", "insufficient_evidence", "not_applicable"
OVERALL = "overall"


@dataclass
class RuleResult:
    """One rule's outcome on one scope.

    Attributes:
        rule: ``absolute`` | ``relative`` | ``collapse`` | ``measurement``.
        scope: ``"overall"`` or a category name.
        status: ``ok`` | ``firing`` | ``insufficient_evidence`` | ``not_applicable``.
        metric: the metric compared (``acceptance_rate``, ``draft_tokens_per_step``, ``alpha_tf``).
        value: current value (probability in [0, 1], or tokens per step); ``None`` if unmeasured.
        ci: 95% CI ``(low, high)`` of ``value`` when known.
        threshold: the value compared against (absolute threshold, or baseline-derived limit).
        baseline: the baseline run's value, when the rule uses one.
        num_draft_tokens: draft tokens behind ``value`` (the evidence size).
        message: one human sentence.
        severity: ``info`` | ``warning`` | ``critical`` (``None`` in results stored before it existed).
    """

    rule: str
    scope: str
    status: str
    metric: str
    value: float | None = None
    ci: tuple[float, float] | None = None
    threshold: float | None = None
    baseline: float | None = None
    num_draft_tokens: int | None = None
    message: str = ""
    severity: str | None = None

    @property
    def firing(self) -> bool:
        """True when this rule fires."""
        return self.status == FIRING

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (NaN -> None, ci as a list)."""
        d = asdict(self)
        d["ci"] = list(self.ci) if self.ci else None
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "RuleResult":
        """Inverse of :meth:`to_dict`."""
        d = dict(d)
        d["ci"] = tuple(d["ci"]) if d.get("ci") else None
        return cls(**d)


#: the rule of a production window whose traffic does not look like the held-out set (monitoring.production.rules)
REPRESENTATIVENESS = "representativeness"

def _num(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def _ci(pair: list[float] | None) -> tuple[float, float] | None:
    if not pair or len(pair) < 2:
        return None
    lo, hi = _num(pair[0]), _num(pair[1])
    return (lo, hi) if lo is not None and hi is not None else None


def _fmt(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _fmt_ci(ci: tuple[float, float] | None) -> str:
    return f" (95% CI {ci[0]:.3f}-{ci[1]:.3f})" if ci else ""


def _judged(g: GroupMetrics, estimator: str) -> tuple[str, str, float | None, tuple[float, float] | None, str]:
    """(metric field, label, value, CI, beside) of ``estimator``'s metric on ``g``; ``beside`` is the other
    metric, always shown with it: the per-token acceptance beside the acceptance rate, and the acceptance
    rate at k beside the per-token acceptance."""
    policy = AcceptancePolicy(estimator=estimator)
    value, ci = policy.judged(g)
    return policy.metric, policy.metric_label, value, ci, _beside(g, estimator)


def _beside(g: GroupMetrics, estimator: str) -> str:
    """``; per-token acceptance 0.562 (95% CI 0.506-0.634)`` (pooled) or ``; acceptance rate 0.296 at k=4``."""
    if estimator == "pooled":
        alpha, ci = AcceptancePolicy(estimator="per_token").judged(g)
        return f"; per-token acceptance {alpha:.3f}{_fmt_ci(ci)}" if alpha is not None else ""
    rate, k = _num(g.acceptance_rate), g.num_speculative_tokens
    return f"; acceptance rate {rate:.3f} at k={k or '?'}" if rate is not None else ""


def _smaller_k(rule: str, g: GroupMetrics, policy: AcceptancePolicy, limit: float) -> str:
    """``; at smaller k: 0.61 at k = 1, ...`` for a floor judged on the acceptance rate at k (from the
    per-position acceptance, :func:`specdec.policy.rates_by_k`), else ``""``."""
    if rule != "absolute" or policy.estimator != "pooled" or not g.num_speculative_tokens:
        return ""
    rates = rates_by_k(g.per_position_acceptance or [])
    note = below_floor_note(rates, int(g.num_speculative_tokens), Floor(limit, "")) if len(rates) > 1 else None
    return "; at smaller k:" + note.split("; at smaller k:", 1)[1] if note else ""


#: RuleResult status of each verdict word (:func:`specdec.policy.judge`)
_STATUS = {PASSED: OK, FAILED: FIRING, INCONCLUSIVE: INSUFFICIENT}


def _below(rule: str, scope: str, g: GroupMetrics, *, limit: float, min_tokens: int, baseline: float | None,
           what: str, policy: AcceptancePolicy = AcceptancePolicy(), sides: tuple[str, str] | None = None,
           source: str = "") -> RuleResult:
    """Shared logic: is the judged acceptance (``policy.estimator``) of ``g`` below ``limit``? The verdict is
    :func:`specdec.policy.judge` with ``sides`` (fail side, pass side; default the policy's alert and gate
    sides), mapped to a rule status (failed: firing, inconclusive: insufficient_evidence)."""
    fail_side, pass_side = sides or (policy.alert_side, policy.gate_side)
    metric, name, value, ci, beside = _judged(g, policy.estimator)
    n = int(g.num_draft_tokens or 0)
    base = dict(rule=rule, scope=scope, metric=metric, value=value, ci=ci,
                threshold=limit, baseline=baseline, num_draft_tokens=n)
    label = "overall" if scope == OVERALL else f"category {scope!r}"
    k = g.num_speculative_tokens
    at = f" at k={k}" if policy.estimator == "pooled" and k else ""
    lim = f"{what} {limit:.3f}" + (f" ({source})" if source else "")
    if value is None or n == 0:
        return RuleResult(status=INSUFFICIENT, message=f"{label}: nothing drafted, {name} unmeasured", **base)
    shown = f"{name} {value:.3f}{_fmt_ci(ci)}{at}"
    if n < min_tokens:
        return RuleResult(status=INSUFFICIENT, **base, message=(
            f"{label}: {shown} on only {n} draft tokens (< {min_tokens} needed): not enough evidence (vs {lim}){beside}"))
    word = judge(value, ci, limit, fail_side=fail_side, pass_side=pass_side)
    if word == FAILED:
        where = "" if fail_side == "point" else f", CI {fail_side} end below it"
        return RuleResult(status=FIRING, **base, message=(
            f"{label}: {shown} < {lim}{where}{beside}{_smaller_k(rule, g, policy, limit)}"))
    if word == PASSED:
        return RuleResult(status=OK, **base, message=f"{label}: {shown} >= {lim}{beside}")
    why = f"CI too wide: no alert yet (its {pass_side} end is below it)" if ci is not None else "no CI available: no alert yet"
    return RuleResult(status=INSUFFICIENT, **base, message=f"{label}: {shown} vs {lim}: inconclusive, {why}{beside}")


def absolute_rules(current: GroupMetrics, categories: Mapping[str, GroupMetrics],
                   settings: RuleSettings, *, acceptance_rule: str | None = None) -> list[RuleResult]:
    """The floor overall and for each category of the current run, judged on the policy's metric (the
    acceptance rate at the validated k by default), naming the floor and where it came from, the acceptance rule
    it judged (``acceptance_rule``, the pair's served rule: its counters were decoded or replayed under it) and
    both rules' teacher-forced rates beside it (:func:`rule_note`)."""
    policy = settings.policy
    out = [_below("absolute", OVERALL, current, limit=settings.threshold_for(None),
                  min_tokens=policy.min_draft_tokens, baseline=None, policy=policy,
                  what="floor", source=policy.floor_source)]
    for name in sorted(categories):
        source = "category threshold" if name in settings.category_thresholds else policy.floor_source
        out.append(_below("absolute", name, categories[name], limit=settings.threshold_for(name),
                          min_tokens=settings.min_category_draft_tokens, baseline=None, what="floor",
                          source=source, policy=policy))
    for r, g in zip(out, [current, *(categories[n] for n in sorted(categories))]):
        r.message += rule_note(g, acceptance_rule)
    return out


#: how each acceptance rule is written in a verdict (docs/metrics.md "Two acceptance rules")
RULE_LABELS = {"exact": "exact rule Σmin(p,q)", "argmax": "argmax rule p(argmax q)"}


def rule_note(g: GroupMetrics, served: str | None) -> str:
    """``; judged under the argmax rule p(argmax q) (served); exact rule Σmin(p,q) 0.712 beside it (teacher-forced,
    per token)`` for a run that names its served rule (``exact`` | ``argmax``), with the other rule's teacher-forced
    rate where measured; ``""`` when the run names no rule (rows recorded before both rules were measured)."""
    if served not in RULE_LABELS:
        return ""
    other = "argmax" if served == "exact" else "exact"
    own, theirs = _num(getattr(g, f"{served}_rule_acceptance")), _num(getattr(g, f"{other}_rule_acceptance"))
    note = f"; judged under the {RULE_LABELS[served]} (served)"
    if theirs is None:
        return note + f"; {RULE_LABELS[other]} not measured"
    own_txt = f" (served rule {own:.3f})" if own is not None else ""
    return note + f"; {RULE_LABELS[other]} {theirs:.3f} beside it (teacher-forced, per token{own_txt})"


def _comparable(current: GroupMetrics, baseline: GroupMetrics, estimator: str = "pooled") -> str | None:
    """Why ``current`` cannot be compared with ``baseline`` (None: it can). The acceptance rate and
    drafted tokens per step depend on k; the per-token acceptance does not (``estimator="per_token"``)."""
    k_cur, k_base = current.num_speculative_tokens, baseline.num_speculative_tokens
    if estimator == "pooled" and k_cur and k_base and k_cur != k_base:
        return f"baseline used k={k_base}, current k={k_cur}: not comparable"
    return None


def relative_rule(current: GroupMetrics, baseline: GroupMetrics | None, settings: RuleSettings) -> RuleResult:
    """The per-token acceptance (:data:`specdec.policy.TREND_ESTIMATOR`, the same at every k, whatever the
    floor's estimator) dropped more than ``relative_drop`` against the baseline: failed when its CI upper
    end is below the limit, passed when its point estimate is at or above it (:func:`specdec.policy.judge`);
    a baseline validated at another k still compares, so a k change alone is not drift."""
    est = TREND_ESTIMATOR
    metric, _name, value, _ci_, _b = _judged(current, est)
    base_value = _judged(baseline, est)[2] if baseline is not None else None
    if baseline is None or base_value is None:
        return RuleResult("relative", OVERALL, NOT_APPLICABLE, metric, value=value, message="no passing baseline run")
    reason = _comparable(current, baseline, est)
    if reason:
        return RuleResult("relative", OVERALL, NOT_APPLICABLE, metric, value=value, baseline=base_value, message=reason)
    limit = base_value * (1.0 - settings.relative_drop)
    what = f"{1 - settings.relative_drop:.0%} of baseline {base_value:.3f} ="
    return _below("relative", OVERALL, current, limit=limit, min_tokens=settings.policy.min_draft_tokens,
                  baseline=base_value, what=what, policy=AcceptancePolicy(estimator=est), sides=("upper", "point"))


def collapse_rule(current: GroupMetrics, baseline: GroupMetrics | None, settings: RuleSettings) -> RuleResult:
    """``draft_tokens_per_step`` fell by more than ``collapse_drop`` against the baseline."""
    value, steps = _num(current.draft_tokens_per_step), int(current.num_drafts or 0)
    base_value = _num(baseline.draft_tokens_per_step) if baseline is not None else None
    common = dict(rule="collapse", scope=OVERALL, metric="draft_tokens_per_step", value=value,
                  baseline=base_value, num_draft_tokens=int(current.num_draft_tokens or 0))
    if base_value is None or base_value <= 0:
        return RuleResult(status=NOT_APPLICABLE, message="no passing baseline run", **common)
    reason = _comparable(current, baseline)
    if reason:
        return RuleResult(status=NOT_APPLICABLE, message=reason, **common)
    limit = base_value * (1.0 - settings.collapse_drop)
    common["threshold"] = limit
    if value is None or steps < settings.min_drafts:
        return RuleResult(status=INSUFFICIENT, **common, message=(
            f"only {steps} verification steps (< {settings.min_drafts}): drafting rate unmeasured"))
    if value < limit:
        return RuleResult(status=FIRING, **common, message=(
            f"drafter collapse: {value:.2f} draft tokens per step vs {base_value:.2f} at baseline "
            f"(limit {limit:.2f})"))
    return RuleResult(status=OK, **common, message=(
        f"{value:.2f} draft tokens per step (baseline {base_value:.2f})"))


#: a night whose mean output length (tokens per prompt) is outside this ratio of its baseline's is read as an output
#: length change, not drift: mean accepted length and acceptance depend on how long the outputs run (an SGLang gate
#: failed at 5.31 against 6.6 only because the same prompt stopped at 775 tokens instead of 2048)
OUTPUT_LENGTH_BAND = (0.8, 1.25)


def mean_output_tokens(g: GroupMetrics) -> float | None:
    """Tokens emitted per validated prompt (``num_emitted_tokens / num_prompts``), None where not counted (a
    production window, an expected-value replay)."""
    n, emitted = int(g.num_prompts or 0), _num(float(g.num_emitted_tokens or 0))
    return emitted / n if n > 0 and emitted else None


def output_length_note(current: GroupMetrics, baseline: GroupMetrics | None) -> str | None:
    """``outputs 62% shorter than the baseline's (12.1 against 31.9 tokens per prompt)`` when the ratio of the
    mean output lengths is outside :data:`OUTPUT_LENGTH_BAND`, else None (also without a baseline or a count)."""
    cur = mean_output_tokens(current)
    base = mean_output_tokens(baseline) if baseline is not None else None
    if cur is None or base is None:
        return None
    ratio = cur / base
    if OUTPUT_LENGTH_BAND[0] <= ratio <= OUTPUT_LENGTH_BAND[1]:
        return None
    how = f"{1 - ratio:.0%} shorter" if ratio < 1 else f"{ratio - 1:.0%} longer"
    return f"outputs {how} than the baseline's ({cur:.1f} against {base:.1f} tokens per prompt)"


def not_drift(r: RuleResult, length_note: str | None) -> RuleResult:
    """A drift rule's result (relative, collapse) on a night whose output length changed (``length_note``): one that
    fires becomes ``insufficient_evidence`` saying the change is the output length, not drift (so the night is
    inconclusive: no alert, no resolution); any other names the change. Unchanged without a note."""
    if length_note is None:
        return r
    why = "acceptance depends on output length; pin max_new_tokens (and ignore_eos) to compare"
    if r.firing:
        r.status = INSUFFICIENT
        r.message = f"not judged as drift: {length_note}: {why} (the rule alone says: {r.message})"
    else:
        r.message += f"; {length_note}"
    return r


def measurement_rule(current: GroupMetrics, acceptance_rule: str | None = None) -> RuleResult:
    """The teacher-forced α of the served ``acceptance_rule`` (``alpha_tf`` = Σ min(p, q) for the exact rule and
    older runs, ``argmax_rule_acceptance`` = p(argmax q) for the argmax rule:
    :meth:`~specdec.validation.report.GroupMetrics.teacher_forced_alpha`) and ``alpha_hat`` (the decoded α, counted
    under that rule) disagree: their 95% CIs do not overlap."""
    name, tf_value, tf_pair = current.teacher_forced_alpha(acceptance_rule)
    tf, tf_ci = _num(tf_value), _ci(tf_pair)
    hat, hat_ci = _num(current.alpha_hat), _ci(current.alpha_hat_ci)
    common = dict(rule="measurement", scope=OVERALL, metric=name, value=tf, ci=tf_ci,
                  baseline=None, num_draft_tokens=int(current.num_draft_tokens or 0))
    if tf_ci is None or hat_ci is None or hat is None:
        return RuleResult(status=NOT_APPLICABLE, message=f"{name} or alpha_hat CI not measured", **common)
    common["threshold"] = hat
    if tf_ci[1] < hat_ci[0] or hat_ci[1] < tf_ci[0]:
        return RuleResult(status=FIRING, **common, message=(
            f"measurement disagreement: {name} {tf:.3f}{_fmt_ci(tf_ci)} vs decoding alpha_hat "
            f"{hat:.3f}{_fmt_ci(hat_ci)}; check the validation harness before trusting the numbers"))
    return RuleResult(status=OK, **common, message=(
        f"{name} {tf:.3f}{_fmt_ci(tf_ci)} consistent with alpha_hat {hat:.3f}{_fmt_ci(hat_ci)}"))


def replay_rule(current: GroupMetrics) -> RuleResult:
    """Measurement health of a replay (``--method both``): decoded prompts whose counters differ from
    their replay for a reason rounding cannot explain (``replay_beyond_numerics`` > 0: a flip at a draft
    logit margin above the pair precision's numerics bound, or a counter difference with no flip at all).

    Near-ties (flips within :data:`specdec.validation.replay_curve.NUMERICS_MARGIN`) never fire it: with a
    bf16 draft, replay and decoding round differently by design (docs/metrics.md, "Replay").
    """
    n = getattr(current, "replay_beyond_numerics", None)
    agree = _num(getattr(current, "replay_decode_agreement", None))
    common = dict(rule="measurement", scope="replay", metric="replay_decode_agreement", value=agree, threshold=0.0,
                  num_draft_tokens=int(current.num_draft_tokens or 0))
    if n is None:
        return RuleResult(status=NOT_APPLICABLE, message="no replay/decode comparison in this run", **common)
    if n > 0:
        return RuleResult(status=FIRING, **common, message=(
            f"replay and decoding disagree beyond numerics on {n} prompt(s) (agreement {_fmt(agree)}): a "
            "bookkeeping or measurement error; see the report's replay.disagreements before trusting either"))
    return RuleResult(status=OK, **common, message=(
        f"replay/decode agreement {_fmt(agree)}; every difference is a near-tie within numerics"))


# --------------------------------------------------------------------------- speed
# "Speculation no longer pays": speculative decoding is only worth serving while it is faster than
# target-only decoding. The validation measures both on the same prompts, paired per prompt
# (specdec.validation.speed), with a bootstrap 95% CI of the pooled speedup; the rule fires when the
# CI's upper end is below RuleSettings.speed_threshold (1.0) with >= speed_min_prompts prompts, or
# when the speedup is below the threshold and its CI lies entirely below the baseline run's CI (a
# credible fall, e.g. 1.42x [1.20, 1.50] -> 0.73x [0.61, 1.03] on six prompts).
# Timings depend on the machine as much as on the pair: a run whose mean 1-minute load per CPU
# exceeded speed_max_load_per_cpu and whose speedup (or its CI's lower end) is below the threshold is
# speed-inconclusive (status "inconclusive"): stored and shown, never alerted on, and it makes the
# verdict inconclusive (it neither fires nor resolves). A clear gain measured under load still counts.
# A speedup the validation flagged "timing suspect" (measured/predicted outside
# specdec.validation.speed.TIMING_BAND, after re-timing its slow prompts once) is inconclusive only
# while its CI still reaches 1.0x: a credible slowdown (CI upper end below 1.0x, measured with
# interleaved pairs) fires whatever the speed model predicted, and the message gives both numbers
# and says the verdict used the measured one. Each inconclusive message names its real reason
# (machine overloaded, or a disagreement with the speed model).
SPEED_RULE = "speed"
#: status of a speed measurement taken on an overloaded machine (never alerts)
SPEED_INCONCLUSIVE = "inconclusive"


def load_per_cpu(g: GroupMetrics) -> float | None:
    """Mean 1-minute load average per usable CPU during the run's timings, or ``None``."""
    load, cpus = _num(getattr(g, "load_avg_1m", None)), int(getattr(g, "num_cpus", 0) or 0)
    return load / cpus if load is not None and cpus > 0 else None


def _model_gap(g: GroupMetrics) -> str:
    """``disagrees with the speed model's 0.66x (measured/predicted 0.76, outside 0.80-1.25; 6 prompt(s)
    re-timed)``: both numbers of a timing-suspect run."""
    from specdec.validation.speed import TIMING_BAND

    pred, ratio = _num(getattr(g, "predicted_speedup", None)), _num(getattr(g, "measured_over_predicted", None))
    n = int(getattr(g, "num_remeasured", 0) or 0)
    return (f"disagrees with the speed model's {'?' if pred is None else f'{pred:.2f}x'} (measured/predicted "
            f"{'?' if ratio is None else f'{ratio:.2f}'}, outside {TIMING_BAND[0]:.2f}-{TIMING_BAND[1]:.2f}; "
            f"{n} prompt(s) re-timed)")


def _credibly_below_baseline(ci: tuple[float, float], baseline: GroupMetrics | None) -> str | None:
    """``"1.42x (95% CI 1.20-1.50x)"`` when the current speedup CI ``ci`` lies entirely below the
    baseline run's CI (both paired and interleaved measurements), else None."""
    raw = list(getattr(baseline, "speedup_ci", None) or []) if baseline is not None else []
    lo, hi, sp = (_num(raw[0]), _num(raw[1]), _num(baseline.speedup)) if len(raw) == 2 else (None, None, None)
    if lo is None or hi is None or sp is None or not ci[1] < lo:
        return None
    return f"{sp:.2f}x (95% CI {lo:.2f}-{hi:.2f}x)"


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
    unfavourable = value < settings.speed_threshold or (ci is not None and ci[0] < settings.speed_threshold)
    if lpc is not None and lpc > settings.speed_max_load_per_cpu and unfavourable:
        return RuleResult(status=SPEED_INCONCLUSIVE, **common, message=(
            f"speed-inconclusive: {shown} taken at load {current.load_avg_1m:.2f} on {current.num_cpus} CPUs "
            f"({lpc:.2f}/CPU > {settings.speed_max_load_per_cpu:.2f}): machine overloaded, no speed alert"))
    suspect = getattr(current, "timing_suspect", None) is True
    credible_slowdown = ci is not None and ci[1] < settings.speed_threshold
    if suspect and unfavourable and not credible_slowdown:
        return RuleResult(status=SPEED_INCONCLUSIVE, **common, message=(
            f"speed-inconclusive: {shown} {_model_gap(current)}; the CI reaches {settings.speed_threshold:.2f}x, so "
            "the timing, not the pair, may be in doubt; no speed alert"))
    n = int(current.num_prompts or 0)
    if n < settings.speed_min_prompts or ci is None:
        return RuleResult(status=INSUFFICIENT, **common, message=(
            f"{shown} on {n} prompts (< {settings.speed_min_prompts} needed or no CI): not enough evidence"))
    if value < settings.speed_threshold <= ci[1]:
        fell = _credibly_below_baseline(ci, baseline)
        if fell:
            return RuleResult(status=FIRING, **common, message=(
                f"speculation no longer pays: {shown}, below {settings.speed_threshold:.2f}x and credibly below the "
                f"baseline's {fell} (the CIs do not overlap), although its CI still reaches {settings.speed_threshold:.2f}x"))
        return RuleResult(status=INSUFFICIENT, **common, message=(
            f"{shown} below {settings.speed_threshold:.2f}x, but the CI reaches above it: no speed alert yet"))
    if ci[1] < settings.speed_threshold:
        was = f" (was {base:.2f}x at baseline)" if base is not None else ""
        gap = f"; {_model_gap(current)}, the verdict uses the measured speedup" if suspect else ""
        return RuleResult(status=FIRING, **common, message=(
            f"speculation no longer pays: {shown}{was}, CI entirely below {settings.speed_threshold:.2f}x: "
            f"serving target-only would be faster{gap}"))
    return RuleResult(status=OK, **common, message=f"{shown}: speculation pays or is not credibly slower")


def evaluate(current, baseline, settings: RuleSettings) -> list[RuleResult]:
    """Run every rule.

    Args:
        current: the run under test, a :class:`monitoring.history.RunSnapshot` or anything with
            ``overall: GroupMetrics`` and ``categories: dict[str, GroupMetrics]`` (a
            :class:`specdec.validation.report.ValidationReport` works).
        baseline: the last passing run of the champion (same shape), or ``None``.
        settings: thresholds and the acceptance policy (the caller's section: no settings are read here).
    Returns:
        Results in a fixed order: absolute overall, absolute per category (sorted), relative,
        collapse, measurement, measurement (replay), speed; each with its ``severity``.
    """
    base = baseline.overall if baseline is not None else None
    out = absolute_rules(current.overall, current.categories, settings,
                         acceptance_rule=getattr(current, "acceptance_rule", None))
    length = output_length_note(current.overall, base)
    out += [not_drift(r, length) for r in (relative_rule(current.overall, base, settings),
                                           collapse_rule(current.overall, base, settings))]
    out.append(measurement_rule(current.overall, getattr(current, "acceptance_rule", None)))
    out.append(replay_rule(current.overall))
    for r in out:
        r.severity = "warning" if r.rule == "measurement" else settings.acceptance_severity
    out.append(speed_rule(current.overall, base, settings))
    return out


SEVERITY_ORDER = ("info", "warning", "critical")


def severity_of(results: Iterable[RuleResult]) -> str | None:
    """The highest severity among the firing results (``None`` when none fires)."""
    sev = [r.severity or "critical" for r in results if r.firing]
    return max(sev, key=lambda s: SEVERITY_ORDER.index(s) if s in SEVERITY_ORDER else len(SEVERITY_ORDER)) if sev else None


PASSED_VERDICT, FAILED_VERDICT, INCONCLUSIVE_VERDICT = PASSED, FAILED, INCONCLUSIVE


#: the promotion gate's criteria beyond acceptance (exactness, config, evidence), judged with the rules in
#: the nightly (:func:`gate_result`) so that a run has one verdict word
GATE_RULE = "gate"


def gate_result(word: str, reasons: list[str], severity: str = "critical") -> RuleResult:
    """A :class:`RuleResult` (rule ``gate``) of the gate's verdict ``word`` beyond acceptance and its
    ``reasons`` (:meth:`registry.gate.GateResult.beyond_acceptance`, handed over as plain data)."""
    status = {FAILED: FIRING, INCONCLUSIVE: INSUFFICIENT}.get(word, OK)
    text = "; ".join(reasons) or "exactness, config and evidence criteria hold"
    return RuleResult(rule=GATE_RULE, scope=OVERALL, status=status, metric="gate", message=text,
                      severity=severity if status == FIRING else None)


def rule_verdict(r: RuleResult) -> str:
    """One rule's verdict word (:data:`specdec.policy.VERDICTS`): firing -> ``failed``; an overall
    floor or relative rule lacking evidence, or a speed timed on an overloaded machine -> ``inconclusive``;
    anything else (ok, not applicable, a small category lacking evidence) -> ``passed``."""
    if r.firing:
        return FAILED
    if r.status == INSUFFICIENT and r.scope == OVERALL and r.rule in ("absolute", "relative", GATE_RULE):
        return INCONCLUSIVE
    if r.rule == SPEED_RULE and r.status == SPEED_INCONCLUSIVE:
        return INCONCLUSIVE
    return PASSED


def verdict(results: Iterable[RuleResult]) -> str:
    """The run's one verdict word: :func:`specdec.policy.combine` of :func:`rule_verdict` of each result
    (``failed`` if any rule fires; ``inconclusive`` if the overall floor or the relative rule lacks
    evidence or its CI straddles the limit, or the speed was timed on an overloaded machine, so such a
    night neither alerts nor resolves an open incident; else ``passed``)."""
    return combine(rule_verdict(r) for r in results)


@dataclass
class Evaluation:
    """The rule outcome of one history row, whatever its source (nightly run, production window, engine check).

    Attributes:
        run_id: history row. verdict: ``passed`` | ``failed`` | ``inconclusive`` (also the row's new
            status). results: the rules the verdict was judged on (a production window: its health rules).
        root_cause_hint: one line. baseline_run_id / baseline_label: the baseline used, if any.
        representativeness / nightly_run_id / nightly_label: a production window only: the comparison with
            the nightly run of the served pair version (its own incident), and that run.
    """

    run_id: int
    verdict: str
    results: list[RuleResult]
    root_cause_hint: str
    baseline_run_id: int | None = None
    baseline_label: str | None = None
    representativeness: RuleResult | None = None
    nightly_run_id: int | None = None
    nightly_label: str | None = None

    @property
    def firing(self) -> list[RuleResult]:
        """The rules that fire (of :attr:`results`)."""
        return [r for r in self.results if r.firing]


def speed_only_inconclusive(rule_results: list[dict] | None) -> bool:
    """Stored rule results (``RuleResult.to_dict()``) of an ``inconclusive`` night whose acceptance
    passed and whose only doubt is a speed timed on a busy machine: such a night is a valid
    acceptance baseline (otherwise every later alert would say "no passing baseline run")."""
    res = list(rule_results or [])
    doubtful = any(r.get("status") == FIRING or (r.get("status") == INSUFFICIENT and r.get("scope") == OVERALL
                                                 and r.get("rule") in ("absolute", "relative", GATE_RULE)) for r in res)
    return not doubtful and any(r.get("rule") == SPEED_RULE and r.get("status") == SPEED_INCONCLUSIVE for r in res)


def _head_label(ref: str | None) -> str:
    """``models:/t-eagle3/3`` -> ``head v3 (models:/t-eagle3/3)``; other references as they are."""
    m = re.match(r"^models:/[^/@]+/(\d+)$", ref or "")
    return f"head v{m.group(1)} ({ref})" if m else f"head {ref}" if ref else "its last head version"


def _adapter_changed(current, baseline) -> str | None:
    """The name of the target's LoRA adapter when it differs from the baseline's (added, removed or new weights;
    ``None`` on both sides: no adapter), else None. Lineage without the adapter fields counts as no adapter."""
    now = (getattr(current, "target_adapter", None), getattr(current, "target_adapter_hash", None))
    then = (getattr(baseline, "target_adapter", None), getattr(baseline, "target_adapter_hash", None))
    if now[1] == then[1]:
        return None
    return now[0] or then[0] or "of the target"


def root_cause_hint(current, baseline, *, drafter_kind: str | None = None, drafter_ref: str | None = None) -> str:
    """A one-line likely cause from lineage facts (plain data: :class:`monitoring.history.Lineage`).

    Compares the current run's target hash, draft hash, held-out version and code version with
    those of the baseline (the last passing run). ``None`` hashes count as unknown, not changed. A target LoRA
    adapter whose weights hash differs while base and draft did not is named (``adapter support-v3 changed; draft
    shared, unchanged``).
    For an EAGLE-3 head (``drafter_kind="eagle3"``, ``drafter_ref`` its version) whose target changed
    under it, the remedy named is a warm-start re-training from that head (``flows.realign``).
    """
    from specdec.kinds import kind_of

    if baseline is None:
        return "no passing baseline run to compare with: the cause cannot be narrowed down"

    def changed(a, b) -> bool:
        return a is not None and b is not None and a != b

    t = changed(current.target_hash, baseline.target_hash)
    d = changed(current.draft_hash, baseline.draft_hash)
    h = changed(current.heldout_version, baseline.heldout_version)
    c = changed(current.code_version, baseline.code_version)
    a = _adapter_changed(current, baseline)
    if a and not t and not d:
        hint = (f"adapter {a} changed; draft shared, unchanged: the adapted target moved away from the draft "
                "(re-derive the draft from base + adapter, or train a draft adapter)")
    elif t and d:
        hint = "both target and draft changed since the last passing run: re-validate the new pair, " \
               "re-derive or retrain the draft from the new target"
    elif t and drafter_kind and kind_of(drafter_kind).retrainable:
        hint = f"target changed since the head was trained: re-train from {_head_label(drafter_ref)}"
    elif t:
        hint = "target changed since the last passing run, draft unchanged: re-derive or retrain the draft"
    elif d:
        hint = "draft changed since the last passing run, target unchanged: the new draft is worse; " \
               "roll it back or retrain it"
    elif h:
        return (f"held-out set changed since the last passing run ({baseline.heldout_version} -> "
                f"{current.heldout_version}), pair unchanged: compare on the same held-out version")
    else:
        hint = "nothing changed in the pair or held-out set: the environment or code changed"
        if c:
            hint += f" (code {baseline.code_version} -> {current.code_version})"
        return hint
    if h:
        hint += f"; the held-out set also changed ({baseline.heldout_version} -> {current.heldout_version})"
    return hint


def change_since_baseline(results: Iterable[RuleResult]) -> str | None:
    """``"Since baseline: acceptance 0.962 -> 0.231, speedup 1.21x -> 0.62x"`` from the relative
    and speed rule results (each carries the baseline value and the current one); ``None`` when
    neither has a baseline."""
    results = list(results)
    parts = []
    rel = next((r for r in results if r.rule == "relative" and r.scope == "overall"), None)
    if rel is not None and rel.baseline is not None and rel.value is not None:
        name = "per-token acceptance" if rel.metric == "per_token_acceptance" else "acceptance"
        parts.append(f"{name} {rel.baseline:.3f} -> {rel.value:.3f}")
    sp = next((r for r in results if r.rule == "speed"), None)
    if sp is not None and sp.baseline is not None and sp.value is not None:
        parts.append(f"speedup {sp.baseline:.2f}x -> {sp.value:.2f}x")
    return "Since baseline: " + ", ".join(parts) if parts else None


def rederive(stored: list[dict] | None, current, baseline_overall: GroupMetrics | None,
             settings: RuleSettings) -> tuple[str, list[RuleResult]]:
    """A stored run's verdict re-derived under ``settings`` (migration ``0008``, when the floor's default
    estimator changed): the floor (``absolute``, overall and per category, each at the threshold its stored
    result used, else ``settings``') and the relative rule (against ``baseline_overall``, None when the run
    had no baseline) are judged again from the stored numbers; every other stored result (collapse,
    measurement, speed, gate) is kept as it was.

    Args:
        stored: the row's ``rule_results`` (:meth:`RuleResult.to_dict` dicts).
        current: anything with ``overall`` / ``categories`` :class:`GroupMetrics` (a RunSnapshot).
    Returns:
        (verdict word, every result in :func:`evaluate`'s order).
    """
    old = [RuleResult.from_dict(d) for d in stored or []]
    limits = {r.scope: r.threshold for r in old if r.rule == "absolute" and r.threshold is not None}
    policy = settings.policy
    floor = limits.get(OVERALL, policy.threshold)
    cats = {name: t for name, t in limits.items() if name != OVERALL and t != floor}
    source = policy.floor_source if floor == policy.threshold else "the run's stored floor"
    s = settings.for_floor(Floor(floor, source)).model_copy(
        update={"category_thresholds": {**settings.category_thresholds, **cats}})
    severity = {r.rule: r.severity for r in old}
    new = absolute_rules(current.overall, current.categories, s, acceptance_rule=getattr(current, "acceptance_rule", None))
    new.append(relative_rule(current.overall, baseline_overall, s))
    for r in new:
        r.severity = severity.get(r.rule) or settings.acceptance_severity
    kept = [r for r in old if r.rule not in ("absolute", "relative")]
    results = new + kept
    return verdict(results), results
