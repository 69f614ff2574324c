"""Drafters for batched decoding: every active row proposes at once.

One protocol for every batch drafter (:class:`BatchDrafter`):

* ``propose(contexts, limits, sampling, vocab_size, generator, stop_token_ids) -> BatchProposal``:
  row ``b`` (of the active rows, in order) proposes at most ``limits[b]`` tokens after
  ``contexts[b]`` (prompt + tokens emitted so far); a proposal ends after a drafted stop token;
* ``accept(num_accepted, next_tokens)`` after verification: row ``b`` kept its first
  ``num_accepted[b]`` drafts, then ``next_tokens[b]`` (recovered or bonus) was emitted;
* ``select(rows)`` keeps only the given row indices (finished rows leave the batch);
* ``forward_passes``: batched model calls made so far.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from specdec.core.config import SamplingConfig
from specdec.core.drafters import ModelDrafter, NgramDrafter, check_draft_embeds, fit_vocab
from specdec.core.kv import MaskedKV, left_pad
from specdec.core.sampling import logits_to_probs, sample_rows

__all__ = ["BatchProposal", "BatchDrafter", "BatchModelDrafter", "BatchNgramDrafter", "as_batch_drafter"]


@dataclass
class BatchProposal:
    """What a batch drafter proposed for the active rows.

    Attributes:
        tokens: LongTensor ``[B, k]`` (slots at or beyond ``num_drafts[b]`` are padding).
        q: float32 ``[B, k, V]``: the distribution each token was drawn from (one-hot for n-gram).
        num_drafts: LongTensor ``[B]``: real proposals per row.
        forward_passes: draft model passes this proposal took (0 for n-gram lookup).
    """

    tokens: torch.Tensor
    q: torch.Tensor
    num_drafts: torch.Tensor
    forward_passes: int = 0


class BatchDrafter(Protocol):
    """Protocol every batch drafter follows (see module docstring)."""

    forward_passes: int

    def propose(self, contexts: list[list[int]], limits: list[int], sampling: SamplingConfig, vocab_size: int,
                generator: torch.Generator | None, stop_token_ids: frozenset[int]) -> BatchProposal: ...

    def accept(self, num_accepted: list[int], next_tokens: list[int]) -> None: ...

    def select(self, rows: torch.Tensor) -> None: ...


class BatchModelDrafter:
    """A draft causal LM drafting for every row at once, with a :class:`MaskedKV` cache.

    Each row's pending tokens (the prompt at first, then the recovered/bonus token, plus the
    last draft after a fully accepted block) are fed left-padded, then k tokens are drafted with
    one batched forward pass each.

    Args:
        model: the draft causal LM. contexts: the prompts (token ids), one per row.
    """

    def __init__(self, model, contexts: list[list[int]]) -> None:
        self.model = model
        self.kv = MaskedKV(model, len(contexts))
        self.embed_rows = model.get_input_embeddings().weight.shape[0]
        self.forward_passes = 0
        self.pending = [list(c) for c in contexts]  # per active row: tokens not yet in the draft cache
        self.last_proposal: torch.Tensor | None = None

    def propose(self, contexts, limits, sampling, vocab_size, generator=None, stop_token_ids=frozenset()) -> BatchProposal:
        """Draft ``max(limits)`` tokens per row (one batched pass each); row b keeps ``limits[b]``.

        Raises:
            ValueError: a pending id the draft cannot embed (:func:`check_draft_embeds`).
        """
        k = max(limits, default=0)
        device = self.kv.device
        check_draft_embeds(self.embed_rows, [t for row in self.pending for t in row])
        ids, valid = left_pad(self.pending, device)
        tokens, qs = [], []
        for _ in range(k):
            logits = self.kv.forward(ids, valid, logits_to_keep=1)[:, -1]
            self.forward_passes += 1
            q = logits_to_probs(fit_vocab(logits, vocab_size), sampling)
            x = sample_rows(q, generator)
            tokens.append(x)
            qs.append(q)
            ids, valid = x[:, None], torch.ones(len(self.pending), 1, dtype=torch.bool, device=device)
        rows = len(self.pending)
        toks = torch.stack(tokens, dim=1) if tokens else torch.zeros(rows, 0, dtype=torch.long, device=device)
        q = torch.stack(qs, dim=1) if qs else torch.zeros(rows, 0, vocab_size, device=device)
        self.last_proposal = toks
        num_drafts = limit_at_stop(toks, torch.tensor(limits, device=device), stop_token_ids)
        return BatchProposal(toks, q, num_drafts, forward_passes=k)

    def accept(self, num_accepted: list[int], next_tokens: list[int]) -> None:
        """Drop the drafts after each row's accepted prefix; queue what the cache now lacks."""
        assert self.last_proposal is not None, "accept() before propose()"
        k = self.last_proposal.shape[1]
        self.kv.invalidate_tail(torch.tensor(num_accepted, device=self.kv.device), max(k - 1, 0))
        drafted = self.last_proposal.tolist()
        # the cache never saw the last draft (it was only sampled): feed it again after a full block
        self.pending = [
            ([drafted[i][k - 1]] if k and n == k else []) + [nxt] for i, (n, nxt) in enumerate(zip(num_accepted, next_tokens))
        ]

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (indices into the active rows)."""
        self.kv.select(rows)
        self.pending = [self.pending[i] for i in rows.tolist()]


_IDS_ONLY = SamplingConfig()  # greedy: NgramDrafter.propose returns ids without building q


class BatchNgramDrafter:
    """Prompt lookup (:class:`~specdec.core.drafters.NgramDrafter`) for every row; one-hot ``q``."""

    def __init__(self, ngram: NgramDrafter) -> None:
        self.ngram = ngram
        self.forward_passes = 0

    def propose(self, contexts, limits, sampling, vocab_size, generator=None, stop_token_ids=frozenset()) -> BatchProposal:
        """Each row's lookup proposal (:meth:`NgramDrafter.propose`), padded to ``[B, k]``; q one-hot."""
        device = torch.device("cpu")
        props = [self.ngram.propose(c, lim, _IDS_ONLY, vocab_size, None, stop_token_ids)[0] for c, lim in zip(contexts, limits)]
        k = max((len(t) for t in props), default=0)
        ids = torch.zeros(len(props), k, dtype=torch.long, device=device)
        for b, t in enumerate(props):
            if t:
                ids[b, : len(t)] = torch.tensor(t, dtype=torch.long, device=device)
        q = torch.zeros(len(props), k, vocab_size, device=device)
        n = torch.tensor([len(t) for t in props], dtype=torch.long, device=device)
        drafted = torch.arange(k, device=device)[None, :] < n[:, None]
        q.scatter_(2, ids[..., None], drafted[..., None].float())
        return BatchProposal(ids, q, n)

    def accept(self, num_accepted: list[int], next_tokens: list[int]) -> None:
        """No cache; the lookup reads the contexts."""

    def select(self, rows: torch.Tensor) -> None:
        """No per-row state."""


def limit_at_stop(tokens: torch.Tensor, limits: torch.Tensor, stop: frozenset[int]) -> torch.Tensor:
    """Per-row draft count: ``limits[b]``, cut right after the first drafted stop token."""
    n = limits.clamp(max=tokens.shape[1])
    if stop and tokens.shape[1]:
        is_stop = torch.isin(tokens, torch.tensor(sorted(stop), device=tokens.device))
        first = torch.where(is_stop.any(dim=1), is_stop.long().argmax(dim=1) + 1, tokens.shape[1])
        n = torch.minimum(n, first)
    return n


def as_batch_drafter(drafter, contexts: list[list[int]]) -> BatchDrafter:
    """The batch drafter for ``drafter`` (a draft causal LM, ModelDrafter or NgramDrafter).

    Raises:
        TypeError: any other drafter.
    """
    if isinstance(drafter, NgramDrafter):
        return BatchNgramDrafter(drafter)
    if isinstance(drafter, ModelDrafter):
        return BatchModelDrafter(drafter.model, contexts)
    if isinstance(drafter, torch.nn.Module) and hasattr(drafter, "config"):
        return BatchModelDrafter(drafter, contexts)
    raise TypeError(
        f"batched decoding supports a draft causal LM, ModelDrafter or NgramDrafter, got {type(drafter).__name__}"
    )
