"""The replayed acceptance-by-k curve, the k it recommends, and how replay/decode differences are classified.

Predicted speedup at k: the one speed model (:func:`specdec.validation.speed.predicted_speedup`) on the
replayed counters at k pooled over prompts (sampling: expected totals) with the c and v(n) measured here.
"""

from __future__ import annotations

import math
from typing import Any

from specdec.core.stats import DecodingStats
from specdec.validation.replay import pooled, replay_grid
from specdec.validation.metrics import bootstrap_ratio_ci
from specdec.validation.speed import StepCounters, VerifyCost, best_k, predicted_speedup

__all__ = ["acceptance_by_k", "recommend_from_curve", "best_k_tau", "TAU_GRID", "row_counters", "classify",
           "decoded_stop_after_rejection", "NUMERICS_MARGIN", "NEAR_TIE", "BEYOND_NUMERICS", "UNSEEN_STOP"]

#: largest draft logit margin (top-1 minus top-2) at which a replay/decode flip is explained by rounding alone,
#: per precision of the pair (calibrated on benchmarks/results/*-replay-cpu.json; docs/metrics.md "Replay")
NUMERICS_MARGIN = {"fp32": 0.01, "int8": 0.05, "int4": 0.05, "fp16": 0.5, "bf16": 2.0, "fp8": 4.0}
NEAR_TIE, BEYOND_NUMERICS, UNSEEN_STOP = "near-tie (numerics)", "beyond numerics", "draft stop after a rejection"


def acceptance_by_k(curves: list[dict[int, DecodingStats]], ks: range | list[int], *, seed: int = 0,
                    n_resamples: int = 2000) -> list[dict[str, Any]]:
    """The replayed acceptance table from per-prompt ``{k: DecodingStats}`` curves, one row per k in ``ks``:
    ``{"k", "num_drafts", "num_draft_tokens", "num_accepted_tokens", "acceptance_rate", "acceptance_rate_ci",
    "mean_accepted_length", "alpha_hat", "per_token_acceptance", "steps_by_proposed"}`` (95% bootstrap CIs over
    prompts); :func:`recommend_from_curve` adds each row's ``predicted_speedup``."""
    rows = []
    for k in ks:
        per = [cv[k] for cv in curves]
        s = pooled(per, k)
        counters = StepCounters.from_stats(s)
        rows.append({
            "k": k, "num_drafts": s.num_drafts, "num_draft_tokens": s.num_draft_tokens,
            "num_accepted_tokens": s.num_accepted_tokens, "acceptance_rate": s.acceptance_rate,
            "acceptance_rate_ci": bootstrap_ratio_ci([x.num_accepted_tokens for x in per],
                                                     [x.num_draft_tokens for x in per], seed=seed,
                                                     n_resamples=n_resamples),
            "mean_accepted_length": s.mean_accepted_length, "alpha_hat": s.alpha_hat,
            "per_token_acceptance": s.per_token_acceptance,
            "steps_by_proposed": [counters.steps_by_proposed.get(n, 0.0) for n in range(k + 1)],
        })
    return rows


def row_counters(row: dict[str, Any]) -> StepCounters:
    """One acceptance-by-k row's :class:`StepCounters`: its steps by proposed count, else its (expected) totals."""
    acc = row.get("num_accepted_tokens", row.get("expected_num_accepted_tokens"))
    hist = row.get("steps_by_proposed")
    if hist:
        return StepCounters({n: float(x) for n, x in enumerate(hist) if x}, float(acc))
    d = row.get("num_drafts", row.get("expected_num_drafts"))
    t = row.get("num_draft_tokens", row.get("expected_num_draft_tokens"))
    return StepCounters.from_totals(d or 0.0, t or 0.0, acc or 0.0)


def recommend_from_curve(table: list[dict[str, Any]], c: float, v: VerifyCost | None) -> dict[str, Any]:
    """The k with the highest predicted speedup on the replayed curve (exact or expected rows;
    :func:`specdec.validation.speed.best_k`), filling each row's ``predicted_speedup``: ``{"recommended_num_speculative_tokens"
    (None without c, v), "predicted_speedup_at_recommended", "cost_ratio", "verify_cost_by_n"}``."""
    by_k = {row["k"]: row_counters(row) for row in table}
    for row in table:
        row["predicted_speedup"] = predicted_speedup(by_k[row["k"]], c, v) if v is not None else math.nan
    k, s = best_k(by_k, c, v) if v is not None else (None, math.nan)
    return {"recommended_num_speculative_tokens": k, "predicted_speedup_at_recommended": s,
            "cost_ratio": c, "verify_cost_by_n": v.as_list() if v is not None else []}


#: the confidence thresholds (assistant_confidence_threshold) searched for the best (k, tau)
TAU_GRID = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def best_k_tau(traces: list[Any], continuations: list[list[int]], ks: range | list[int], c: float,
               v: VerifyCost | None, *, max_new_tokens: int, stop_token_ids: frozenset[int] = frozenset(),
               taus: tuple[float, ...] = TAU_GRID) -> dict[str, Any]:
    """Best fixed k and best (k, tau) by the one speed model (measured c, v; None: nothing predicted) on the
    exact greedy counters replayed for every (k, tau) of ``ks`` x ({None} + ``taus``)
    (:func:`specdec.validation.replay.replay_grid`; per prompt a trace and its greedy continuation).

    Returns ``{"best_fixed_k": {"num_speculative_tokens", "predicted_speedup"}, "best_k_tau": {...,
    "assistant_confidence_threshold"}}`` (ties keep the fixed k, then the smaller k and tau)."""
    if v is None or c is None or math.isnan(c) or not traces:
        return {"best_fixed_k": {"num_speculative_tokens": None, "predicted_speedup": math.nan},
                "best_k_tau": {"num_speculative_tokens": None, "assistant_confidence_threshold": None,
                               "predicted_speedup": math.nan}}
    if not all(t.thresholds for t in traces):
        taus = ()  # a head's trace has no per-draft confidence: fixed k only
    grid = replay_grid(traces, continuations, ks, [None, *taus], max_new_tokens=max_new_tokens,
                       stop_token_ids=stop_token_ids)
    scores = {key: predicted_speedup(StepCounters.from_stats(s), c, v) for key, s in grid.items()}
    fixed = best_k({k: StepCounters.from_stats(grid[(k, None)]) for k in ks}, c, v)
    best, best_s = (fixed[0], None), fixed[1]
    for (k, tau), sp in scores.items():
        if tau is not None and not math.isnan(sp) and (math.isnan(best_s) or sp > best_s + 1e-12):
            best, best_s = (k, tau), sp
    return {"best_fixed_k": {"num_speculative_tokens": fixed[0], "predicted_speedup": fixed[1]},
            "best_k_tau": {"num_speculative_tokens": best[0], "assistant_confidence_threshold": best[1],
                           "predicted_speedup": best_s}}


def classify(margin: float | None, precision: str, *, unseen_stop: bool = False, counters_equal: bool = False) -> str:
    """Why a decoded prompt's counters differ from its replay: :data:`UNSEEN_STOP` (a stop token proposed after a
    rejected draft, which a fast replay cannot see), :data:`NEAR_TIE` (the first differing draft token where the
    draft's margin is at most :data:`NUMERICS_MARGIN` of the pair's precision), else :data:`BEYOND_NUMERICS` (a
    larger margin, or none known: a bookkeeping or measurement error)."""
    if unseen_stop and margin is None:
        return UNSEEN_STOP
    if margin is None or math.isnan(margin):
        return BEYOND_NUMERICS
    return NEAR_TIE if margin <= NUMERICS_MARGIN.get(precision, NUMERICS_MARGIN["fp32"]) else BEYOND_NUMERICS


def decoded_stop_after_rejection(blocks: list[tuple[int, list[int]]], prompt_len: int, continuation: list[int],
                                 stop: frozenset[int]) -> bool:
    """True when a decoded block proposed a stop token after its first rejected draft (unseen by a fast replay)."""
    for ctx_len, tokens in blocks:
        m = ctx_len - prompt_len
        for i, x in enumerate(tokens):
            if m + i >= len(continuation) or x != continuation[m + i]:
                if any(t in stop for t in tokens[i + 1:]):
                    return True
                break
    return False
