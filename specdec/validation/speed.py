"""Measured speedup of speculative decoding over target-only decoding, with a paired bootstrap CI.

Every prompt is decoded target-only and speculatively on the same machine, one right after the
other (the validation alternates which goes first), so each prompt gives one *pair* of timings
taken under nearly the same machine conditions. The pooled speedup is a ratio of rates::

    speedup = (Σ spec_tokens / Σ spec_seconds) / (Σ ref_tokens / Σ ref_seconds)

(for greedy decoding the token counts are equal and it is ``Σ ref_seconds / Σ spec_seconds``).
Its 95% CI is a percentile bootstrap that resamples *prompts*, keeping each prompt's pair
together, and recomputes the pooled ratio, so prompt-to-prompt variation (length, category) is in
the interval while the pairing cancels slow drifts of the machine.

The verification-cost-aware best k (:func:`best_k`) extends Leviathan et al. (2022, Thm 3.8) with
a measured verification cost: ``S(k) = E[tokens/step](α, k) / (c·k + v(k))``, where
``v(k)`` is the target's (k+1)-token pass over its one-token pass (1 in the paper's model; on a
CPU a wider pass is not free).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from specdec.validation.metrics import expected_tokens_per_step

__all__ = ["pooled_speedup", "bootstrap_speedup_ci", "best_k", "predicted_speedup_with_verify"]


def pooled_speedup(ref_tokens: Sequence[float], ref_seconds: Sequence[float],
                   spec_tokens: Sequence[float], spec_seconds: Sequence[float]) -> float:
    """Pooled speedup of the speculative runs over the target-only runs (a ratio of token rates).

    Args:
        ref_tokens, ref_seconds: per prompt, target-only new tokens and wall seconds.
        spec_tokens, spec_seconds: per prompt, speculative new tokens and wall seconds.
    Returns:
        ``(Σ spec_tokens / Σ spec_seconds) / (Σ ref_tokens / Σ ref_seconds)``; NaN when a sum of
        seconds or tokens is 0 or there are no prompts.
    """
    rt, rs, st, ss = (float(np.sum(np.asarray(x, dtype=np.float64))) for x in (ref_tokens, ref_seconds,
                                                                              spec_tokens, spec_seconds))
    if rt <= 0 or rs <= 0 or ss <= 0:
        return math.nan
    return (st / ss) / (rt / rs)


def bootstrap_speedup_ci(
    ref_tokens: Sequence[float],
    ref_seconds: Sequence[float],
    spec_tokens: Sequence[float],
    spec_seconds: Sequence[float],
    *,
    n_resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> list[float]:
    """Percentile bootstrap CI of :func:`pooled_speedup`, resampling prompts as pairs.

    Args:
        ref_tokens, ref_seconds, spec_tokens, spec_seconds: per-prompt values, same length n.
        n_resamples: bootstrap replicates.
        confidence: coverage (0.95 -> 2.5% and 97.5% percentiles).
        seed: ``numpy.random.default_rng`` seed (reproducible interval).
    Returns:
        ``[low, high]``; ``[nan, nan]`` with fewer than 2 prompts or no positive time.
    Raises:
        ValueError: the four sequences differ in length.
    """
    arrs = [np.asarray(x, dtype=np.float64) for x in (ref_tokens, ref_seconds, spec_tokens, spec_seconds)]
    n = arrs[0].shape[0]
    if any(a.shape[0] != n for a in arrs):
        raise ValueError("ref_tokens, ref_seconds, spec_tokens and spec_seconds must have one value per prompt")
    if n < 2 or arrs[1].sum() <= 0 or arrs[3].sum() <= 0:
        return [math.nan, math.nan]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_resamples, n))
    rt, rs, st, ss = (a[idx].sum(1) for a in arrs)
    ok = (rt > 0) & (rs > 0) & (ss > 0)
    ratios = (st[ok] / ss[ok]) / (rt[ok] / rs[ok])
    if ratios.size == 0:
        return [math.nan, math.nan]
    tail = (1.0 - confidence) / 2.0 * 100.0
    lo, hi = np.percentile(ratios, [tail, 100.0 - tail])
    return [float(lo), float(hi)]


def predicted_speedup_with_verify(alpha: float, cost_ratio: float, k: int, verify_cost: float) -> float:
    """``E[tokens/step](alpha, k) / (cost_ratio·k + verify_cost)``: Leviathan's Thm 3.8 with the
    verification pass costing ``verify_cost`` one-token target passes (the paper assumes 1).

    Returns NaN when any input is NaN.
    """
    if any(math.isnan(x) for x in (alpha, cost_ratio, verify_cost)):
        return math.nan
    return expected_tokens_per_step(alpha, k) / (cost_ratio * k + verify_cost)


def best_k(alpha: float, cost_ratio: float, verify_cost: Mapping[int, float] | float) -> tuple[int | None, float]:
    """The k maximising :func:`predicted_speedup_with_verify` (ties: the smallest k).

    Args:
        alpha: per-token acceptance probability in [0, 1].
        cost_ratio: draft pass / one-token target pass (c).
        verify_cost: ``{k: v(k)}`` for the k values measured, or one v used for k in 1..16.
    Returns:
        ``(k, predicted speedup at k)``; ``(None, nan)`` when alpha or c is NaN or nothing was measured.
    """
    if math.isnan(alpha) or math.isnan(cost_ratio):
        return None, math.nan
    vs = verify_cost if isinstance(verify_cost, Mapping) else {k: float(verify_cost) for k in range(1, 17)}
    best, best_s = None, -math.inf
    for k in sorted(vs):
        s = predicted_speedup_with_verify(alpha, cost_ratio, k, vs[k])
        if not math.isnan(s) and s > best_s + 1e-12:
            best, best_s = k, s
    return (best, best_s) if best is not None else (None, math.nan)
