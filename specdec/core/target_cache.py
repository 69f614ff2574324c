"""The target's side of a speculative step: its KV cache for the active rows, and the one pass that scores them.

The one speculative loop (:func:`specdec.core.loops.speculate`) drives a :class:`TargetCache` and never
looks inside it. Each step it asks the cache to :meth:`~TargetCache.score` the rows' pending tokens plus their
drafts in one target forward pass, verifies the scores with :func:`~specdec.core.sampling.verify_drafts`, then
asks the cache to :meth:`~TargetCache.commit` the outcomes (roll back to each row's verified prefix). Two
strategies, chosen by the batch size at the entry points:

* :class:`StaticTargetCache`: one row (B = 1) on a preallocated static cache (:func:`specdec.core.kv.new_cache`,
  the graphed pass on CUDA), fed as a list of ids, cropped to the verified prefix. Its greedy pass folds the
  finiteness check into the one host read of the argmax ids. A draft derived from this target may adopt the
  target's prompt KV after a plain first step (:meth:`adopts`, :meth:`hand_prefix`).
* :class:`MaskedTargetCache`: B rows on :class:`~specdec.core.kv.MaskedKV`. Rows accept different numbers of
  drafts, so rejected drafts become masked-out columns, and finished rows leave the batch (:meth:`select`).

KV-cache discipline (both): the cache holds a prefix of each row's sequence; a step feeds the tokens it lacks
plus the k drafts in one pass, then keeps only the verified prefix (the recovered or bonus token stays pending
and is fed at the next step). The first pass is the prefill. Nothing is recomputed from scratch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from specdec.core.config import SamplingConfig
from specdec.core.drafters import Drafter, Proposal, TargetFeatures
from specdec.core.finite import checked_argmax
from specdec.core.kv import MaskedKV, compact_rows, crop_cache, forward_tokens_features, new_cache
from specdec.core.sampling import logits_to_probs

__all__ = ["TargetScores", "TargetCache", "StaticTargetCache", "MaskedTargetCache"]


@dataclass
class TargetScores:
    """One verification pass, in the form :func:`~specdec.core.sampling.verify_drafts` takes.

    Attributes:
        target_argmax: greedy decoding: per row, ``len(drafts[b]) + 1`` argmax ids (host ints); else None.
        p: sampling: float32 ``[B, w + 1, V]`` target distributions (w = the block's draft width); else None.
        hidden: the aux hidden states of every fed slot when the drafter reads target features, else None.
    """

    target_argmax: list[list[int]] | None = None
    p: torch.Tensor | None = None
    hidden: torch.Tensor | None = None


class TargetCache(Protocol):
    """What the speculative loop needs of the target side (see the module docstring)."""

    def score(self, proposal: Proposal, drafts: list[list[int]], sampling: SamplingConfig,
              layer_ids: tuple[int, ...] | None) -> TargetScores: ...

    def commit(self, num_accepted: list[int], drafts: list[list[int]],
               hidden: torch.Tensor | None) -> TargetFeatures | None: ...

    def select(self, rows: torch.Tensor) -> None: ...

    def feed_next(self, next_tokens: list[int]) -> None: ...

    def adopts(self, drafter: Drafter, max_new_tokens: int) -> bool: ...

    def hand_prefix(self, drafter: Drafter) -> None: ...


def _check_vocab(logits: torch.Tensor, vocab_size: int) -> None:
    if logits.shape[-1] != vocab_size:
        raise ValueError(f"target logits have {logits.shape[-1]} entries, expected {vocab_size}")


class StaticTargetCache:
    """One row (B = 1) on a static target cache.

    Args:
        target: transformers causal LM.
        context: the row's live token list (prompt + emitted tokens), which the loop extends after each
            step; the cache holds its first :attr:`num_cached` positions.
        need: positions to preallocate (prompt + ``max_new_tokens`` + k + 1).
        vocab_size: the target's vocabulary (its output embedding rows).
    """

    def __init__(self, target, context: list[int], need: int, vocab_size: int) -> None:
        self.target, self.context, self.vocab_size = target, context, vocab_size
        self.cache = new_cache(target, static=True, need=need)
        self.num_cached = 0  # positions of `context` held in the cache
        self._num_fed = 0

    def score(self, proposal: Proposal, drafts: list[list[int]], sampling: SamplingConfig,
              layer_ids: tuple[int, ...] | None) -> TargetScores:
        """One target pass over the tokens the cache lacks, then the row's drafts (``fed``, host ids).

        Returns:
            the argmax ids of the last ``len(drafts[0]) + 1`` positions (greedy; one host read with the
            finiteness check folded in), or their distributions ``p [1, n + 1, V]``; the features
            ``[1, len(fed), D]`` when ``layer_ids`` is set.
        Raises:
            ValueError: the target's logits do not have ``vocab_size`` entries.
            NonFiniteLogits: non-finite target logits.
        """
        fed = self.context[self.num_cached:] + drafts[0]
        end = self.num_cached + len(fed)
        self._num_fed = len(fed)
        logits, hidden = forward_tokens_features(self.target, fed, self.cache, len(drafts[0]) + 1, layer_ids,
                                                 check=not sampling.is_greedy)
        _check_vocab(logits, self.vocab_size)
        if sampling.is_greedy:  # q is one-hot on the drafts or irrelevant: the target's argmax decides
            return TargetScores(target_argmax=[checked_argmax(self.target, logits, end)], hidden=hidden)
        return TargetScores(p=logits_to_probs(logits, sampling)[None], hidden=hidden)

    def commit(self, num_accepted: list[int], drafts: list[list[int]],
               hidden: torch.Tensor | None) -> TargetFeatures | None:
        """Crop the cache to the verified prefix: the tokens fed before the drafts plus the row's
        ``num_accepted[0]`` accepted drafts (the rejected ones leave; the recovered / bonus token stays pending).
        Returns the row's features of the fed positions and how many are verified (None without features)."""
        n_acc = num_accepted[0]
        fed_before_drafts = self._num_fed - len(drafts[0])
        self.num_cached += fed_before_drafts + n_acc
        crop_cache(self.cache, self.num_cached)
        if hidden is None:
            return None
        return TargetFeatures(hidden, torch.tensor([self._num_fed]), torch.tensor([fed_before_drafts + n_acc]))

    def select(self, rows: torch.Tensor) -> None:
        """One row: it only ever leaves when the generation ends."""

    def feed_next(self, next_tokens: list[int]) -> None:
        """Nothing to do: the next token is in the live context, past :attr:`num_cached`."""

    def adopts(self, drafter: Drafter, max_new_tokens: int) -> bool:
        """True when ``drafter`` (a copy derived from this target) takes the target's prompt KV after a plain
        first step instead of prefilling its own."""
        return max_new_tokens > 0 and drafter.can_adopt_prefix(self.target, len(self.context))

    def hand_prefix(self, drafter: Drafter) -> None:
        """Give ``drafter`` the verified prefix of this cache (after the first step's :meth:`commit`)."""
        drafter.adopt_prefix(self.cache, self.num_cached)


class MaskedTargetCache:
    """B rows on a :class:`~specdec.core.kv.MaskedKV`.

    Args:
        target: transformers causal LM.
        input_ids: LongTensor ``[B, L]`` left-padded prompts (padding ids already zeroed).
        mask: BoolTensor ``[B, L]`` (True = token).
        vocab_size: the target's vocabulary (its output embedding rows).
    """

    def __init__(self, target, input_ids: torch.Tensor, mask: torch.Tensor, vocab_size: int) -> None:
        self.kv = MaskedKV(target, input_ids.shape[0])
        self.device, self.vocab_size = self.kv.device, vocab_size
        # the tokens not yet in the cache: the prompts, then each row's recovered / bonus token
        self.pending_ids, self.pending_valid = input_ids.to(self.device), mask.to(self.device)
        self._block_valid = self._num_drafts = None  # the last scored block's slots
        self._width = 0

    def score(self, proposal: Proposal, drafts: list[list[int]], sampling: SamplingConfig,
              layer_ids: tuple[int, ...] | None) -> TargetScores:
        """One target pass over every row's block: pending tokens ``[B, m]`` left-padded, then the proposal's
        drafts ``[B, w]`` (slots at or beyond ``num_drafts[b]`` invalid).

        Returns:
            per row the argmax ids of its drafted and bonus slots (greedy; one host read), or ``p [B, w + 1, V]``;
            the features ``[B, m + w, D]`` of every slot when ``layer_ids`` is set.
        Raises:
            ValueError: the target's logits do not have ``vocab_size`` entries.
            NonFiniteLogits: non-finite target logits at a valid slot.
        """
        tokens, num_drafts = proposal.tokens.to(self.device), proposal.num_drafts.to(self.device)
        width = tokens.shape[1]
        block = torch.cat([self.pending_ids, tokens], dim=1)
        slots = torch.arange(width, device=self.device)[None, :] < num_drafts[:, None]
        self._block_valid, self._num_drafts = torch.cat([self.pending_valid, slots], dim=1), num_drafts
        self._width = width
        logits, hidden = self.kv.forward_features(block, self._block_valid, width + 1, layer_ids)
        _check_vocab(logits, self.vocab_size)
        if sampling.is_greedy:
            argmax = [a[: len(d) + 1] for a, d in zip(logits.argmax(dim=-1).tolist(), drafts)]
            return TargetScores(target_argmax=argmax, hidden=hidden)
        return TargetScores(p=logits_to_probs(logits, sampling), hidden=hidden)

    def commit(self, num_accepted: list[int], drafts: list[list[int]],
               hidden: torch.Tensor | None) -> TargetFeatures | None:
        """Keep each row's last pending token + its ``num_accepted[b]`` accepted drafts. Returns the features of
        each row's fed positions, compacted to ``[B, n, D]``, and how many are verified (None without features)."""
        num_accepted = torch.tensor(num_accepted, dtype=torch.long, device=self.device)
        if self._width:  # a block without drafts has nothing to roll back
            self.kv.invalidate_tail(num_accepted + 1, self._width + 1)
        if hidden is None:
            return None
        num_fed = self._block_valid.sum(dim=1)
        return TargetFeatures(compact_rows(hidden, self._block_valid), num_fed,
                              num_fed - self._num_drafts + num_accepted)

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (indices into the active rows) in the cache."""
        self.kv.select(rows)

    def feed_next(self, next_tokens: list[int]) -> None:
        """The recovered / bonus token of each remaining row is fed at the next step."""
        self.pending_ids = torch.tensor(next_tokens, dtype=torch.long, device=self.device)[:, None]
        self.pending_valid = torch.ones(len(next_tokens), 1, dtype=torch.bool, device=self.device)

    def adopts(self, drafter: Drafter, max_new_tokens: int) -> bool:
        """False: prompt adoption is a one-row path (the masked cache has no single-row prefix to hand)."""
        return False

    def hand_prefix(self, drafter: Drafter) -> None:
        raise RuntimeError("a masked target cache hands no prefix (adopts() is False)")
