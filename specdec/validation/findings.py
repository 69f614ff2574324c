"""Plain-language findings for the validation summary and the report's ``notes``."""

from __future__ import annotations

import math
from typing import Any

from specdec.kinds import kind_of
from specdec.validation.machine import OVERLOADED_LOAD_PER_CPU
from specdec.validation.report import ValidationReport
from specdec.validation.speed import PAYS_ABOVE

__all__ = ["findings", "SLOWER_NOTE", "SUSPECT_NOTE", "LOADED_NOTE", "overloaded", "timing_suspect_note",
           "candidate_finding", "recommendation_summary", "NOT_CHEAPER"]

#: a derived draft whose cost ratio c is at least this is "not cheaper than the target" (recommend's findings)
NOT_CHEAPER = 0.9


SLOWER_NOTE = (
    "speculative decoding is SLOWER than target-only for this pair on this device: "
    "measured speedup {speedup:.2f}x, predicted {pred:.2f}x at k={k} (best k={best_k}: {best:.2f}x, {basis}); "
    "draft/target cost per pass c={c:.2f}, verification pass / one-token target pass v(k)={v:.2f}"
)
SUSPECT_NOTE = (
    "timing suspect: measured {speedup:.2f}x (pooled over the prompts) is {r:.2f} of the predicted {pred:.2f}x (outside {lo}-{hi}; load avg "
    "{load:.1f} on {cpus} CPUs, {remeasured} prompt(s) re-timed): the measured speedup is not a finding; re-run on "
    "an idle machine"
)


LOADED_NOTE = (
    "speed inconclusive: measured {speedup:.2f}x on a loaded machine (load {lpc:.2f} per CPU > {bound:.2f} during "
    "the timings): whether speculation is slower here is not a finding; re-run on an idle machine"
)


def overloaded(g) -> float | None:
    """The load per CPU during a group's timings when above :data:`OVERLOADED_LOAD_PER_CPU` (the nightly's
    speed-inconclusive bound, ``monitoring.rules.speed_rule``), else None."""
    load, cpus = g.load_avg_1m, int(g.num_cpus or 0)
    if load is None or math.isnan(load) or cpus <= 0:
        return None
    return load / cpus if load / cpus > OVERLOADED_LOAD_PER_CPU else None


def timing_suspect_note(g) -> str | None:
    """The 'timing suspect' line for a group whose measured/predicted is outside the band, else None."""
    from specdec.validation.speed import TIMING_BAND

    if not g.timing_suspect:
        return None
    return SUSPECT_NOTE.format(speedup=g.speedup_pooled, r=g.measured_over_predicted, pred=g.predicted_speedup,
                               lo=TIMING_BAND[0], hi=TIMING_BAND[1], load=g.load_avg_1m_max, cpus=g.num_cpus,
                               remeasured=g.num_remeasured)


def format_ci(ci: list[float]) -> str:
    """``[low, high]`` with three decimals."""
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]"


def findings(r: ValidationReport) -> list[str]:
    """Plain-language findings for the summary and the report."""
    g = r.overall
    notes: list[str] = []
    if g.num_prompts == 0:
        notes.append("no prompt ran: every prompt was skipped (see prompts.csv skip_reason)")
        return notes
    if g.num_skipped:
        notes.append(f"{g.num_skipped} prompt(s) skipped (empty or too long); see prompts.csv")
    suspect = timing_suspect_note(g)
    if suspect:
        notes.append(suspect)
    slow_measured = not suspect and not math.isnan(g.speedup) and g.speedup < 1
    slow_pred = not math.isnan(g.predicted_speedup_at_recommended) and g.predicted_speedup_at_recommended < 1
    loaded = overloaded(g)
    if (slow_measured or slow_pred) and loaded is not None:  # the nightly's rule: not a fact on a loaded machine
        notes.append(LOADED_NOTE.format(speedup=g.speedup, lpc=loaded, bound=OVERLOADED_LOAD_PER_CPU))
    elif slow_measured or slow_pred:
        notes.append(
            SLOWER_NOTE.format(
                speedup=g.speedup,
                pred=g.predicted_speedup,
                k=g.num_speculative_tokens,
                best_k=g.recommended_num_speculative_tokens,
                best=g.predicted_speedup_at_recommended,
                basis=g.recommended_k_basis,
                c=g.predicted_cost_ratio,
                v=g.verify_cost_by_n[g.num_speculative_tokens] if len(g.verify_cost_by_n) > g.num_speculative_tokens
                else math.nan,
            )
        )
    tf_name, tf, tf_ci = g.teacher_forced_alpha(r.acceptance_rule)  # the rule the decoded α̂ was counted under
    if all(not math.isnan(x) for x in (*g.alpha_hat_ci, *tf_ci)) and (
        g.alpha_hat_ci[1] < tf_ci[0] or tf_ci[1] < g.alpha_hat_ci[0]
    ):
        notes.append(
            f"alpha_hat {g.alpha_hat:.3f} {format_ci(g.alpha_hat_ci)} and {tf_name} {tf:.3f} "
            f"{format_ci(tf_ci)} disagree beyond their 95% CIs: acceptance is not i.i.d. along the "
            "sequence (expected for n-gram copy runs, see docs/metrics.md) or the pair/decoding is off"
        )
    kind_note = kind_of(r.drafter_kind).finding(g)
    if kind_note:
        notes.append(kind_note)
    if g.exactness_mismatches:
        bad = [p for p in r.prompts if p.exact_match is False]
        margins = [p.divergence_logit_margin for p in bad if p.divergence_logit_margin is not None]
        notes.append(
            f"exactness audit: {g.exactness_mismatches}/{g.exactness_checked} greedy outputs differ from "
            f"target-only; largest target logit margin at the divergence "
            f"{max(margins) if margins else float('nan'):.3g} (small = numeric near-tie, large = bug)"
        )
    return notes


def candidate_finding(c: Any) -> str | None:
    """Why a recommend candidate (:class:`specdec.validation.recommend.CandidateResult`) does not pay, or None."""
    lo, m = c.speedup_ci_low, c.measured_speedup
    if c.identical_outputs != c.compared_outputs:
        return f"{c.compared_outputs - c.identical_outputs} greedy output(s) differ from target-only (numeric near-ties?)"
    model_free = kind_of(c.kind or c.spec).model_free
    if not model_free and not math.isnan(c.cost_ratio) and c.cost_ratio >= NOT_CHEAPER:
        return f"not cheaper than the target here (c = {c.cost_ratio:.2f} of a target pass)"
    if not math.isnan(m) and m > PAYS_ABOVE and not math.isnan(lo) and lo <= PAYS_ABOVE:
        return f"faster on average but not credibly (95% CI {lo:.2f}-{c.speedup_ci[1]:.2f}x includes 1.0x)"
    if not math.isnan(m) and m <= PAYS_ABOVE:
        if model_free:
            return "too few of its lookups hit on these prompts to pay for the wider verification passes"
        return f"acceptance too low for its cost (acceptance {c.alpha:.2f} at k={c.k}, c {c.cost_ratio:.2f})"
    return None


def recommendation_summary(best: str | None, paying: list[Any], measured: list[Any], nb: dict[str, Any],
                           device: str) -> str:
    """``specdec draft recommend``'s one-line verdict: the ``best`` candidate (``paying[0]``) with its numbers, or
    why none of the ``measured`` candidates pays (``nb``: :func:`specdec.validation.machine.native_bf16`)."""
    if best is not None:
        c = paying[0]
        return (f"use {best} with k={c.k}: measured {c.measured_speedup:.2f}x (95% CI {c.speedup_ci[0]:.2f}-"
                f"{c.speedup_ci[1]:.2f}x, predicted {c.predicted_speedup:.2f}x) over target-only, "
                f"{c.identical_outputs}/{c.compared_outputs} greedy outputs identical")
    why = []
    if any(c.timing_suspect for c in measured):
        why.append("timings suspect (measured far from predicted: a busy machine?); re-run on an idle machine")
    derived = [c for c in measured if kind_of(c.kind or c.spec).derives_from_target]
    if derived and all(c.cost_ratio >= NOT_CHEAPER for c in derived if not math.isnan(c.cost_ratio)):
        why.append("no derived draft is cheaper than the target on this " + ("GPU" if "cuda" in device else "CPU"))
    if "cuda" not in device and not nb.get("native"):
        why.append(nb.get("detail", "no native bf16"))
    if not measured:
        why.append("no candidate could run here")
    return ("no candidate is credibly faster than target-only here" + (": " + "; ".join(why) if why else "")
            + ". Serve target-only, or measure a trained draft model (model:<ref>).")
