"""Pooled speculative-decoding counters and their derived metrics.

The counter names follow vLLM's Prometheus metrics (``spec_decode_num_drafts``,
``spec_decode_num_draft_tokens``, ``spec_decode_num_accepted_tokens``,
``spec_decode_num_accepted_tokens_per_pos``) so our numbers line up with production dashboards.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field


@dataclass
class DecodingStats:
    """Counters pooled over every verification step of one or more generations.

    Attributes:
        num_speculative_tokens: k, the configured number of draft tokens per step (length of
            ``accepted_per_position``). 0 for target-only decoding.
        num_drafts: verification steps (one target forward pass each, after prefill).
        num_draft_tokens: draft tokens actually proposed (an n-gram miss proposes fewer than k,
            and the last step may propose fewer when few tokens remain).
        num_accepted_tokens: proposed tokens that passed the acceptance test.
        num_rejected_steps: steps that ended at a rejected draft (not fully accepted, and not
            ended by an accepted EOS). With ``num_accepted_tokens`` it gives :attr:`alpha_hat`.
        accepted_per_position: ``accepted_per_position[i]`` counts steps whose draft token at
            position ``i`` (0-based) was accepted. Non-increasing in ``i``.
        drafted_per_position: ``drafted_per_position[i]`` counts steps that proposed a token at
            position ``i`` (fewer than ``num_drafts`` for late positions when a step proposed
            fewer than k tokens). ``accepted_per_position[i] <= drafted_per_position[i]``.
        num_emitted_tokens: tokens emitted by the decoder (accepted + recovered + bonus), after
            truncation at EOS / ``max_new_tokens``.
        target_forward_passes / draft_forward_passes: model calls, prefill included.
        target_seconds / draft_seconds: wall-clock seconds spent inside those calls (device
            synchronised).
    """

    num_speculative_tokens: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_rejected_steps: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    drafted_per_position: list[int] = field(default_factory=list)
    num_emitted_tokens: int = 0
    target_forward_passes: int = 0
    draft_forward_passes: int = 0
    target_seconds: float = 0.0
    draft_seconds: float = 0.0

    def __post_init__(self) -> None:
        if not self.accepted_per_position and self.num_speculative_tokens:
            self.accepted_per_position = [0] * self.num_speculative_tokens
        if not self.drafted_per_position and self.num_speculative_tokens:
            self.drafted_per_position = [0] * self.num_speculative_tokens

    def record_step(self, num_drafted: int, num_accepted: int, rejected: bool) -> None:
        """Count one verification step that proposed ``num_drafted`` tokens.

        Args:
            num_drafted: tokens the drafter proposed this step (a step proposing none is not a
                draft step and is not counted here).
            num_accepted: how many of them passed the acceptance test (a prefix).
            rejected: True if the step ended at a rejected draft (not when every draft was
                accepted, nor when an accepted stop token ended it).
        """
        if not num_drafted:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_drafted
        self.num_accepted_tokens += num_accepted
        self.num_rejected_steps += int(rejected)
        for i in range(num_drafted):
            self.drafted_per_position[i] += 1
        for i in range(num_accepted):
            self.accepted_per_position[i] += 1

    @property
    def acceptance_rate(self) -> float:
        """vLLM definition: ``num_accepted_tokens / num_draft_tokens``, in [0, 1].

        Pooled over steps (never an average of per-step ratios). ``nan`` if nothing was drafted.
        Depends on k: report k next to it.
        """
        if self.num_draft_tokens == 0:
            return float("nan")
        return self.num_accepted_tokens / self.num_draft_tokens

    @property
    def mean_accepted_length(self) -> float:
        """vLLM definition: ``1 + num_accepted_tokens / num_drafts``, in [1, k + 1].

        The tokens emitted per target verification pass (accepted drafts plus the one recovered or
        bonus token). ``nan`` if there were no verification steps.
        """
        if self.num_drafts == 0:
            return float("nan")
        return 1.0 + self.num_accepted_tokens / self.num_drafts

    @property
    def alpha_hat(self) -> float:
        """α̂: Leviathan's per-token acceptance probability α, estimated from the decoding steps.

        ``num_accepted_tokens / (num_accepted_tokens + num_rejected_steps)``, in [0, 1]: the
        maximum-likelihood estimate of α under Leviathan et al.'s i.i.d. model, where each step
        is a run of Bernoulli(α) acceptances stopped at the first rejection and censored at the
        proposal length (a fully accepted step, or one ended by an accepted EOS, has no
        rejection). It uses every verified position, not only position 0, so with drafters whose
        acceptances cluster (an n-gram drafter accepts in bursts) it matches the teacher-forced
        α_tf where position-0 acceptance is biased low. ``nan`` if nothing was verified.
        """
        den = self.num_accepted_tokens + self.num_rejected_steps
        return self.num_accepted_tokens / den if den else float("nan")

    @property
    def draft_tokens_per_step(self) -> float:
        """``num_draft_tokens / num_drafts``: how many tokens the drafter proposes per step.

        A collapsing drafter (e.g. an n-gram drafter that stopped finding matches) shows a falling
        value here while its acceptance rate may look perfect. ``nan`` without steps.
        """
        if self.num_drafts == 0:
            return float("nan")
        return self.num_draft_tokens / self.num_drafts

    @property
    def conditional_per_position_acceptance(self) -> list[float]:
        """``accepted_per_position[i] / drafted_per_position[i]``: acceptance at position i among
        steps that proposed a token there (``nan`` where none did)."""
        return [a / d if d else float("nan") for a, d in zip(self.accepted_per_position, self.drafted_per_position)]

    @property
    def per_position_acceptance(self) -> list[float]:
        """``accepted_per_position[i] / num_drafts`` for each position i, each in [0, 1].

        Position 0 estimates α, Leviathan's per-token acceptance probability, when the drafter
        proposes a token at every step. Empty list without steps.
        """
        if self.num_drafts == 0:
            return [float("nan")] * len(self.accepted_per_position)
        return [a / self.num_drafts for a in self.accepted_per_position]

    def merge(self, other: "DecodingStats") -> "DecodingStats":
        """Return the pooled sum of two counters (same k, or one of them empty).

        Raises:
            ValueError: if both have non-zero, different k.
        """
        k = self.num_speculative_tokens or other.num_speculative_tokens
        if self.num_speculative_tokens and other.num_speculative_tokens and self.num_speculative_tokens != other.num_speculative_tokens:
            raise ValueError(
                f"cannot pool stats with different k ({self.num_speculative_tokens} vs {other.num_speculative_tokens})"
            )
        a = self.accepted_per_position or [0] * k
        b = other.accepted_per_position or [0] * k
        da = self.drafted_per_position or [0] * k
        db = other.drafted_per_position or [0] * k
        return DecodingStats(
            num_speculative_tokens=k,
            num_drafts=self.num_drafts + other.num_drafts,
            num_draft_tokens=self.num_draft_tokens + other.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens + other.num_accepted_tokens,
            num_rejected_steps=self.num_rejected_steps + other.num_rejected_steps,
            accepted_per_position=[x + y for x, y in zip(a, b)],
            drafted_per_position=[x + y for x, y in zip(da, db)],
            num_emitted_tokens=self.num_emitted_tokens + other.num_emitted_tokens,
            target_forward_passes=self.target_forward_passes + other.target_forward_passes,
            draft_forward_passes=self.draft_forward_passes + other.draft_forward_passes,
            target_seconds=self.target_seconds + other.target_seconds,
            draft_seconds=self.draft_seconds + other.draft_seconds,
        )

    def to_dict(self) -> dict:
        """Plain-JSON dict of the counters plus the derived metrics."""
        d = asdict(self)
        d.update(
            acceptance_rate=self.acceptance_rate,
            mean_accepted_length=self.mean_accepted_length,
            draft_tokens_per_step=self.draft_tokens_per_step,
            alpha_hat=self.alpha_hat,
        )
        return d


#: Estimators of the acceptance a pair is judged by, computed from pooled counters by :func:`estimate`.
#: ``per_token`` (the floor's default) and ``pooled`` are the policy's choices
#: (:class:`specdec.policy.AcceptancePolicy`); the others are the candidates measured against them
#: (``benchmarks/alpha_k_invariance.py``, docs/metrics.md "Per-token acceptance").
ESTIMATORS = ("per_token", "pooled", "position_0", "conditional", "iid_from_length")


def rejected_steps_from_positions(num_drafts: int, accepted_per_position: list[int], k: int) -> int | None:
    """Steps that ended at a rejection, from counters a serving engine exports: ``num_drafts -
    accepted_per_position[k - 1]`` (a step with no rejection accepted all k drafts).

    Exact when every step proposes k tokens (vLLM's model drafters; llama.cpp pads nothing, but its
    short drafts are rare); a step that proposed fewer than k and accepted them all counts as
    rejected, so with short proposals the result is an upper bound. ``None`` when the per-position
    counters do not cover k positions.
    """
    if k <= 0 or len(accepted_per_position) != k:
        return None
    return max(num_drafts - accepted_per_position[k - 1], 0)


def _iid_alpha(mean_accepted: float, m: float) -> float:
    """alpha with sum_{i=1..m} alpha^i = mean_accepted (bisection; m may be fractional)."""
    if m <= 0:
        return math.nan
    f = lambda a: sum(a ** i for i in range(1, int(m) + 1)) + (m - int(m)) * a ** (int(m) + 1)
    if mean_accepted >= f(1.0):
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < mean_accepted else (lo, mid)
    return (lo + hi) / 2


def estimate(stats: DecodingStats, estimator: str) -> float:
    """One estimator of the pair's acceptance from pooled counters (probability in [0, 1]; nan
    without evidence).

    - ``per_token``: :attr:`DecodingStats.alpha_hat`, accepted / (accepted + rejected steps), the
      truncated-geometric MLE of Leviathan's alpha; k-invariant (docs/metrics.md).
    - ``pooled``: vLLM's accepted / drafted tokens at the pair's k (falls as k grows).
    - ``position_0``: ``accepted_per_position[0] / num_drafts``.
    - ``conditional``: sum_i accepted_at[i] / sum_i reached[i], reached[0] = drafted at 0 and
      reached[i] = min(accepted_at[i-1], drafted_at[i]): acceptance at each position given it was
      verified, pooled over positions.
    - ``iid_from_length``: the alpha whose i.i.d. mean accepted length at the measured proposal
      length equals the measured one.

    Raises:
        ValueError: unknown estimator.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown acceptance estimator {estimator!r}; use one of {', '.join(ESTIMATORS)}")
    if estimator == "per_token":
        return stats.alpha_hat
    if estimator == "pooled":
        return stats.acceptance_rate
    if not stats.num_drafts:
        return math.nan
    app, dpp = stats.accepted_per_position, stats.drafted_per_position
    if estimator == "position_0":
        return app[0] / stats.num_drafts if app else math.nan
    if estimator == "conditional":
        reached = [dpp[0] if dpp else stats.num_drafts] + [min(a, d) for a, d in zip(app, dpp[1:])]
        return sum(app) / sum(reached) if sum(reached) else math.nan
    return _iid_alpha(stats.num_accepted_tokens / stats.num_drafts, stats.draft_tokens_per_step)


#: two-sided 95% normal quantile
Z95 = 1.959963984540054


def per_token_from_positions(num_drafts: int, accepted_per_position: list[int], k: int) -> tuple[float, list[float]]:
    """Per-token acceptance α̂ and its 95% CI from the counters a serving engine exports.

    Args:
        num_drafts: verification steps that proposed tokens (vLLM ``num_drafts``).
        accepted_per_position: ``accepted_per_position[i]``: steps whose draft at position i was
            accepted (vLLM ``num_accepted_tokens_per_pos``, llama.cpp's per-position counter), length k.
        k: ``num_speculative_tokens``.
    Returns:
        ``(alpha_hat, [low, high])``: α̂ = A / (A + R) with A = Σ accepted_per_position and R =
        num_drafts - accepted_per_position[k-1] (:func:`rejected_steps_from_positions`),
        the estimator nightly validation computes from its own step counters. The interval is a
        normal (delta-method) interval with the draft as the unit: drafts that accepted exactly j
        tokens number ``reach[j] - reach[j+1]`` (reach[0] = num_drafts, reach[j] =
        accepted_per_position[j-1]), each contributing ``z = a - α̂ (a + r)`` with r = 1 below k.
        Drafts of one request are treated as independent (somewhat narrow when acceptance varies a
        lot between requests). ``(nan, [nan, nan])`` when the counters are missing, inconsistent
        (not non-increasing, or above num_drafts) or nothing was verified.
    """
    nan = (math.nan, [math.nan, math.nan])
    pp = [int(x) for x in accepted_per_position]
    if k <= 0 or len(pp) != k or num_drafts <= 0 or pp[0] > num_drafts or any(a < b for a, b in zip(pp, pp[1:])) \
            or pp[-1] < 0:
        return nan
    reach = [num_drafts] + pp + [0]
    counts = [(j, reach[j] - reach[j + 1]) for j in range(k + 1)]
    verified = sum(c * (j + (j < k)) for j, c in counts)
    if verified == 0:
        return nan
    alpha = sum(pp) / verified
    if num_drafts < 2:
        return alpha, [math.nan, math.nan]
    sz2 = sum(c * (j - alpha * (j + (j < k))) ** 2 for j, c in counts)
    se = math.sqrt(sz2 * num_drafts / (num_drafts - 1)) / verified
    return alpha, [max(alpha - Z95 * se, 0.0), min(alpha + Z95 * se, 1.0)]
