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

    A precision-lowered copy of the target itself (``derived:bf16`` / ``derived:fp8``, whose
    :func:`specdec.models.derived.derive_draft` records its source module) skips its own prompt
    prefill: the loop runs the target's prefill as a plain step and the drafter adopts the
    target's prompt KV cast to its own dtype (:meth:`can_adopt_prefix`, :meth:`adopt_prefix`).
    The output stays exactly the target's (the target verifies every token); only the draft's
    view of the prompt comes from the target. Measured on SmolLM2 (2 CPU cores, 12 Spec-Bench
    prompts): it pays at every prompt length (one plain target step costs less than a draft
    prefill plus the drafts it would enable), most on long prompts (RAG: 0.65x -> 1.0x).
    int8/int4 copies (monitoring recipes) and stale drafts keep their own prefill, so their
    acceptance is what the draft alone proposes.

    Args:
        model: a transformers causal LM whose vocabulary is compatible with the target's
            (see :func:`specdec.check_pair_compatible`).
    """

    #: prompts at least this long are prefilled once, by the target, for both models
    ADOPT_PREFIX_MIN_TOKENS = 1

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

    def can_adopt_prefix(self, target, prompt_len: int) -> bool:
        """True when this draft is a precision-lowered copy of ``target`` itself (same KV layout;
        recipe ``adopts_target_prefix``) and the prompt has >= :attr:`ADOPT_PREFIX_MIN_TOKENS` tokens."""
        source = getattr(self.model, "derived_source", None)
        recipe = getattr(self.model, "derived_recipe", None)
        return (prompt_len >= self.ADOPT_PREFIX_MIN_TOKENS and getattr(recipe, "adopts_target_prefix", False)
                and source is not None and source() is target)

    def adopt_prefix(self, target_cache, positions: int) -> None:
        """Take the first ``positions`` positions of the target's KV cache (cast to the draft's
        dtype) as this draft's cache, instead of computing them."""
        from specdec.core.kv import copy_cache_prefix

        dtype = self.model.get_input_embeddings().weight.dtype
        self.cache = copy_cache_prefix(target_cache, self.model, positions, dtype)
        self.num_cached = positions

    def rollback(self, num_valid: int) -> None:
        """Keep only the first ``num_valid`` positions in the draft KV cache."""
        if self.num_cached > num_valid:
            crop_cache(self.cache, num_valid)
            self.num_cached = num_valid


class NgramDrafter:
    """Prompt-lookup drafter: copy the continuation of an earlier occurrence of the context's suffix.

    For n from ``max_ngram`` down to ``min_ngram``, find the most recent earlier occurrence of the
    last n tokens in the context (prompt + generated); propose the tokens that followed it. A miss
    proposes nothing, and the step is a plain target step; lookups go through an incremental
    index (:mod:`specdec.core.ngram_index`), so a miss costs a few dict reads, not a scan.

    A short match is weak evidence, and every rejected draft token still widens the target's
    verification pass, so the proposal length depends on the match length n:
    ``min(k, match_tokens[n - 1])`` tokens (``k`` for n beyond the tuple). The defaults (one
    token after a 1-token match, k after a match of 2 or more) were chosen by measurement against
    transformers' prompt lookup on Spec-Bench (benchmarks/results/ngram_defaults.md).
    ``q`` is one-hot on each proposed token, so acceptance is ``p(x)`` and the residual is ``p``
    with ``x`` removed: sampling stays exactly the target's.

    Args:
        max_ngram: longest suffix to match (tokens), >= min_ngram.
        min_ngram: shortest suffix to match (tokens), >= 1.
        match_tokens: most tokens proposed after a match of 1, 2, ... tokens (each >= 1); ``()``
            proposes k after any match (the classic prompt lookup).
        first_occurrence: continue the earliest occurrence of the suffix instead of the most
            recent one (transformers' prompt lookup takes the earliest).
    Raises:
        ValueError: on invalid sizes.
    """

    DEFAULT_MATCH_TOKENS: tuple[int, ...] = (1,)

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, match_tokens: tuple[int, ...] | None = None,
                 first_occurrence: bool = False) -> None:
        if min_ngram < 1 or max_ngram < min_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        match_tokens = self.DEFAULT_MATCH_TOKENS if match_tokens is None else tuple(match_tokens)
        if any(isinstance(m, bool) or not isinstance(m, int) or m < 1 for m in match_tokens):
            raise ValueError(f"match_tokens must be ints >= 1, got {match_tokens!r}")
        from specdec.core.ngram_index import IndexPool

        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.match_tokens = match_tokens
        self.forward_passes = 0
        self.first_occurrence = first_occurrence
        self._index = IndexPool(max_ngram, min_ngram, first=first_occurrence)

    def reset(self) -> None:
        """Drop the lookup indexes (they are rebuilt on demand; results never depend on them)."""
        self._index.clear()

    def rollback(self, num_valid: int) -> None:
        """No cache; kept for the protocol."""

    def budget(self, match_len: int, k: int) -> int:
        """Tokens proposed after a match of ``match_len`` tokens when up to ``k`` are allowed."""
        cap = self.match_tokens[match_len - 1] if match_len <= len(self.match_tokens) else k
        return min(k, cap)

    def lookup(self, context: list[int], k: int) -> list[int]:
        """The continuation proposed for ``context``: at most ``k`` tokens, fewer after a short
        match (:meth:`budget`); empty on a miss."""
        if k <= 0 or len(context) < 2:
            return []
        m = self._index.match(context)
        if m is None:
            return []
        n, start = m
        return list(context[start + n : start + n + self.budget(n, k)])

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


