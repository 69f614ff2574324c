"""Validation math: teacher-forced agreement, prompt bootstrap (the speed model: :mod:`specdec.validation.speed`).

Pure functions over tensors / numpy arrays; no models, no I/O. Definitions are written out in
``docs/metrics.md``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from specdec.core.sampling import argmax_rule_acceptance, exact_rule_acceptance

__all__ = [
    "AgreementSums",
    "agreement_sums",
    "bootstrap_ratio_ci",
    "chain_sums",
    "onehot_agreement_sums",
]

@dataclass
class AgreementSums:
    """Per-position draft/target agreement summed over positions (divide by ``positions``).

    alpha: Σ_t Σ_x min(p_t(x), q_t(x)) (the exact rule's acceptance); argmax_rule: Σ_t p_t(argmax q_t) (the
    argmax rule's); top1: number of positions with argmax p = argmax q; tv: Σ_t ½ Σ_x |p_t(x) − q_t(x)|; kl:
    Σ_t KL(p̃_t ‖ q̃_t) in nats (see :func:`agreement_sums`). ``exact_chain[j]`` / ``argmax_chain[j]``: Σ over
    the windows of j + 1 consecutive measured positions of the product of their acceptances under each rule,
    ``chain_windows[j]`` the number of such windows (:func:`chain_sums`; docs/metrics.md "Two acceptance rules").
    """

    positions: int = 0
    alpha: float = 0.0
    top1: float = 0.0
    tv: float = 0.0
    kl: float = 0.0
    argmax_rule: float = 0.0
    exact_chain: list[float] = field(default_factory=list)
    argmax_chain: list[float] = field(default_factory=list)
    chain_windows: list[float] = field(default_factory=list)

    def __add__(self, other: "AgreementSums") -> "AgreementSums":
        return AgreementSums(
            self.positions + other.positions,
            self.alpha + other.alpha,
            self.top1 + other.top1,
            self.tv + other.tv,
            self.kl + other.kl,
            self.argmax_rule + other.argmax_rule,
            _add_lists(self.exact_chain, other.exact_chain),
            _add_lists(self.argmax_chain, other.argmax_chain),
            _add_lists(self.chain_windows, other.chain_windows),
        )

    def mean(self, name: str) -> float:
        """``sum / positions`` for ``name`` in {alpha, argmax_rule, top1, tv, kl}; ``nan`` without positions."""
        return getattr(self, name) / self.positions if self.positions else math.nan

    def per_position(self, rule: str, k: int) -> list[float]:
        """The expected acceptance at draft positions 1..k of a chain under ``rule`` (``exact`` | ``argmax``):
        ``chain[j] / chain_windows[j]``, ``nan`` where no window of j + 1 positions was measured."""
        chain = self.exact_chain if rule == "exact" else self.argmax_chain
        return [chain[j] / self.chain_windows[j] if j < len(self.chain_windows) and self.chain_windows[j] else math.nan
                for j in range(k)]


def _add_lists(a: list[float], b: list[float]) -> list[float]:
    """Elementwise sum of two lists, the shorter padded with 0."""
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0.0) + (b[i] if i < len(b) else 0.0) for i in range(n)]


def chain_sums(acceptance: torch.Tensor, k: int) -> tuple[list[float], list[float]]:
    """Sums of the expected acceptance of a chain of ``k`` drafts started at every position of a continuation.

    A draft at chain position j (0-based) is counted accepted only when drafts 0..j all were, so a chain
    started at position t accepts its draft j with probability ``Π_{i=0..j} a_{t+i}`` (each ``a`` from the
    teacher-forced p and q at that position, :func:`specdec.core.sampling.rule_acceptance`).

    Args:
        acceptance: float ``[T]`` per-position acceptance in [0, 1]; ``nan`` where the drafter proposes nothing
            (a window containing one is left out).
        k: chain length (>= 0).
    Returns:
        ``(sums, windows)``, two lists of length ``k``: Σ_t Π_{i<=j} a_{t+i} over the windows of j + 1
        positions inside ``[0, T)`` without a ``nan``, and their count.
    """
    a = acceptance.double()
    sums, windows = [], []
    for j in range(k):
        if a.shape[0] < j + 1:
            sums.append(0.0)
            windows.append(0.0)
            continue
        prods = a.unfold(0, j + 1, 1).prod(dim=-1)
        ok = ~prods.isnan()
        sums.append(float(prods[ok].sum()))
        windows.append(float(ok.sum()))
    return sums, windows


def agreement_sums(
    p: torch.Tensor, q: torch.Tensor, kl_logp: torch.Tensor, kl_logq: torch.Tensor, *, chain: int = 0
) -> AgreementSums:
    """Teacher-forced agreement between target p and draft q at T positions.

    Args:
        p, q: ``FloatTensor[T, V]`` probabilities at the configured sampling settings (rows sum
            to 1; from :func:`specdec.core.sampling.logits_to_probs`). Same V (align vocabularies first).
        kl_logp, kl_logq: ``FloatTensor[T, V]`` log-probabilities of the *untruncated* softmax
            used for KL (logits / T for T > 0, logits / 1 for greedy), so KL stays finite where the
            truncated q is 0 while p is not.
        chain: draft positions of the per-position sums under both rules (:func:`chain_sums`; 0: none).
    Returns:
        :class:`AgreementSums` over the T positions: Σ min(p, q) per position (Leviathan's
        β = 1 − TV, the exact rule), p(argmax q) (the argmax rule), argmax agreement, TV = ½‖p − q‖₁,
        KL(p̃‖q̃) = Σ p̃ (log p̃ − log q̃) in nats.
    Raises:
        ValueError: p and q not both ``[T, V]``.
    """
    if p.shape != q.shape or p.dim() != 2:
        raise ValueError(f"p and q must both be [T, V], got {tuple(p.shape)} and {tuple(q.shape)}")
    p64, q64 = p.double(), q.double()
    alpha, by_argmax = exact_rule_acceptance(p64, q64), argmax_rule_acceptance(p64, q64)
    tv = (0.5 * (p64 - q64).abs().sum(-1)).clamp(0.0, 1.0)
    top1 = (p64.argmax(-1) == q64.argmax(-1)).double()
    lp, lq = kl_logp.double(), kl_logq.double()
    kl = (lp.exp() * (lp - lq)).nan_to_num(nan=0.0).sum(-1).clamp_min(0.0)
    (exact_chain, windows), (argmax_chain, _) = chain_sums(alpha, chain), chain_sums(by_argmax, chain)
    return AgreementSums(
        positions=int(p.shape[0]),
        alpha=float(alpha.sum()),
        top1=float(top1.sum()),
        tv=float(tv.sum()),
        kl=float(kl.sum()),
        argmax_rule=float(by_argmax.sum()),
        exact_chain=exact_chain, argmax_chain=argmax_chain, chain_windows=windows,
    )


def onehot_agreement_sums(p: torch.Tensor, proposals: Sequence[int | None], *, chain: int = 0) -> AgreementSums:
    """Agreement for a drafter with a one-hot q (the n-gram drafter), at the positions it proposes.

    With q = one-hot(y): Σ min(p, q) = p(y) = p(argmax q) (both rules agree), top-1 agreement =
    [argmax p = y], TV = 1 − p(y). KL(p‖q) is infinite for a one-hot q unless p is one-hot at y, so it
    is not reported (``nan``). Positions where the drafter proposes nothing are excluded (their count is
    the ``positions`` shortfall; the caller reports the coverage) and end a chain (:func:`chain_sums`).

    Args:
        p: ``FloatTensor[T, V]`` target probabilities at the configured sampling settings.
        proposals: length-T sequence of the proposed token id at each position, or ``None``.
        chain: draft positions of the per-position sums (0: none).
    """
    idx = [t for t, y in enumerate(proposals) if y is not None]
    if not idx:
        return AgreementSums(kl=math.nan)
    rows = p[idx].double()
    ys = torch.tensor([proposals[t] for t in idx], dtype=torch.long)
    py = rows.gather(1, ys[:, None]).squeeze(1)
    top1 = (rows.argmax(-1) == ys).double()
    per_t = torch.full((len(proposals),), math.nan, dtype=torch.float64)
    per_t[idx] = py
    sums, windows = chain_sums(per_t, chain)
    return AgreementSums(
        positions=len(idx), alpha=float(py.sum()), top1=float(top1.sum()), tv=float((1 - py).sum()), kl=math.nan,
        argmax_rule=float(py.sum()), exact_chain=sums, argmax_chain=list(sums), chain_windows=windows,
    )


def bootstrap_ratio_ci(
    numerators: Sequence[float],
    denominators: Sequence[float],
    *,
    n_resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> list[float]:
    """Percentile bootstrap CI of a pooled ratio ``Σ num / Σ den``, resampling prompts.

    Each replicate draws n prompts with replacement and recomputes the *pooled* ratio (never a
    mean of per-prompt ratios). Replicates with ``Σ den = 0`` are dropped.

    Args:
        numerators, denominators: per-prompt sums (e.g. accepted tokens and drafted tokens).
        n_resamples: bootstrap replicates B.
        confidence: interval coverage (0.95 gives the 2.5% and 97.5% percentiles).
        seed: numpy ``default_rng`` seed, so the interval is reproducible.
    Returns:
        ``[low, high]``; ``[nan, nan]`` (not estimable) with fewer than 2 prompts (resampling one
        prompt gives the same ratio every time: a point, not an interval) or no positive
        denominator.
    """
    num = np.asarray(numerators, dtype=np.float64)
    den = np.asarray(denominators, dtype=np.float64)
    n = num.shape[0]
    if n < 2 or den.sum() <= 0:
        return [math.nan, math.nan]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_resamples, n))
    s_num, s_den = num[idx].sum(1), den[idx].sum(1)
    ok = s_den > 0
    ratios = s_num[ok] / s_den[ok]
    tail = (1.0 - confidence) / 2.0 * 100.0
    lo, hi = np.percentile(ratios, [tail, 100.0 - tail])
    return [float(lo), float(hi)]


def proportion_ci(successes: float, trials: float, bootstrap_ci: Sequence[float], confidence: float = 0.95) -> list[float]:
    """A proportion's CI: the prompt bootstrap's ``bootstrap_ci`` widened to contain the exact binomial
    (Clopper-Pearson) interval of the pooled ``successes / trials``.

    The bootstrap over prompts carries the variation between prompts but collapses to a point when
    every prompt has the same ratio: at 222 of 222 drafted tokens accepted it says [1.000, 1.000],
    while 222 Bernoulli trials only bound the rate below by 0.984. The binomial interval is the
    within-prompt part; their hull is never narrower than either. ``[nan, nan]`` bootstrap (one prompt)
    stays as it is; ``trials <= 0`` returns ``bootstrap_ci`` unchanged.
    """
    lo, hi = (float(x) for x in bootstrap_ci)
    if math.isnan(lo) or math.isnan(hi) or not trials > 0:
        return [lo, hi]
    from scipy.stats import beta

    a = (1.0 - confidence) / 2.0
    k, n = float(successes), float(trials)
    cp_lo = 0.0 if k <= 0 else float(beta.ppf(a, k, n - k + 1))
    cp_hi = 1.0 if k >= n else float(beta.ppf(1.0 - a, k + 1, n - k))
    return [min(lo, cp_lo), max(hi, cp_hi)]

