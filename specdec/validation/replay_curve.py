"""The replayed acceptance-by-k curve, the k it recommends, and how replay/decode differences are classified.

Predicted speedup at k: the one speed model (:func:`specdec.validation.speed.predicted_speedup`) on
the replayed counters at k (steps by proposed count, accepted tokens; pooled over prompts) with the
costs the driver measured on this machine (c, and the v(n) curve from
:func:`specdec.validation.timing.calibrate`). Sampling replays give expected totals only
(:meth:`StepCounters.from_totals`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from specdec.core.stats import DecodingStats
from specdec.validation.replay import pooled, replay_grid
from specdec.validation.metrics import bootstrap_ratio_ci
from specdec.validation.speed import StepCounters, VerifyCost, best_k, predicted_speedup

__all__ = ["acceptance_by_k", "recommend_from_curve", "best_k_tau", "TAU_GRID", "row_counters", "classify", "precision_of", "decoded_stop_after_rejection",
           "NUMERICS_MARGIN", "NEAR_TIE", "BEYOND_NUMERICS", "UNSEEN_STOP"]

#: largest logit margin (target-vocabulary draft logits, top-1 minus top-2) at which a replay/decode
#: flip is explained by rounding alone, per precision of the pair. fp32: full-sequence vs incremental
#: passes differ by ~1e-5 relative; bf16: logits of magnitude 10-30 carry ~0.06-0.25 rounding per op,
#: calibrated on the benchmark (benchmarks/results/*-replay-cpu.json: largest bf16 flip margin seen).
NUMERICS_MARGIN = {"fp32": 0.01, "int8": 0.05, "int4": 0.05, "fp16": 0.5, "bf16": 2.0, "fp8": 4.0}
NEAR_TIE, BEYOND_NUMERICS, UNSEEN_STOP = "near-tie (numerics)", "beyond numerics", "draft stop after a rejection"


def acceptance_by_k(curves: list[dict[int, DecodingStats]], ks: range | list[int], c: float, v: VerifyCost | None, *,
                    seed: int = 0, n_resamples: int = 2000) -> list[dict[str, Any]]:
    """The replayed acceptance table: one row per k.

    Args:
        curves: per prompt, ``{k: DecodingStats}`` (:func:`specdec.validation.replay.replay_curve`).
        ks: the k values (each present in every curve).
        c, v: measured cost ratio and verification-cost curve (nan / None when not measured).
    Returns:
        rows ``{"k", "num_drafts", "num_draft_tokens", "num_accepted_tokens", "acceptance_rate",
        "acceptance_rate_ci", "mean_accepted_length", "alpha_hat", "steps_by_proposed", "predicted_speedup"}`` (rates in
        [0, 1], lengths in tokens, 95% percentile-bootstrap CIs over prompts).
    """
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
            "predicted_speedup": predicted_speedup(counters, c, v) if v is not None else math.nan,
        })
    return rows


def row_counters(row: dict[str, Any]) -> StepCounters:
    """The :class:`StepCounters` of one acceptance-by-k row: its steps by proposed count when it has
    them (exact greedy replay), else its (expected) totals."""
    acc = row.get("num_accepted_tokens", row.get("expected_num_accepted_tokens"))
    hist = row.get("steps_by_proposed")
    if hist:
        return StepCounters({n: float(x) for n, x in enumerate(hist) if x}, float(acc))
    d = row.get("num_drafts", row.get("expected_num_drafts"))
    t = row.get("num_draft_tokens", row.get("expected_num_draft_tokens"))
    return StepCounters.from_totals(d or 0.0, t or 0.0, acc or 0.0)


def recommend_from_curve(table: list[dict[str, Any]], c: float, v: VerifyCost | None) -> dict[str, Any]:
    """The k with the highest predicted speedup on the replayed curve (:func:`specdec.validation.speed.best_k`),
    with the c and v used; fills each row's ``predicted_speedup``.

    Rows may carry exact (``num_*``) or expected (``expected_num_*``) counters.
    Returns:
        ``{"recommended_num_speculative_tokens", "predicted_speedup_at_recommended", "cost_ratio",
        "verify_cost_by_n"}``; the k is None when c or v was not measured.
    """
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
    """Best fixed k and best (k, tau) by the one speed model on exact greedy replayed counters.

    Every (k, tau) of ``ks`` x ({None} + ``taus``) is replayed from the same traces
    (:func:`specdec.validation.replay.replay_grid`), pooled over prompts, and scored with
    :func:`specdec.validation.speed.predicted_speedup` (c, v measured on this machine).

    Args:
        traces, continuations: per prompt, the draft trace and the target's greedy continuation.
        ks: k values. c, v: measured cost ratio and v(n) curve (None: nothing is predicted).
        max_new_tokens, stop_token_ids: the decoding budget and stops.
        taus: thresholds tried besides "no threshold".
    Returns:
        ``{"best_fixed_k": {"num_speculative_tokens", "predicted_speedup"},
        "best_k_tau": {"num_speculative_tokens", "assistant_confidence_threshold", "predicted_speedup"}}``
        (k None and speedup nan without c / v; ties keep the fixed k, then the smaller k and tau).
    """
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
    """Why a decoded prompt's counters differ from its replay.

    Returns:
        :data:`UNSEEN_STOP` (decoding proposed a stop token after a rejected draft, which a fast
        replay cannot see; acceptance counters agree), :data:`NEAR_TIE` (the first differing draft
        token sits where the draft's logit margin is at most :data:`NUMERICS_MARGIN` for the pair's
        precision), else :data:`BEYOND_NUMERICS` (a larger margin, no differing token at all, or no
        margin known: a bookkeeping or measurement error).
    """
    if unseen_stop and margin is None:
        return UNSEEN_STOP
    if margin is None or math.isnan(margin):
        return BEYOND_NUMERICS
    return NEAR_TIE if margin <= NUMERICS_MARGIN.get(precision, NUMERICS_MARGIN["fp32"]) else BEYOND_NUMERICS


def precision_of(target: torch.nn.Module, draft: torch.nn.Module | None, recipe: dict | None) -> str:
    """The lowest precision either side computes in: ``fp8``, ``bf16``, ``fp16``, ``int4``, ``int8`` or ``fp32``."""
    dtypes = {p.dtype for m in (target, draft) if m is not None for p in m.parameters() if p.is_floating_point()}
    names = {str(d).removeprefix("torch.") for d in dtypes}
    if any(n.startswith("float8") for n in names) or (recipe or {}).get("kind") == "fp8":
        return "fp8"
    if "bfloat16" in names:
        return "bf16"
    if "float16" in names:
        return "fp16"
    if (recipe or {}).get("kind") in ("int8", "int4"):
        return str(recipe["kind"])
    return "fp32"


def decoded_stop_after_rejection(blocks: list[tuple[int, list[int]]], prompt_len: int, continuation: list[int],
                                 stop: frozenset[int]) -> bool:
    """True when a decoded block proposed a stop token after its first rejected draft (the part of a
    proposal a fast replay does not see)."""
    for ctx_len, tokens in blocks:
        m = ctx_len - prompt_len
        for i, x in enumerate(tokens):
            if m + i >= len(continuation) or x != continuation[m + i]:
                if any(t in stop for t in tokens[i + 1:]):
                    return True
                break
    return False
