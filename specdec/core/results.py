"""What a generation returns: per-row tokens and counters, for B = 1 and for batches."""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec.core.sampling import NO_NEXT_TOKEN, VerifyOutcome
from specdec.core.stats import DecodingStats


@dataclass
class GenerationResult:
    """What a generation produced.

    Attributes:
        token_ids: the new tokens only (prompt excluded), at most ``max_new_tokens``; ends with
            the EOS token if one was generated.
        stats: the pooled :class:`DecodingStats` of this generation.
        finish_reason: ``"eos"`` or ``"length"``.
    """

    token_ids: list[int] = field(default_factory=list)
    stats: DecodingStats = field(default_factory=DecodingStats)
    finish_reason: str = "length"

    def record_verified(self, drafts: list[int], outcome: VerifyOutcome, *, num_drafted: int | None = None,
                        stop_token_ids: frozenset[int] = frozenset()) -> list[int]:
        """One verified step of this row, the bookkeeping every loop shares (B = 1, B > 1, the replay).

        Counts the target pass and the step in ``stats`` (vLLM's counters, per-position lists:
        :meth:`DecodingStats.record_step`), appends the accepted drafts and the recovered / bonus
        token (none after an accepted stop token) to ``token_ids``, and sets ``finish_reason`` to
        ``"eos"`` when the last emitted token is in ``stop_token_ids``.

        Args:
            drafts: the verified draft ids (a prefix of them was accepted).
            outcome: their :class:`~specdec.core.sampling.VerifyOutcome`.
            num_drafted: drafts proposed this step, if more than ``len(drafts)`` were (the replay's
                unseen ones); default ``len(drafts)``.
            stop_token_ids: the ids that end generation.
        Returns:
            the emitted tokens (``list[int]``, possibly empty only if ``outcome`` emits nothing).
        """
        self.stats.target_forward_passes += 1
        self.stats.record_step(len(drafts) if num_drafted is None else num_drafted, outcome.num_accepted,
                               rejected=outcome.rejected)
        emitted = drafts[: outcome.num_accepted]
        if outcome.next_token != NO_NEXT_TOKEN:
            emitted.append(outcome.next_token)
        self.token_ids.extend(emitted)
        if emitted and emitted[-1] in stop_token_ids:
            self.finish_reason = "eos"
        return emitted

    def finished(self, max_new_tokens: int) -> bool:
        """True once a stop token was emitted (``finish_reason == "eos"``) or ``max_new_tokens`` reached."""
        return self.finish_reason == "eos" or len(self.token_ids) >= max_new_tokens


@dataclass
class BatchGenerationResult:
    """What a batched generation produced.

    Attributes:
        rows: one :class:`GenerationResult` per input row, in input order.
            A row's ``stats`` count its own tokens, drafts and acceptances (equal to its B = 1
            run's under greedy decoding); its ``*_forward_passes`` count the batched passes it
            took part in (a row drafts as many tokens as the batch's longest proposal), and its
            ``*_seconds`` are the wall seconds of those passes (shared with the other rows).
        stats: pooled counters over all rows (so pass counters are row-passes, summed over
            rows); ``target_seconds`` / ``draft_seconds`` are the batch's wall seconds (not the
            sum over rows), so ``num_emitted_tokens`` divided by their sum is the batch
            throughput in tokens/s.
        target_calls / draft_calls: batched model calls actually made (prefill included).
    """

    rows: list = field(default_factory=list)
    stats: DecodingStats = field(default_factory=DecodingStats)
    target_calls: int = 0
    draft_calls: int = 0

    @property
    def token_ids(self) -> list[list[int]]:
        """The new tokens of each row (``list[list[int]]``)."""
        return [r.token_ids for r in self.rows]


def pool_stats(rows: list[GenerationResult], k: int, target_seconds: float, draft_seconds: float) -> DecodingStats:
    """The rows' counters summed (:meth:`DecodingStats.merge`); ``target_seconds`` / ``draft_seconds`` are the
    batch's wall seconds, given, not the sum over rows."""
    pooled = DecodingStats(num_speculative_tokens=k)
    for r in rows:
        pooled = pooled.merge(r.stats)
    pooled.target_seconds, pooled.draft_seconds = target_seconds, draft_seconds
    return pooled
