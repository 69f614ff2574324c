"""EAGLE-3 head as a drafter: drafts from the target's aux hidden states and its own states beyond them.

The engines' scheme (vLLM ``vllm/v1/spec_decode/eagle.py``; speculators' TTT training in
``Eagle3DraftModel.forward``): the head's cache entry at position ``t`` is computed from the token
``x[t + 1]`` (embedded) and the target's aux features ``g[t]`` at position ``t`` (through ``fc``);
its logits propose ``x[t + 2]``. With a context of ``n`` tokens whose first ``n - 1`` positions the
target has already run (the last token, the recovered/bonus one, is fed to the target with the
drafts), one catch-up pass over the new entries ``t < n - 1`` proposes the first draft; each further
draft is one pass over ``(draft, head's own state at the previous entry)`` at the next position.

After verification (:meth:`Eagle3Drafter.accept`) the head keeps only the entries computed from
target features (the draft-chain entries are dropped, as the engines overwrite them with the
target's features of the now-verified tokens), and the features of rejected positions are dropped.

Before the target has run at all (the first step) there are no features: the head proposes nothing
and that step is a plain target step (the prefill), as in vLLM, where the first draft follows the
target's prefill.

Tokens outside the draft vocabulary get q = 0: draft logits are scattered to target ids through
``d2t`` with ``-inf`` elsewhere (:meth:`Eagle3Head.target_logits`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.core.drafters import DrafterBase, Proposal, TargetFeatures
from specdec.core.sampling import draft_step

__all__ = ["Eagle3Drafter"]


@dataclass
class _Row:
    """One row's head state: its cache, the target features of its verified positions, and how many
    head cache entries were computed from target features (entries ``0 .. num_fed - 1``)."""

    cache: object
    features: torch.Tensor | None = None  # [n_f, F]: target features of positions 0..n_f-1
    num_fed: int = 0

    @property
    def num_features(self) -> int:
        return 0 if self.features is None else self.features.shape[0]


class Eagle3Drafter(DrafterBase):
    """The drafter protocol (:mod:`specdec.core.drafters`) for an EAGLE-3 head, reading target features.

    Rows are drafted one after the other, each with its own head cache (a batch costs one head
    pass per row and draft, not one per draft); B = 1 and batches share every line.

    Args:
        head: an :class:`specdec.models.eagle3.head.Eagle3Head` (or any module with its ``combine``,
            ``forward``, ``target_logits`` and ``new_cache``).
        layer_ids: the target layer ids whose hidden states the head reads (resolved against the
            target: the config's, or the default ``[2, L // 2, L - 3]``).
    """

    def __init__(self, head, layer_ids) -> None:
        self.head = head
        self.target_layer_ids = tuple(int(i) for i in layer_ids)
        self.forward_passes = 0
        self.rows: list[_Row] = []

    @property
    def timed_module(self):
        """The head: its passes are the drafter's cost."""
        return self.head

    def start(self, contexts: list[list[int]]) -> None:
        """New batch: empty head caches, no target features yet."""
        self.rows = [_Row(self.head.new_cache(1)) for _ in contexts]

    def accept(self, num_accepted, next_tokens, features: TargetFeatures | None = None) -> None:
        """Append each row's verified target features; drop the draft-chain cache entries.

        Raises:
            ValueError: no features (the loop must pass them: this drafter sets ``target_layer_ids``).
        """
        if features is None:
            raise ValueError("an EAGLE-3 head needs the target's features at every accept()")
        for b, row in enumerate(self.rows):
            new = features.hidden[b, : int(features.num_verified[b])].detach()
            row.features = new if row.features is None else torch.cat([row.features, new.to(row.features.dtype)])
            row.cache.crop(row.num_fed)

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (indices into the active rows)."""
        self.rows = [self.rows[i] for i in rows.tolist()]

    @torch.inference_mode()
    def propose(self, contexts, limits, sampling, vocab_size, generator=None, stop_token_ids=frozenset()) -> Proposal:
        """Each row drafts up to ``limits[b]`` tokens (cut after a drafted stop token); a row whose
        target has not run over all but its last context token (the prefill step) drafts nothing.
        Returns a :class:`Proposal` (``q`` None under greedy; ``forward_passes`` = the most head
        passes one row took, what a batched head would take)."""
        props = [self._row_propose(row, ctx, lim, sampling, vocab_size, generator=generator, stop=stop_token_ids)
                 for row, ctx, lim in zip(self.rows, contexts, limits)]
        k = max((len(t) for t, _ in props), default=0)
        B = len(props)
        tokens = torch.zeros(B, k, dtype=torch.long)
        sampled = not sampling.is_greedy and getattr(sampling, "draft_sampling", "sampled") == "sampled"
        q = torch.zeros(B, k, vocab_size) if sampled else None  # None: one-hot (greedy or the argmax rule)
        for b, (toks, qs) in enumerate(props):
            if toks:
                tokens[b, : len(toks)] = torch.tensor(toks)
                if q is not None:
                    q[b, : len(toks)] = torch.stack(qs).cpu()
        n = torch.tensor([len(t) for t, _ in props], dtype=torch.long)
        return Proposal(tokens, q, n, forward_passes=max((len(t) for t, _ in props), default=0))

    def _row_propose(self, row: _Row, context, k, sampling, vocab_size, *, generator, stop) -> tuple[list[int], list]:
        """One row: a catch-up pass over the new target-fed entries, then one pass per further draft."""
        n = len(context)
        if k <= 0 or n < 2 or row.num_features < n - 1:
            return [], []
        start = min(row.num_fed, n - 2)
        row.cache.crop(start)
        device = self.head.fc.weight.device
        ids = torch.tensor([context[start + 1:n]], dtype=torch.long, device=device)
        hidden = self.head.combine(row.features[start:n - 1].to(device))[None]
        state, logits = self.head(ids, hidden, torch.arange(start, n - 1, device=device)[None], row.cache)
        self.forward_passes += 1
        row.num_fed = n - 1
        tokens, qs = [], []
        tau = getattr(sampling, "assistant_confidence_threshold", None)
        for i in range(k):
            z = self.head.target_logits(logits[0, -1], vocab_size)
            x_row, q, confidence = draft_step(z[None], sampling, generator)  # the proposal rule and tau
            x = int(x_row[0])
            if q is not None:
                qs.append(q[0])
            tokens.append(x)
            if x in stop or i == k - 1 or (confidence is not None and float(confidence[0]) < tau):
                break
            ids = torch.tensor([[x]], dtype=torch.long, device=device)
            state, logits = self.head(ids, state[:, -1:], torch.tensor([[n - 1 + i]], device=device), row.cache)
            self.forward_passes += 1
        return tokens, qs
