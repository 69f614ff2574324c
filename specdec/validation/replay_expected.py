"""Sampling replay: EXPECTED speculative-decoding counters for every k from teacher-forced p and q.

Under sampling a replay cannot reproduce one run's random coins, so it reports expected values.
Along the target's own (sampled) continuation ``y``, position t has the per-token acceptance
probability of Leviathan et al. (2022), Sec. 3.1:

    alpha_t = sum_x min(p_t(x), q_t(x)) = 1 - TV(p_t, q_t)

with ``p_t`` / ``q_t`` the target / draft distributions after ``prompt + y[:t]`` (both through
:func:`specdec.core.sampling.logits_to_probs`, so temperature / top-k / top-p match decoding).
Under the argmax proposal rule (``draft_sampling="argmax"``, vLLM's and SGLang's: the draft's
argmax verified with q one-hot, :func:`specdec.core.sampling.draft_step`) the per-token
acceptance probability is instead

    alpha_t = p_t(argmax q_t)

(the sum of these along the continuation is the expected number of accepted drafts when every
position is drafted), and everything below is unchanged.
A block starting after ``m`` emitted tokens with budget ``b = min(k, max_new_tokens - m - 1)``
accepts ``n`` drafts with probability ``prod_{i<n} alpha_{m+i} * (1 - alpha_{m+n})`` (``n < b``)
or ``prod_{i<b} alpha_{m+i}`` (``n = b``), then emits one recovered / bonus token. A forward
recursion over ``m`` gives the expected ``num_drafts``, ``num_draft_tokens``,
``num_accepted_tokens``, ``num_rejected_steps`` and ``accepted_per_position``. The approximation
(labelled "expected" everywhere it is reported): each alpha is taken on the target's continuation,
i.e. the accepted/recovered tokens are assumed to follow ``y``'s distribution path. Positions past
the continuation's end have alpha 0. CIs: percentile bootstrap over prompts of the pooled ratio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from specdec.core.config import SamplingConfig
from specdec.core.sampling import logits_to_probs
from specdec.validation.metrics import bootstrap_ratio_ci

__all__ = ["ExpectedCounters", "position_alphas", "expected_counters", "expected_curve"]


@dataclass
class ExpectedCounters:
    """Expected counters of one prompt (or a pool) at one k (floats: expectations, not counts)."""

    num_speculative_tokens: int
    num_drafts: float = 0.0
    num_draft_tokens: float = 0.0
    num_accepted_tokens: float = 0.0
    num_rejected_steps: float = 0.0
    accepted_per_position: list[float] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        """Expected accepted / expected drafted (a ratio of expectations), nan without drafts."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else math.nan

    @property
    def mean_accepted_length(self) -> float:
        """1 + expected accepted / expected steps, nan without steps."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else math.nan


def position_alphas(z_p: torch.Tensor, z_q: torch.Tensor, sampling: SamplingConfig,
                    draft_sampling: str = "sampled") -> list[float]:
    """Per-position acceptance probability: ``sum_x min(p_t(x), q_t(x))`` (``"sampled"``) or
    ``p_t(argmax q_t)`` (``"argmax"``; the argmax of the raw draft logits, as the core proposes).

    Args:
        z_p, z_q: float logits ``[T, V]`` of the target and the draft (draft already fitted to V).
        sampling: the decoding's :class:`SamplingConfig`.
        draft_sampling: the proposal rule (:data:`specdec.core.config.DRAFT_SAMPLING_RULES`).
    Returns:
        ``T`` floats in [0, 1].
    Raises:
        ValueError: an unknown rule.
    """
    p = logits_to_probs(z_p, sampling)
    if draft_sampling == "argmax":
        return p.gather(-1, z_q.argmax(dim=-1, keepdim=True)).squeeze(-1).clamp(0.0, 1.0).tolist()
    if draft_sampling != "sampled":
        raise ValueError(f"draft_sampling must be 'sampled' or 'argmax', got {draft_sampling!r}")
    q = logits_to_probs(z_q, sampling)
    return torch.minimum(p, q).sum(dim=-1).clamp(0.0, 1.0).tolist()


def expected_counters(alphas: list[float], *, num_speculative_tokens: int, max_new_tokens: int,
                      adopts_prefix: bool = False) -> ExpectedCounters:
    """Expected counters of speculative decoding with k along one continuation (module docstring).

    Args:
        alphas: per-position acceptance probabilities of the continuation (length N <= max_new_tokens).
        num_speculative_tokens: k >= 1.
        max_new_tokens: the decoding budget (blocks near it are clipped, as in the core).
        adopts_prefix: the draft adopts the target's prompt KV (one plain first step).
    Returns:
        :class:`ExpectedCounters`.
    Raises:
        ValueError: k < 1.
    """
    k = num_speculative_tokens
    if k < 1:
        raise ValueError(f"num_speculative_tokens must be >= 1, got {k}")
    N = len(alphas)
    a = np.zeros(N + k + 1)
    a[:N] = np.asarray(alphas, dtype=np.float64)
    out = ExpectedCounters(k, accepted_per_position=[0.0] * k)
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
    """Pooled expected counters for every k over prompts, with bootstrap CIs.

    Returns:
        ``{k: {"expected_acceptance_rate", "expected_acceptance_rate_ci", "expected_mean_accepted_length",
        "expected_mean_accepted_length_ci", "expected_num_drafts", "expected_num_draft_tokens",
        "expected_num_accepted_tokens"}}`` (all labelled expected; CIs 95% percentile bootstrap
        over prompts).
    """
    out: dict[int, dict] = {}
    for k in ks:
        per = [expected_counters(a, num_speculative_tokens=k, max_new_tokens=max_new_tokens,
                                 adopts_prefix=adopts_prefix) for a in per_prompt_alphas]
        acc = [c.num_accepted_tokens for c in per]
        drafted = [c.num_draft_tokens for c in per]
        steps = [c.num_drafts for c in per]
        ci = dict(seed=seed, n_resamples=n_resamples)
        sa, sd, ss = sum(acc), sum(drafted), sum(steps)
        lo, hi = bootstrap_ratio_ci(acc, steps, **ci)
        out[k] = {
            "expected_acceptance_rate": sa / sd if sd else math.nan,
            "expected_acceptance_rate_ci": bootstrap_ratio_ci(acc, drafted, **ci),
            "expected_mean_accepted_length": 1.0 + sa / ss if ss else math.nan,
            "expected_mean_accepted_length_ci": [1.0 + lo, 1.0 + hi],
            "expected_num_drafts": ss,
            "expected_num_draft_tokens": sd,
            "expected_num_accepted_tokens": sa,
        }
    return out
