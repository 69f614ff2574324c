"""EAGLE-3 head as a drafter: drafts from the target's aux hidden states and its own states beyond them.

The engines' scheme (vLLM ``vllm/v1/spec_decode/eagle.py``; speculators' TTT training in
``Eagle3DraftModel.forward``): the head's cache entry at position ``t`` is computed from the token
``x[t + 1]`` (embedded) and the target's aux features ``g[t]`` at position ``t`` (through ``fc``);
its logits propose ``x[t + 2]``. With a context of ``n`` tokens whose first ``n - 1`` positions the
target has already run (the last token, the recovered/bonus one, is fed to the target with the
drafts), one catch-up pass over the new entries ``t < n - 1`` proposes the first draft; each further
draft is one pass over ``(draft, head's own state at the previous entry)`` at the next position.

After verification (:meth:`Eagle3Drafter.rollback`) the head keeps only the entries computed from
target features (the draft-chain entries are dropped, as the engines overwrite them with the
target's features of the now-verified tokens), and the features of rejected positions are dropped.

Before the target has run at all (the first step) there are no features: the head proposes nothing
and that step is a plain target step (the prefill), as in vLLM, where the first draft follows the
target's prefill.

Tokens outside the draft vocabulary get q = 0: draft logits are scattered to target ids through
``d2t`` with ``-inf`` elsewhere (:meth:`Eagle3Head.target_logits`).
"""

from __future__ import annotations

import torch

from specdec.core.sampling import logits_to_probs, sample

__all__ = ["Eagle3Drafter"]


class Eagle3Drafter:
    """Drafter protocol (:mod:`specdec.core.drafters`) for an EAGLE-3 head, plus target features.

    The loop gives the drafter the target's aux hidden states after each target pass
    (:meth:`add_target_features`; the loop captures them when the drafter has
    :attr:`target_layer_ids`, see :func:`specdec.core.features.capture_features`).

    Args:
        head: an :class:`specdec.models.eagle3.head.Eagle3Head` (or any module with its ``combine``,
            ``forward``, ``target_logits``, ``to_target_ids`` and ``new_cache``).
        layer_ids: the target layer ids whose hidden states the head reads (resolved against the
            target: the config's, or the default ``[2, L // 2, L - 3]``).
    """

    def __init__(self, head, layer_ids) -> None:
        self.head = head
        self.target_layer_ids = tuple(int(i) for i in layer_ids)
        self.forward_passes = 0
        self.reset()

    def reset(self) -> None:
        """Drop the head cache and the stored target features (before each new prompt)."""
        self.cache = self.head.new_cache(1)
        self.features: torch.Tensor | None = None  # [n_f, F]: target features of positions 0..n_f-1
        self.num_fed = 0  # head cache entries computed from target features (positions 0..num_fed-1)

    @property
    def num_features(self) -> int:
        return 0 if self.features is None else self.features.shape[0]

    def add_target_features(self, start: int, features: torch.Tensor) -> None:
        """Record the target's aux features ``[T, F]`` of positions ``start .. start + T - 1``.

        Raises:
            RuntimeError: ``start`` leaves a gap after the stored features.
        """
        if start > self.num_features:
            raise RuntimeError(f"target features start at position {start}, but only {self.num_features} are stored")
        kept = self.features[:start] if self.features is not None else None
        features = features.detach()
        self.features = features if kept is None else torch.cat([kept, features.to(kept.dtype)], dim=0)

    def rollback(self, num_valid: int) -> None:
        """Only the first ``num_valid`` context positions are final: drop later features, the
        draft-chain cache entries and any entry that used a dropped token or feature."""
        if self.features is not None and self.features.shape[0] > num_valid:
            self.features = self.features[:num_valid]
        self.num_fed = max(0, min(self.num_fed, num_valid - 1, self.num_features))
        self.cache.crop(self.num_fed)

    @torch.inference_mode()
    def propose(self, context, k, sampling, vocab_size, generator=None, stop_token_ids=frozenset()):
        """Draft up to ``k`` tokens after ``context`` (list of target ids).

        Returns ``(tokens, q)``: ``q`` float32 ``[len(tokens), vocab_size]``, or None under greedy
        sampling. Proposes nothing (a plain target step) until the target has run over all but the
        last context token.
        """
        n = len(context)
        if k <= 0 or n < 2 or self.num_features < n - 1:
            return [], (None if sampling.is_greedy else torch.empty(0, vocab_size))
        start = min(self.num_fed, n - 2)
        self.cache.crop(start)
        device = self.head.fc.weight.device
        ids = torch.tensor([context[start + 1:n]], dtype=torch.long, device=device)
        hidden = self.head.combine(self.features[start:n - 1].to(device))[None]
        positions = torch.arange(start, n - 1, device=device)[None]
        state, logits = self.head(ids, hidden, positions, self.cache)
        self.forward_passes += 1
        self.num_fed = n - 1
        tokens, qs = [], []
        for i in range(k):
            z = self.head.target_logits(logits[0, -1], vocab_size)
            if sampling.is_greedy:
                x = int(z.argmax())
            else:
                q = logits_to_probs(z, sampling)
                x = sample(q, generator)
                qs.append(q)
            tokens.append(x)
            if x in stop_token_ids or i == k - 1:
                break
            ids = torch.tensor([[x]], dtype=torch.long, device=device)
            pos = torch.tensor([[n - 1 + i]], device=device)
            state, logits = self.head(ids, state[:, -1:], pos, self.cache)
            self.forward_passes += 1
        return tokens, (None if sampling.is_greedy else torch.stack(qs))
