"""Drafters: where the k proposed tokens and their draft distributions q come from.

Every drafter implements the small protocol used by :func:`specdec.speculative_generate`:

* ``reset()`` before a new prompt;
* ``propose(context, k, sampling, vocab_size, generator, stop_token_ids) -> (tokens, q)`` with
  ``tokens`` a list of at most ``k`` ids and ``q`` a float32 tensor ``[len(tokens), vocab_size]``
  holding the distribution each token was drawn from. Under greedy sampling ``q`` may be
  ``None``: q is then one-hot on the tokens, and the loop verifies ids directly
  (:func:`specdec.core.sampling.verify_greedy`);
* ``rollback(num_valid)`` after verification: only the first ``num_valid`` tokens of the context
  are final; any cached state beyond them is dropped.

``ModelDrafter`` wraps a transformers causal LM with its own KV cache. ``NgramDrafter`` is prompt
lookup decoding (Saxena 2023; vLLM's ``ngram`` method): no model, one-hot ``q``, so the rejection
sampler stays exact.
"""

from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

import torch

from specdec.core.config import SamplingConfig
from specdec.core.kv import crop_cache, forward_tokens, model_device, model_kwargs, new_cache
from specdec.core.sampling import logits_to_probs, sample


@runtime_checkable
class Drafter(Protocol):
    """Protocol every drafter follows (see module docstring)."""

    forward_passes: int

    def reset(self) -> None: ...

    def propose(
        self,
        context: list[int],
        k: int,
        sampling: SamplingConfig,
        vocab_size: int,
        generator: torch.Generator | None,
        stop_token_ids: frozenset[int],
    ) -> tuple[list[int], torch.Tensor]: ...

    def rollback(self, num_valid: int) -> None: ...


def fit_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Map draft logits ``[..., V_draft]`` onto the target vocabulary ``[..., vocab_size]``.

    Rows beyond the shared vocabulary get probability 0: draft ids the target lacks are cut off,
    and target ids the draft lacks are padded with ``-inf`` logits.
    """
    v = logits.shape[-1]
    if v == vocab_size:
        return logits
    if v > vocab_size:
        return logits[..., :vocab_size]
    pad = logits.new_full((*logits.shape[:-1], vocab_size - v), -math.inf)
    return torch.cat([logits, pad], dim=-1)


def check_draft_embeds(draft_vocab: int, tokens) -> None:
    """Raise a clear error when the target produced an id the draft model cannot embed.

    Raises:
        ValueError: an id >= ``draft_vocab`` (the draft's embedding rows) in ``tokens``.
    """
    bad = [t for t in tokens if t >= draft_vocab]
    if bad:
        raise ValueError(
            f"the target produced token id {bad[0]}, but the draft model embeds only {draft_vocab} ids: "
            "use a draft whose embedding covers every id the target can emit"
        )


class ModelDrafter:
    """A draft causal LM with its own KV cache.

    The cache holds a prefix of the context. ``propose`` first feeds whatever the cache lacks
    (the prompt at prefill, or the last accepted/bonus tokens: the catch-up after a bonus token),
    then drafts autoregressively. ``rollback`` crops the cache to the verified prefix, so nothing
    is recomputed from scratch.

    Args:
        model: a transformers causal LM whose vocabulary is compatible with the target's
            (see :func:`specdec.check_pair_compatible`).
    """

    def __init__(self, model) -> None:
        self.model = model
        self.embed_rows = model.get_input_embeddings().weight.shape[0]
        self.forward_passes = 0
        self.reset()

    def reset(self) -> None:
        """Drop the KV cache (call before each new prompt)."""
        self.cache = new_cache(self.model)
        self.num_cached = 0

    def propose(self, context, k, sampling, vocab_size, generator=None, stop_token_ids=frozenset()):
        """Draft up to ``k`` tokens after ``context`` (stops early after a stop token).

        Returns ``(tokens, q)`` with ``q`` float32 ``[len(tokens), vocab_size]``.
        """
        if k <= 0:
            return [], (None if sampling.is_greedy else torch.empty(0, vocab_size))
        pending = list(context[self.num_cached :])
        if not pending:
            raise RuntimeError("draft cache is ahead of the context; rollback was not called")
        check_draft_embeds(self.embed_rows, pending)
        if sampling.is_greedy:
            return self._propose_greedy(pending, k, vocab_size, stop_token_ids), None
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        for _ in range(k):
            logits = forward_tokens(self.model, pending, self.cache, logits_to_keep=1)[-1]
            self.forward_passes += 1
            self.num_cached += len(pending)
            q = logits_to_probs(fit_vocab(logits, vocab_size), sampling)
            x = sample(q, generator)
            tokens.append(x)
            qs.append(q)
            pending = [x]
            if x in stop_token_ids:
                break
        return tokens, torch.stack(qs)

    @torch.inference_mode()
    def _propose_greedy(self, pending: list[int], k: int, vocab_size: int, stop_token_ids) -> list[int]:
        # argmax stays on the device and feeds the next pass: one host read per step, not per token
        ids = torch.tensor([pending], dtype=torch.long, device=model_device(self.model))
        drafted = []
        for _ in range(k):
            logits = self.model(input_ids=ids, **model_kwargs(self.model, self.cache, 1)).logits[0, -1]
            self.forward_passes += 1
            self.num_cached += ids.shape[1]
            x = fit_vocab(logits, vocab_size).argmax()
            drafted.append(x)
            ids = x.view(1, 1)
        tokens = torch.stack(drafted).tolist()
        for i, x in enumerate(tokens):  # stop after a drafted stop token (later drafts are dropped)
            if x in stop_token_ids:
                return tokens[: i + 1]
        return tokens

    def rollback(self, num_valid: int) -> None:
        """Keep only the first ``num_valid`` positions in the draft KV cache."""
        if self.num_cached > num_valid:
            crop_cache(self.cache, num_valid)
            self.num_cached = num_valid


class NgramDrafter:
    """Prompt-lookup drafter: copy the continuation of an earlier occurrence of the context's suffix.

    For n from ``max_ngram`` down to ``min_ngram``, find the most recent earlier occurrence of the
    last n tokens in the context (prompt + generated); propose the (up to ``k``) tokens that
    followed it. A miss proposes nothing, and the step is a plain target step. ``q`` is one-hot on
    each proposed token, so acceptance is ``p(x)`` and the residual is ``p`` with ``x`` removed:
    sampling stays exactly the target's.

    Args:
        max_ngram: longest suffix to match (tokens), >= min_ngram.
        min_ngram: shortest suffix to match (tokens), >= 1.
    Raises:
        ValueError: on invalid sizes.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if min_ngram < 1 or max_ngram < min_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.forward_passes = 0

    def reset(self) -> None:
        """No state to drop; kept for the protocol."""

    def rollback(self, num_valid: int) -> None:
        """No cache; kept for the protocol."""

    def lookup(self, context: list[int], k: int) -> list[int]:
        """The up-to-``k`` continuation tokens for ``context`` (empty on a miss)."""
        n_ctx = len(context)
        if k <= 0:
            return []
        for n in range(min(self.max_ngram, n_ctx - 1), self.min_ngram - 1, -1):
            suffix = context[n_ctx - n :]
            # most recent earlier occurrence whose continuation is inside the context
            for start in range(n_ctx - n - 1, -1, -1):
                if context[start : start + n] == suffix:
                    cont = context[start + n : start + n + k]
                    if cont:
                        return cont
        return []

    def propose(self, context, k, sampling, vocab_size, generator=None, stop_token_ids=frozenset()):
        """Propose the lookup continuation (truncated after a stop token); ``q`` is one-hot
        (``None`` under greedy sampling, where the loop verifies ids directly)."""
        tokens = []
        for x in self.lookup(context, k):
            if x >= vocab_size:
                break  # never propose an id the target lacks
            tokens.append(x)
            if x in stop_token_ids:
                break
        if sampling.is_greedy:
            return tokens, None
        q = torch.zeros(len(tokens), vocab_size)
        if tokens:
            q[torch.arange(len(tokens)), torch.tensor(tokens)] = 1.0
        return tokens, q


def as_drafter(drafter) -> Drafter:
    """Wrap a transformers model in :class:`ModelDrafter`; pass drafter objects through.

    Raises:
        TypeError: if ``drafter`` is neither a drafter nor a causal LM.
    """
    if isinstance(drafter, (ModelDrafter, NgramDrafter)) or isinstance(drafter, Drafter):
        return drafter
    if isinstance(drafter, torch.nn.Module) and hasattr(drafter, "config"):
        return ModelDrafter(drafter)
    raise TypeError(f"drafter must be a transformers causal LM or an NgramDrafter, got {type(drafter).__name__}")


