"""The one speed model, and measured speedups with a paired, robust CI.

**Predicted speedup** (:func:`predicted_speedup`, the only function in the product that predicts a
speedup). In units of one target one-token pass, over the verification steps a run (or a replay)
actually took::

    S = Σ_steps (accepted + 1) / Σ_steps (c · proposed + v(proposed))

``c`` is the draft's one-token pass over the target's one-token pass (per proposed token; an
n-gram lookup is almost free), ``v(n)`` the target's pass over n + 1 tokens over its one-token pass
(a measured curve, :class:`VerifyCost`; ``v(0) = 1``: a step that proposed nothing is a plain
target step). Each step emits its accepted tokens plus one (the bonus or the correction); target-only
decoding emits one token per one-token pass. A validation's prediction adds the prompts
(:class:`StepCounters` ``prompt_cost``: the target's prefill, on both sides; ``draft_prompt_cost``: a
draft model's own prefill, which only a draft that cannot adopt the target's prompt KV pays, e.g. a
draft derived from an *earlier* target: measured on the stale demo pair, docs/metrics.md); replayed
curves and the choice of k leave prompts out (they cost the same at every k).

Counters come as :class:`StepCounters` (steps by number of proposed tokens, accepted tokens), from
decoding counters (:meth:`StepCounters.from_stats`), a replay, per-step ``(proposed, accepted)``
pairs (:meth:`StepCounters.from_steps`, e.g. a confidence-threshold policy's replayed steps) or,
where only per-token acceptance is known, the i.i.d. model (:meth:`StepCounters.iid`). Leviathan
et al. (2022, Thm 3.8) is the special case of i.i.d. counters with ``v = 1``
(``docs/metrics.md``). The best k is the k whose counters give the largest :func:`predicted_speedup`
(:func:`best_k`).

**A night's wall time** (:func:`night_seconds`, the same passes seen from the nightly's side; docs/scale.md).
A replay night is, per pair and prompt, the target's continuation (``new_tokens`` tokens at ``s_c`` seconds
per token of one request: the core on the worker, or one stream of the engine serving the target) and one
teacher-forced draft pass (``r`` seconds per prompt), in that order on a worker; ``W`` workers split the
prompts (shards), and an engine serving ``E`` streams at that rate queues the workers beyond ``E``::

    T = setup + pairs · ceil(prompts / W) · (u · new_tokens · s_c · max(1, W / E) + r) + pool

(``u``: the share of continuations not cached; continuations from the core: ``E = W``, each worker is its own
target; ``setup``: a worker loading its models, in parallel; ``pool``: pooling and the report.)

**Measured speedup** (:func:`paired_speedup`): each prompt is decoded target-only and
speculatively back to back (interleaved), giving one paired ratio of token rates per prompt; the
speedup is their median (robust to a round that a co-tenant slowed down), with a percentile
bootstrap CI over prompts (:func:`bootstrap_speedup_ci`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["StepCounters", "VerifyCost", "predicted_speedup", "best_k", "NightPlan", "NightRates", "night_seconds", "paired_speedup", "bootstrap_speedup_ci",
           "pooled_speedup", "timing_band", "TIMING_BAND", "PAYS_ABOVE"]

#: a measured speedup (and its CI's lower end) above this pays: speculative decoding is faster than target-only
PAYS_ABOVE = 1.0

#: measured / predicted outside this band: the timing is suspect (a co-tenant, a first-run penalty, a
#: bias of one side), not a finding. Calibrated on benchmarks/results/2026-12-01-speed-cpu.json (0.91-1.07
#: measured there for ngram, derived:bf16, derived:int8 on SmolLM2; docs/metrics.md).
TIMING_BAND = (0.8, 1.25)


@dataclass(frozen=True)
class StepCounters:
    """Verification steps by how many tokens they proposed, and the accepted tokens over them.

    Attributes:
        steps_by_proposed: ``{n: number of steps that proposed n tokens}`` (n >= 0; counts may be
            expected values, so floats are allowed; n = 0 is a plain target step, e.g. an n-gram miss).
        accepted: accepted draft tokens summed over those steps.
        prompt_cost: the prompts' cost on both sides beyond one pass each, in one-token target passes:
            Σ (target prefill over the prompt - 1). Target-only pays it as the speculative run does
            (0: left out, as the paper and replayed curves do).
        draft_prompt_cost: what only the speculative side pays per prompt: the draft model's own
            prefill over the prompt (0 for a draft that adopts the target's prompt KV, an n-gram
            drafter or a head), in one-token target passes.
    """

    steps_by_proposed: Mapping[int, float]
    accepted: float
    prompt_cost: float = 0.0
    draft_prompt_cost: float = 0.0

    @property
    def steps(self) -> float:
        """Verification steps (one target pass each)."""
        return float(sum(self.steps_by_proposed.values()))

    @property
    def proposed(self) -> float:
        """Proposed (draft) tokens."""
        return float(sum(n * s for n, s in self.steps_by_proposed.items()))

    @classmethod
    def from_steps(cls, steps: Iterable[tuple[int, int]]) -> "StepCounters":
        """From per-step ``(proposed, accepted)`` pairs (a decoded or replayed run, any policy)."""
        hist: dict[int, float] = {}
        acc = 0.0
        for n, a in steps:
            hist[int(n)] = hist.get(int(n), 0.0) + 1.0
            acc += a
        return cls(hist, acc)

    @classmethod
    def from_stats(cls, stats: Any) -> "StepCounters":
        """From :class:`specdec.core.stats.DecodingStats` (decoded or replayed, pooled over prompts).

        Steps with n >= 1 proposed tokens come from ``drafted_per_position``; steps that proposed
        nothing are ``target_forward_passes - num_drafts`` (never < 0): every target pass of the
        speculative loop is one step, the first one carrying the prompt (a draft that adopts the
        target's prompt KV makes it a plain step).
        """
        d = list(stats.drafted_per_position or [])
        hist: dict[int, float] = {}
        for n in range(1, len(d) + 1):
            exact = d[n - 1] - (d[n] if n < len(d) else 0)
            if exact:
                hist[n] = float(exact)
        if not d and stats.num_drafts:  # no per-position counters: every step proposed the mean
            return cls.from_totals(stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens)
        plain = stats.target_forward_passes - stats.num_drafts
        if plain > 0:
            hist[0] = float(plain)
        return cls(hist, float(stats.num_accepted_tokens))

    @classmethod
    def from_totals(cls, steps: float, proposed: float, accepted: float) -> "StepCounters":
        """From totals only (e.g. expected counters of a sampled replay): every step proposed the mean
        number of tokens, split between its floor and ceiling so the total is kept."""
        if not steps:
            return cls({}, float(accepted))
        m = proposed / steps
        lo = math.floor(m)
        frac = m - lo
        hist = {lo: steps * (1 - frac)}
        if frac > 0:
            hist[lo + 1] = steps * frac
        return cls(hist, float(accepted))

    @classmethod
    def iid(cls, alpha: float, k: int, steps: float = 1.0) -> "StepCounters":
        """Expected counters of ``steps`` steps of k proposals each, every token accepted
        independently with probability ``alpha`` (Leviathan's model): accepted per step
        ``Σ_{i=1..k} alpha^i``. Raises ValueError for alpha outside [0, 1] or k < 0."""
        if not 0.0 <= alpha <= 1.0 or k < 0:
            raise ValueError(f"need alpha in [0, 1] and k >= 0, got alpha={alpha}, k={k}")
        return cls({k: float(steps)}, steps * sum(alpha ** i for i in range(1, k + 1)))


@dataclass(frozen=True)
class VerifyCost:
    """v(n): the target's pass over n + 1 tokens, in one-token passes; ``v(0) = 1``.

    Built by :meth:`fit` from measured points. Between measured n it is interpolated linearly;
    beyond the largest measured n it is NaN (never extrapolated). The measured points are kept as
    they are, not forced non-decreasing: the BLAS kernel a CPU picks depends on the row count, so a
    wider pass can cost less (median of 21 passes, SmolLM2-135M fp32, 2 threads, AMD EPYC:
    v(2) = 1.9, v(4) = 1.25, v(5) = 1.35, v(6) = 1.7; a decoding run at k = 5 measured 1.38 in its
    own passes, where the isotonic fit gave 1.5-1.65 and under-predicted the speedup by a quarter;
    docs/metrics.md). Each point is floored at 1 and clipped to ``n + 1``: feeding the n + 1 tokens
    one at a time through the KV cache costs n + 1 passes, so a larger number is a stalled timing
    (seen: v(7) = 1246 for a tiny model on an overloaded machine), not a cost.
    """

    points: Mapping[int, float] = field(default_factory=lambda: {0: 1.0})

    @classmethod
    def fit(cls, measured: Mapping[int, float]) -> "VerifyCost":
        """``{n: measured v(n)}`` (n >= 1; NaN values dropped), each point clipped to ``[1, n + 1]``."""
        pts = {int(n): min(max(float(v), 1.0), n + 1.0) for n, v in measured.items() if n >= 1 and not math.isnan(v)}
        return cls({0: 1.0, **dict(sorted(pts.items()))})

    @classmethod
    def unit(cls, n_max: int = 64) -> "VerifyCost":
        """v = 1 for every n up to ``n_max`` (the paper's assumption: verification is free)."""
        return cls({n: 1.0 for n in range(n_max + 1)})

    @property
    def n_max(self) -> int:
        """Largest n with a value."""
        return max(self.points)

    def __call__(self, n: int) -> float:
        ns = sorted(self.points)
        if n in self.points:
            return float(self.points[n])
        if n < 0 or n > ns[-1]:
            return math.nan
        hi = next(x for x in ns if x > n)
        lo = max(x for x in ns if x < n)
        w = (n - lo) / (hi - lo)
        return float(self.points[lo] * (1 - w) + self.points[hi] * w)

    def as_list(self) -> list[float]:
        """``[v(0), v(1), ..., v(n_max)]`` (JSON-friendly)."""
        return [self(n) for n in range(self.n_max + 1)]

    @classmethod
    def from_list(cls, values: Sequence[float | None] | None) -> "VerifyCost | None":
        """Inverse of :meth:`as_list` (None/NaN entries skipped); None for an empty list."""
        pts = {n: float(v) for n, v in enumerate(values or []) if v is not None and not math.isnan(v)}
        return cls(pts) if pts else None


def predicted_speedup(counters: StepCounters, cost_ratio: float, verify_cost: VerifyCost) -> float:
    """``(Σ (accepted + 1) + P) / (Σ (c · proposed + v(proposed)) + P + D)`` over the steps (module
    docstring), with the prompts' cost P on both sides and the draft's own prefill D on the
    speculative side (:class:`StepCounters`; both 0 for replayed curves).

    Args:
        counters: the steps and accepted tokens.
        cost_ratio: c, draft pass / target one-token pass (>= 0).
        verify_cost: the v(n) curve.
    Returns:
        the predicted speedup over target-only (unitless; < 1 means slower); NaN without steps, with
        c NaN, or where v is not measured for a proposed count.
    """
    steps = counters.steps
    if not steps or cost_ratio is None or math.isnan(cost_ratio):
        return math.nan
    cost = sum(s * (cost_ratio * n + verify_cost(n)) for n, s in counters.steps_by_proposed.items() if s)
    cost += counters.prompt_cost + counters.draft_prompt_cost
    tokens = counters.accepted + steps + counters.prompt_cost
    return tokens / cost if cost > 0 and not math.isnan(cost) else math.nan


def best_k(counters_by_k: Mapping[int, StepCounters], cost_ratio: float,
           verify_cost: VerifyCost) -> tuple[int | None, float]:
    """The k whose counters give the largest :func:`predicted_speedup` (ties: the smallest k).

    Returns:
        ``(k, predicted speedup at k)``; ``(None, nan)`` when no k has a prediction.
    """
    best, best_s = None, -math.inf
    for k in sorted(counters_by_k):
        s = predicted_speedup(counters_by_k[k], cost_ratio, verify_cost)
        if not math.isnan(s) and s > best_s + 1e-12:
            best, best_s = k, s
    return (best, best_s) if best is not None else (None, math.nan)


@dataclass(frozen=True)
class NightPlan:
    """What a night validates and on how many workers: ``prompts`` per pair, ``new_tokens`` per prompt,
    ``pairs``, ``workers`` (shards of a pair run at once), ``uncached``: the share of continuations not in the
    cache (1: a new target or held-out set; 0: only the draft changed)."""

    prompts: int
    new_tokens: int
    pairs: int = 1
    workers: int = 1
    uncached: float = 1.0


@dataclass(frozen=True)
class NightRates:
    """Measured rates of a night's parts, in seconds.

    Attributes:
        continuation_seconds_per_token: one request's wall seconds per new token (prefill included), from the
            core on a worker or from one stream of the engine.
        replay_seconds_per_prompt: one prompt's teacher-forced draft pass and counting on a worker.
        engine_streams: requests the engine serves at once at that rate (slots x data-parallel replicas);
            None: the continuations come from the core (each worker is its own target).
        setup_seconds: a worker loading its models (the workers load in parallel).
        pool_seconds: pooling the shards and building the report.
    """

    continuation_seconds_per_token: float
    replay_seconds_per_prompt: float
    engine_streams: int | None = None
    setup_seconds: float = 0.0
    pool_seconds: float = 0.0


def night_seconds(plan: NightPlan, rates: NightRates) -> float:
    """The predicted wall seconds of a replay night (module docstring's ``T``).

    Raises:
        ValueError: fewer than 1 prompt token, worker or engine stream; a negative rate.
    """
    streams = rates.engine_streams
    if plan.workers < 1 or plan.new_tokens < 0 or plan.prompts < 0 or (streams is not None and streams < 1):
        raise ValueError(f"a night needs workers >= 1, engine streams >= 1 and counts >= 0, got {plan}, {rates}")
    if min(rates.continuation_seconds_per_token, rates.replay_seconds_per_prompt, rates.setup_seconds,
           rates.pool_seconds) < 0:
        raise ValueError(f"rates must be >= 0 seconds, got {rates}")
    queue = 1.0 if streams is None else max(1.0, plan.workers / streams)
    per_prompt = plan.uncached * plan.new_tokens * rates.continuation_seconds_per_token * queue
    per_prompt += rates.replay_seconds_per_prompt
    return rates.setup_seconds + plan.pairs * math.ceil(plan.prompts / plan.workers) * per_prompt + rates.pool_seconds


def timing_band(measured: float, predicted: float, band: tuple[float, float] = TIMING_BAND) -> bool | None:
    """True when ``measured / predicted`` is outside ``band`` (timing suspect), None when either is NaN."""
    if any(x is None or math.isnan(x) for x in (measured, predicted)) or predicted <= 0:
        return None
    r = measured / predicted
    return not band[0] <= r <= band[1]


def _per_prompt_ratios(arrs: list[np.ndarray]) -> np.ndarray:
    rt, rs, st, ss = arrs
    ok = (rt > 0) & (rs > 0) & (st > 0) & (ss > 0)
    return (st[ok] / ss[ok]) / (rt[ok] / rs[ok])


def paired_speedup(ref_tokens: Sequence[float], ref_seconds: Sequence[float],
                   spec_tokens: Sequence[float], spec_seconds: Sequence[float]) -> float:
    """Median over prompts of the paired ratio of token rates ``(spec_tok/spec_s) / (ref_tok/ref_s)``.

    Args: per prompt (or prompt-round), target-only and speculative new tokens and wall seconds.
    Returns: the median ratio; NaN without a prompt where both sides ran.
    """
    r = _per_prompt_ratios([np.asarray(x, dtype=np.float64) for x in (ref_tokens, ref_seconds, spec_tokens,
                                                                     spec_seconds)])
    return float(np.median(r)) if r.size else math.nan


def pooled_speedup(ref_tokens: Sequence[float], ref_seconds: Sequence[float],
                   spec_tokens: Sequence[float], spec_seconds: Sequence[float]) -> float:
    """The ratio of pooled token rates (kept for comparison with older reports; one slow round can
    decide it, so validation reports :func:`paired_speedup`). NaN when a sum is 0."""
    rt, rs, st, ss = (float(np.sum(np.asarray(x, dtype=np.float64))) for x in (ref_tokens, ref_seconds,
                                                                              spec_tokens, spec_seconds))
    if rt <= 0 or rs <= 0 or ss <= 0:
        return math.nan
    return (st / ss) / (rt / rs)


def bootstrap_speedup_ci(ref_tokens: Sequence[float], ref_seconds: Sequence[float], spec_tokens: Sequence[float],
                         spec_seconds: Sequence[float], *, n_resamples: int = 2000, confidence: float = 0.95,
                         seed: int = 0) -> list[float]:
    """Percentile bootstrap CI of :func:`paired_speedup`, resampling prompts (pairs kept together).

    Returns:
        ``[low, high]``; ``[nan, nan]`` with fewer than 2 usable prompts.
    Raises:
        ValueError: the four sequences differ in length.
    """
    arrs = [np.asarray(x, dtype=np.float64) for x in (ref_tokens, ref_seconds, spec_tokens, spec_seconds)]
    if any(a.shape[0] != arrs[0].shape[0] for a in arrs):
        raise ValueError("ref_tokens, ref_seconds, spec_tokens and spec_seconds must have one value per prompt")
    r = _per_prompt_ratios(arrs)
    if r.size < 2:
        return [math.nan, math.nan]
    rng = np.random.default_rng(seed)
    meds = np.median(r[rng.integers(0, r.size, size=(n_resamples, r.size))], axis=1)
    tail = (1.0 - confidence) / 2.0 * 100.0
    lo, hi = np.percentile(meds, [tail, 100.0 - tail])
    return [float(lo), float(hi)]
