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
    def per_token_acceptance(self) -> float:
        """The floor's per-token acceptance: :func:`iid_alpha` of ``num_accepted_tokens / num_drafts``
        at proposal length ``num_draft_tokens / num_drafts``, in [0, 1]; the same at every k on the
        real pairs (docs/metrics.md, "Per-token acceptance"). ``nan`` without steps."""
        return per_token_acceptance(self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens)[0]

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
            per_token_acceptance=self.per_token_acceptance,
        )
        return d


#: Estimators of the acceptance a pair is judged by, computed from pooled counters by :func:`estimate`.
#: ``per_token`` (the floor's default: it moved least from k = 2 to k = 8 on the real pairs) and
#: ``pooled`` are the policy's choices (:class:`specdec.policy.AcceptancePolicy`); the others are the
#: candidates measured against them (``benchmarks/alpha_k_invariance.py``, docs/metrics.md
#: "Per-token acceptance").
ESTIMATORS = ("per_token", "pooled", "mle", "position_0", "conditional")


def rejected_steps_from_positions(num_drafts: int, accepted_per_position: list[int], k: int) -> int | None:
    """Steps that ended at a rejection, from counters a serving engine exports: ``num_drafts -
    accepted_per_position[k - 1]`` (a step with no rejection accepted all k drafts). Exact when every
    step proposes k tokens; with shorter proposals an upper bound. ``None`` when the per-position
    counters do not cover k positions."""
    if k <= 0 or len(accepted_per_position) != k:
        return None
    return max(num_drafts - accepted_per_position[k - 1], 0)


def iid_alpha(mean_accepted: float, proposal_length: float) -> float:
    """Leviathan's per-token acceptance α whose i.i.d. model reproduces a measured mean accepted length.

    Solves ``Σ_{i=1..m} α^i = mean_accepted`` for α in [0, 1] (bisection, 1e-15), with ``m =
    proposal_length`` (mean proposed tokens per step; a fractional m adds ``(m - ⌊m⌋) α^(⌊m⌋+1)``, the
    linear interpolation between the neighbouring integer lengths). ``mean_accepted`` is accepted
    tokens per verification step (vLLM's mean accepted length minus 1). Returns 1.0 when
    ``mean_accepted >= m`` (every proposal accepted), 0.0 when it is <= 0, NaN when ``m <= 0`` or an
    input is NaN.
    """
    if not (mean_accepted == mean_accepted and proposal_length == proposal_length) or proposal_length <= 0:
        return math.nan
    whole, frac = int(proposal_length), proposal_length - int(proposal_length)

    def f(a: float) -> float:
        return sum(a ** i for i in range(1, whole + 1)) + frac * a ** (whole + 1)

    if mean_accepted >= f(1.0):
        return 1.0
    if mean_accepted <= 0:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < mean_accepted else (lo, mid)
    return (lo + hi) / 2


def per_token_acceptance(num_drafts: float, num_draft_tokens: float, num_accepted_tokens: float,
                         mean_ci: list[float] | tuple[float, float] | None = None) -> tuple[float, list[float]]:
    """The floor's per-token acceptance from the three counters every engine exports, and its CI.

    Args:
        num_drafts / num_draft_tokens / num_accepted_tokens: pooled counters (vLLM names).
        mean_ci: 95% CI ``[low, high]`` of accepted tokens per draft (a bootstrap over prompts, or a
            window's normal interval); None: no interval.
    Returns:
        ``(alpha, [low, high])``: :func:`iid_alpha` of accepted / drafts at proposal length
        drafted / drafts, and the interval's ends mapped the same way (the map is increasing, so
        the coverage carries over). NaN without drafts.
    """
    if not num_drafts:
        return math.nan, [math.nan, math.nan]
    m = num_draft_tokens / num_drafts
    alpha = iid_alpha(num_accepted_tokens / num_drafts, m)
    ci = [iid_alpha(float(x), m) for x in mean_ci] if mean_ci is not None and len(mean_ci) == 2 else [math.nan, math.nan]
    return alpha, ci


def estimate(stats: DecodingStats, estimator: str) -> float:
    """One estimator of the pair's acceptance from pooled counters (probability in [0, 1]; nan
    without evidence).

    - ``per_token``: :func:`iid_alpha` of accepted per step at the measured proposal length: the α
      whose i.i.d. (Leviathan) model gives the measured mean accepted length (the floor's default).
    - ``pooled``: vLLM's accepted / drafted tokens at the pair's k (falls as k grows).
    - ``mle``: :attr:`DecodingStats.alpha_hat`, accepted / (accepted + rejected steps), the
      truncated-geometric MLE (the measurement rule compares it with α_tf).
    - ``position_0``: ``accepted_per_position[0] / num_drafts``.
    - ``conditional``: sum_i accepted_at[i] / sum_i reached[i], reached[0] = drafted at 0 and
      reached[i] = min(accepted_at[i-1], drafted_at[i]): acceptance at each position given it was
      verified, pooled over positions.

    Raises:
        ValueError: unknown estimator.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown acceptance estimator {estimator!r}; use one of {', '.join(ESTIMATORS)}")
    if estimator == "mle":
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
    return stats.per_token_acceptance
