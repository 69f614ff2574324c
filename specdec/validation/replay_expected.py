"""Sampling replay: EXPECTED speculative-decoding counters for every k from teacher-forced p and q.

Along the target's continuation ``y``, position t accepts with ``alpha_t = sum_x min(p_t(x), q_t(x))``
(Leviathan et al. 2022, Sec. 3.1; ``p_t(argmax q_t)`` under the argmax rule). A block after ``m`` emitted
tokens with budget ``b`` accepts ``n`` drafts with probability ``prod_{i<n} alpha_{m+i} (1 - alpha_{m+n})``
(``n < b``) or ``prod_{i<b} alpha_{m+i}``; a forward recursion over ``m`` gives the expected counters,
assuming the accepted / recovered tokens follow ``y``'s path (docs/metrics.md "Replay").
"""

from __future__ import annotations

import numpy as np
import torch

from specdec.core.config import SamplingConfig
from specdec.core.sampling import argmax_rule_acceptance, exact_rule_acceptance, logits_to_probs
from specdec.core.stats import DecodingStats
from specdec.validation.metrics import bootstrap_ratio_ci

__all__ = ["position_alphas", "expected_counters", "expected_curve"]


def position_alphas(z_p: torch.Tensor, z_q: torch.Tensor, sampling: SamplingConfig,
                    draft_sampling: str = "sampled") -> list[float]:
    """``T`` per-position acceptance probabilities in [0, 1] from the target's and the draft's float logits
    ``[T, V]`` (draft fitted to V): ``sum_x min(p_t(x), q_t(x))`` under the ``"sampled"`` rule, ``p_t(argmax
    q_t)`` (the raw draft logits' argmax, as the core proposes) under ``"argmax"``.

    Raises:
        ValueError: an unknown rule.
    """
    p = logits_to_probs(z_p, sampling)
    if draft_sampling == "argmax":  # argmax of the raw logits = argmax q (temperature / top-k / top-p keep the order)
        return argmax_rule_acceptance(p, z_q).tolist()
    if draft_sampling != "sampled":
        raise ValueError(f"draft_sampling must be 'sampled' or 'argmax', got {draft_sampling!r}")
    return exact_rule_acceptance(p, logits_to_probs(z_q, sampling)).tolist()


def expected_counters(alphas: list[float], *, num_speculative_tokens: int, max_new_tokens: int,
                      adopts_prefix: bool = False) -> DecodingStats:
    """Expected counters of speculative decoding with k >= 1 along one continuation's ``alphas`` (length
    N <= ``max_new_tokens``; blocks clipped as in the core; ``adopts_prefix``: one plain first step).

    Returns:
        the core's :class:`DecodingStats` holding expectations (floats) in ``num_drafts``, ``num_draft_tokens``,
        ``num_accepted_tokens``, ``num_rejected_steps`` and ``accepted_per_position``.
    Raises:
        ValueError: k < 1.
    """
    k = num_speculative_tokens
    if k < 1:
        raise ValueError(f"num_speculative_tokens must be >= 1, got {k}")
    N = len(alphas)
    a = np.zeros(N + k + 1)
    a[:N] = np.asarray(alphas, dtype=np.float64)
    out = DecodingStats(num_speculative_tokens=k, num_drafts=0.0, num_draft_tokens=0.0, num_accepted_tokens=0.0,
                        num_rejected_steps=0.0, accepted_per_position=[0.0] * k)
    per_pos = np.zeros(k)
    w = np.zeros(N + k + 2)  # w[m]: probability that a step starts after m emitted tokens
    w[1 if adopts_prefix and N else 0] = 1.0
    for m in range(N):
        if w[m] == 0.0:
            continue
        b = min(k, max_new_tokens - m - 1)
        if b <= 0:
            w[m + 1] += w[m]
            continue
        run = np.cumprod(a[m:m + b])  # run[i] = P(first i+1 drafts accepted)
        p_n = np.empty(b + 1)
        p_n[0] = 1.0 - a[m]
        p_n[1:b] = run[:-1] * (1.0 - a[m + 1:m + b])
        p_n[b] = run[-1]
        out.num_drafts += w[m]
        out.num_draft_tokens += w[m] * b
        out.num_accepted_tokens += w[m] * float(run.sum())
        out.num_rejected_steps += w[m] * float(1.0 - run[-1])
        per_pos[:b] += w[m] * run
        for n in range(b + 1):
            w[min(m + n + 1, N)] += w[m] * p_n[n]
    out.accepted_per_position = per_pos.tolist()
    return out


def expected_curve(per_prompt_alphas: list[list[float]], ks: range | list[int], *, max_new_tokens: int,
                   adopts_prefix: bool = False, seed: int = 0, n_resamples: int = 2000) -> dict[int, dict]:
    """Pooled expected counters for every k over prompts: ``{k: {"expected_acceptance_rate", "..._ci",
    "expected_mean_accepted_length", "..._ci", "expected_num_drafts", "expected_num_draft_tokens",
    "expected_num_accepted_tokens"}}`` (95% percentile-bootstrap CIs over prompts)."""
    from specdec.validation.replay import pooled

    out: dict[int, dict] = {}
    ci = dict(seed=seed, n_resamples=n_resamples)
    for k in ks:
        per = [expected_counters(a, num_speculative_tokens=k, max_new_tokens=max_new_tokens,
                                 adopts_prefix=adopts_prefix) for a in per_prompt_alphas]
        acc, steps = [c.num_accepted_tokens for c in per], [c.num_drafts for c in per]
        pool = pooled(per, k)  # the core's pooled sums and ratios (of expectations)
        lo, hi = bootstrap_ratio_ci(acc, steps, **ci)
        out[k] = {
            "expected_acceptance_rate": pool.acceptance_rate,
            "expected_acceptance_rate_ci": bootstrap_ratio_ci(acc, [c.num_draft_tokens for c in per], **ci),
            "expected_mean_accepted_length": pool.mean_accepted_length,
            "expected_mean_accepted_length_ci": [1.0 + lo, 1.0 + hi],
            "expected_num_drafts": pool.num_drafts,
            "expected_num_draft_tokens": pool.num_draft_tokens,
            "expected_num_accepted_tokens": pool.num_accepted_tokens,
        }
    return out
