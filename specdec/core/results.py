"""What a generation returns: per-row tokens and counters, for B = 1 and for batches."""

from __future__ import annotations

from dataclasses import dataclass, field

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
