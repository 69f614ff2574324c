"""Pooling per-prompt outcomes into group metrics: sums first, then ratios; bootstrap CIs; speedup model."""

from __future__ import annotations

import math

from specdec.core.stats import DecodingStats, per_token_acceptance
from specdec.validation.metrics import AgreementSums, bootstrap_ratio_ci, proportion_ci
from specdec.validation.machine import usable_cpus
from specdec.validation.prompt_run import PromptRun
from specdec.validation.report import GroupMetrics
from specdec.validation.speed import (
    StepCounters,
    VerifyCost,
    best_k,
    bootstrap_speedup_ci,
    paired_speedup,
    pooled_speedup,
    predicted_speedup,
    timing_band,
)

__all__ = ["aggregate", "groups", "ratio", "predict", "IID_BASIS", "REPLAY_BASIS"]

IID_BASIS = "i.i.d. acceptance at alpha_hat"
REPLAY_BASIS = "replayed counters"
MAX_RECOMMENDED_K = 16


def ratio(num: float, den: float) -> float:
    """``num / den``, or nan when ``den`` is 0."""
    return num / den if den else math.nan


def aggregate(runs: list[PromptRun], k: int, *, seed: int = 0, n_resamples: int = 2000,
              verify_cost: VerifyCost | None = None, cost_ratio: float = math.nan,
              prefill: tuple = (None, None),
              acceptance: list[PromptRun] | None = None) -> GroupMetrics:
    """Pool per-prompt outcomes into one :class:`GroupMetrics` (sums first, then ratios).

    Bootstrap CIs resample the prompts that ran (status ``ok``). ``verify_cost``, ``cost_ratio`` and
    ``prefill`` (target's and draft's :class:`~specdec.validation.timing.PrefillCost`, by prompt length) are the
    driver's calibrated costs (:func:`specdec.validation.timing.calibrate`); without them the in-run c
    and the one in-run point v(k) are used and prompts are left out of the prediction (:func:`predict`).
    ``acceptance``: the runs of the measurement that gates acceptance when it is not ``runs`` (a replay on
    every prompt next to a decoded subsample): ``num_prompts``, ``num_skipped`` and the acceptance counters,
    rates and CIs come from them; agreement, speed, the prediction and the exactness audit from ``runs``.
    """
    gating = runs if acceptance is None else acceptance
    g = GroupMetrics(num_prompts=sum(r.ok for r in gating), num_speculative_tokens=k,
                     num_skipped=sum(not r.ok for r in gating))
    ci = dict(seed=seed, n_resamples=n_resamples)
    counted = [r for r in gating if r.ok and r.stats is not None]
    if counted:
        _pool_acceptance(g, _merged(counted, k), counted, ci)
    ok = [r for r in runs if r.ok and r.stats is not None]
    if not ok:
        return g
    st = _merged(ok, k)
    _pool_agreement(g, ok, ci)
    _pool_timing(g, st, ok, ci)
    predict(g, with_prompts(StepCounters.from_stats(st), ok, prefill), verify_cost, cost_ratio)
    audited = [r for r in ok if r.row.exact_match is not None]
    g.exactness_checked = len(audited)
    g.exactness_mismatches = sum(not r.row.exact_match for r in audited)
    return g


def groups(runs: list[PromptRun], k: int, *, acceptance: list[PromptRun] | None = None,
           **agg) -> tuple[GroupMetrics, dict[str, GroupMetrics]]:
    """:func:`aggregate` overall and per category (sorted; the categories of ``acceptance`` when given)."""
    cats = sorted({r.row.category for r in (runs if acceptance is None else acceptance)})
    return aggregate(runs, k, acceptance=acceptance, **agg), {
        c: aggregate([r for r in runs if r.row.category == c], k, **agg,
                     acceptance=None if acceptance is None else [r for r in acceptance if r.row.category == c])
        for c in cats}


def _merged(runs: list[PromptRun], k: int) -> DecodingStats:
    """The pooled :class:`DecodingStats` of ``runs`` (:meth:`DecodingStats.merge`)."""
    st = DecodingStats(num_speculative_tokens=k)
    for r in runs:
        st = st.merge(r.stats)
    return st


def _pool_acceptance(g: GroupMetrics, st: DecodingStats, ok: list[PromptRun], ci: dict) -> None:
    """Acceptance counters and rates of the merged stats ``st``, with bootstrap CIs over the prompts ``ok``."""
    g.num_drafts, g.num_draft_tokens, g.num_accepted_tokens = st.num_drafts, st.num_draft_tokens, st.num_accepted_tokens
    g.accepted_per_position = list(st.accepted_per_position)
    g.drafted_per_position = list(st.drafted_per_position)
    g.num_emitted_tokens = st.num_emitted_tokens
    g.acceptance_rate = st.acceptance_rate
    g.mean_accepted_length = st.mean_accepted_length
    g.per_position_acceptance = st.per_position_acceptance
    g.conditional_per_position_acceptance = st.conditional_per_position_acceptance
    g.draft_tokens_per_step = st.draft_tokens_per_step
    g.alpha_hat = st.alpha_hat
    g.acceptance_rate_ci = proportion_ci(st.num_accepted_tokens, st.num_draft_tokens, bootstrap_ratio_ci(
        [r.stats.num_accepted_tokens for r in ok], [r.stats.num_draft_tokens for r in ok], **ci))
    g.alpha_hat_ci = proportion_ci(st.num_accepted_tokens, st.num_accepted_tokens + st.num_rejected_steps, bootstrap_ratio_ci(
        [r.stats.num_accepted_tokens for r in ok],
        [r.stats.num_accepted_tokens + r.stats.num_rejected_steps for r in ok],
        **ci,
    ))
    # the floor's per-token acceptance: the bootstrap CI of accepted per step, mapped through iid_alpha
    mean_ci = bootstrap_ratio_ci([r.stats.num_accepted_tokens for r in ok], [r.stats.num_drafts for r in ok], **ci)
    g.per_token_acceptance, g.per_token_acceptance_ci = per_token_acceptance(
        st.num_drafts, st.num_draft_tokens, st.num_accepted_tokens, mean_ci)


def _pool_agreement(g: GroupMetrics, ok: list[PromptRun], ci: dict) -> None:
    """Teacher-forced agreement (α_tf, top-1, TV, KL, coverage) summed over the prompts ``ok``."""
    ag = AgreementSums()
    for r in ok:
        ag = ag + r.agree
    g.num_tf_positions = ag.positions
    g.alpha_tf, g.top1_agreement = ag.mean("alpha"), ag.mean("top1")
    g.total_variation, g.kl_divergence = ag.mean("tv"), ag.mean("kl")
    g.tf_coverage = ratio(ag.positions, sum(r.tf_total for r in ok))
    g.alpha_tf_ci = bootstrap_ratio_ci([r.agree.alpha for r in ok], [r.agree.positions for r in ok], **ci)
    _pool_rules(g, ag, ok, ci)


def _pool_rules(g: GroupMetrics, ag: AgreementSums, ok: list[PromptRun], ci: dict) -> None:
    """Both acceptance rules from the teacher-forced pass (docs/metrics.md "Two acceptance rules"): the pooled
    per-token rate with its bootstrap CI over the prompts ``ok``, and the expected rate at draft positions 1..k."""
    k = g.num_speculative_tokens
    g.exact_rule_acceptance, g.argmax_rule_acceptance = ag.mean("alpha"), ag.mean("argmax_rule")
    positions = [r.agree.positions for r in ok]
    g.exact_rule_acceptance_ci = bootstrap_ratio_ci([r.agree.alpha for r in ok], positions, **ci)
    g.argmax_rule_acceptance_ci = bootstrap_ratio_ci([r.agree.argmax_rule for r in ok], positions, **ci)
    if ag.positions:
        g.exact_rule_per_position, g.argmax_rule_per_position = ag.per_position("exact", k), ag.per_position("argmax", k)


def _pool_timing(g: GroupMetrics, st: DecodingStats, ok: list[PromptRun], ci: dict) -> None:
    """Wall times, the paired/pooled speedup with its CI, the load, and the in-run pass costs (c, v(k))."""
    g.target_only_seconds = sum(r.target_only_seconds for r in ok)
    g.speculative_seconds = sum(r.speculative_seconds for r in ok)
    g.target_only_tokens = sum(r.target_only_tokens for r in ok)
    g.speculative_tokens = sum(r.speculative_tokens for r in ok)
    cols = ([r.target_only_tokens for r in ok], [r.target_only_seconds for r in ok],
            [r.speculative_tokens for r in ok], [r.speculative_seconds for r in ok])
    g.speedup = paired_speedup(*cols)
    g.speedup_pooled = pooled_speedup(*cols)
    g.speedup_ci = bootstrap_speedup_ci(*cols, **ci)
    g.num_remeasured = sum(r.remeasured for r in ok)
    loads = [r.row.load_avg_1m for r in ok if not math.isnan(r.row.load_avg_1m)]
    if loads:
        g.load_avg_1m, g.load_avg_1m_max = sum(loads) / len(loads), max(loads)
    g.num_cpus = usable_cpus()
    g.target_step_seconds = ratio(sum(r.target_step_s for r in ok), sum(r.target_steps for r in ok))
    g.target_pass_seconds = ratio(sum(r.target_pass_s for r in ok), sum(r.target_passes for r in ok))
    g.draft_pass_seconds = ratio(sum(r.draft_pass_s for r in ok), sum(r.draft_passes for r in ok))
    g.cost_ratio = ratio(g.draft_pass_seconds, g.target_step_seconds)
    g.verify_cost_ratio = ratio(g.target_pass_seconds, g.target_step_seconds)
    if st.draft_forward_passes and st.target_forward_passes:
        g.cost_ratio_with_prefill = ratio(
            st.draft_seconds / st.draft_forward_passes, st.target_seconds / st.target_forward_passes
        )


def with_prompts(counters: StepCounters, ok: list[PromptRun], prefill: tuple) -> StepCounters:
    """``counters`` plus the prompts' costs (:class:`StepCounters` ``prompt_cost`` /
    ``draft_prompt_cost``) from the calibrated prefill costs ``(target, draft)``
    (:class:`~specdec.validation.timing.PrefillCost` by prompt length); unchanged when the target's
    was not measured (None)."""
    from dataclasses import replace

    target_pre, draft_pre = prefill
    if target_pre is None:
        return counters
    both = sum(max(target_pre(r.row.prompt_tokens) - 1.0, 0.0) for r in ok)
    spec = 0.0 if draft_pre is None else sum(draft_pre(r.draft_prefill_tokens) for r in ok)
    return replace(counters, prompt_cost=both, draft_prompt_cost=spec)


def predict(g: GroupMetrics, counters: StepCounters, verify_cost: VerifyCost | None, cost_ratio: float,
            counters_by_k: dict[int, StepCounters] | None = None) -> None:
    """Fill ``g``'s prediction fields with the one speed model (:func:`specdec.validation.speed.predicted_speedup`).

    c: ``cost_ratio`` when measured, else the in-run ``g.cost_ratio``. v: ``verify_cost``, else the
    in-run point ``{k: g.verify_cost_ratio}`` (interpolated to v(0) = 1, never extrapolated). The
    recommended k comes from ``counters_by_k`` (a replay) when given, else from i.i.d. counters at
    ``g.alpha_hat`` (labelled in ``recommended_k_basis``). Sets the timing check (measured/predicted).
    """
    c = cost_ratio if not math.isnan(cost_ratio) else g.cost_ratio
    k = g.num_speculative_tokens
    v = verify_cost
    if v is None and not math.isnan(g.verify_cost_ratio) and k:
        v = VerifyCost.fit({k: g.verify_cost_ratio})
    if v is None or math.isnan(c):
        return
    g.predicted_cost_ratio, g.verify_cost_by_n = c, v.as_list()
    g.predicted_speedup = predicted_speedup(counters, c, v)
    if counters_by_k is None and not math.isnan(g.alpha_hat):
        counters_by_k = {kk: StepCounters.iid(g.alpha_hat, kk) for kk in range(1, min(MAX_RECOMMENDED_K, v.n_max) + 1)}
        g.recommended_k_basis = IID_BASIS
    elif counters_by_k is not None:
        g.recommended_k_basis = REPLAY_BASIS
    if counters_by_k:
        g.recommended_num_speculative_tokens, g.predicted_speedup_at_recommended = best_k(counters_by_k, c, v)
    # like with like: the model predicts pooled token rates (Σ tokens / Σ cost over the prompts), so it is
    # checked against the pooled measured speedup; the verdict's median paired ratio is shown beside it
    g.measured_over_predicted = ratio(g.speedup_pooled, g.predicted_speedup) if not math.isnan(g.speedup_pooled) else math.nan
    g.timing_suspect = timing_band(g.speedup_pooled, g.predicted_speedup)
