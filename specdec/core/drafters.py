"""Drafters: where the proposed tokens and their draft distributions q come from.

ONE protocol (:class:`Drafter`) for every drafter and both decoding loops: a drafter is written
once and drafts for a batch of rows; B = 1 decoding (:func:`specdec.speculative_generate`) is a
batch of one row, batched decoding (:func:`specdec.speculative_generate_batch`) hands it every
active row. Per call of :func:`~specdec.speculative_generate` / ``_batch``:

1. ``start(contexts)``: a new batch; ``contexts[b]`` is row b's prompt (token ids). Drops every
   per-batch state (caches, lookup indexes).
2. Each step: ``propose(contexts, limits, sampling, vocab_size, generator, stop_token_ids) ->``
   :class:`Proposal`. ``contexts[b]`` is active row b's prompt + tokens emitted so far; row b
   proposes at most ``limits[b]`` tokens (0 allowed), and its proposal ends right after a drafted
   stop token. ``sampling`` is a :class:`~specdec.core.config.ProposalSampling`: the
   :class:`~specdec.core.config.SamplingConfig` plus the proposal rule (``draft_sampling``:
   ``"sampled"`` x ~ q, or ``"argmax"`` as vLLM/SGLang) and the draft-length policy
   (``assistant_confidence_threshold``); a model-based drafter picks each token with
   :func:`specdec.core.sampling.draft_step`, which applies both. ``Proposal.q`` holds the
   distributions the tokens were drawn from; ``None`` means q one-hot on the tokens (greedy, the
   argmax rule, lookup: the loops verify ids directly under greedy, else with one-hot q). A row may
   propose nothing (an n-gram miss, or a head that has no target features yet): the step is then
   a plain target step for that row.
3. One target pass verifies every row, then ``accept(num_accepted, next_tokens, features)``: row b
   kept its first ``num_accepted[b]`` drafts, then emitted ``next_tokens[b]`` (the recovered or
   bonus token; :data:`~specdec.core.sampling.NO_NEXT_TOKEN` where an accepted stop token ended
   the row). A drafter with a cache rolls back everything after the verified prefix here.
4. ``select(rows)``: only these active rows (LongTensor of indices into the current rows) remain;
   finished rows leave the batch (B = 1: ``[]`` when the row finishes early is never sent; the loop
   just stops).

``forward_passes`` counts the drafter's own model passes (0 for lookup).

**Target features (optional).** A drafter that reads the target's hidden states (an EAGLE-3 head)
sets ``target_layer_ids: tuple[int, ...]`` (``None``, :class:`DrafterBase`'s default: it reads none, and the target is
run without feature hooks: costs nothing). Index semantics are vLLM's (what it feeds EAGLE-3 heads
and what ``speculators`` trains on; :mod:`specdec.core.features`): ``i`` is the residual stream
entering decoder layer ``i`` (``hidden_states + residual`` before layer ``i``; 0 = the token
embeddings), i.e. HF ``hidden_states[i]`` for ``i < num_hidden_layers``; ``num_hidden_layers`` is
the last layer's output *before* the final norm (HF's ``hidden_states[-1]`` is after it). Both loops
then run the prefill and every verification pass with feature hooks and hand ``accept`` a
:class:`TargetFeatures`: for each row, the features of every position that pass fed (the row's
pending tokens -- the prompt at the prefill, afterwards the previous step's recovered/bonus token
(plus the last draft, for an engine that feeds it; here never) -- followed by this step's
proposed drafts), and how many of those are now verified (the pending tokens + the accepted
drafts). The drafter extends its own state from the verified positions and drops the rest. The
first pass is the prefill: a head that has no features yet proposes nothing at step 1 (as the
engines do: the target's prefill emits the first token, then the head drafts).

Implementations: :class:`ModelDrafter` (a draft causal LM with its own KV cache: a plain
``DynamicCache`` for one row, a masked cache for several, see :mod:`specdec.core.kv`; derived
precision-lowered copies of the target adopt the target's prompt KV at B = 1) and
:class:`NgramDrafter` (prompt lookup decoding, Saxena 2023; vLLM's ``ngram`` method: no model,
one-hot ``q``, so the rejection sampler stays exact).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from specdec.core.config import SamplingConfig
from specdec.core.kv import copy_cache_prefix, left_pad, new_kv, SingleKV
from specdec.core.sampling import NO_NEXT_TOKEN, draft_step

__all__ = ["Drafter", "DrafterBase", "DrafterWrapper", "Proposal", "TargetFeatures", "ModelDrafter", "NgramDrafter",
           "as_drafter", "fit_vocab", "check_draft_embeds", "limit_at_stop", "unwrap_drafter"]


@dataclass
class Proposal:
    """What a drafter proposed for the active rows (see the module docstring).

    Attributes:
        tokens: LongTensor ``[B, k]`` (slots at or beyond ``num_drafts[b]`` are padding).
        q: float32 ``[B, k, V]`` (V = the target's vocabulary): the distribution each token was
            drawn from (one-hot for lookup); ``None`` under greedy sampling (q one-hot on ``tokens``).
        num_drafts: LongTensor ``[B]``: real proposals per row (<= its limit, cut after a stop token).
        forward_passes: draft model passes this proposal took (0 for lookup).
        confidence: float32 ``[B, k]`` or None: each drafted token's confidence (its probability
            under the draft's processed distribution, :func:`~specdec.core.sampling.draft_step`),
            filled when ``sampling.assistant_confidence_threshold`` is set (0 records without
            stopping); None otherwise or for lookup.
    """

    tokens: torch.Tensor
    q: torch.Tensor | None
    num_drafts: torch.Tensor
    forward_passes: int = 0
    confidence: torch.Tensor | None = None

    @classmethod
    def empty(cls, rows: int, vocab_size: int, sampling: SamplingConfig, device=None) -> "Proposal":
        """No proposal for any of ``rows`` rows (``q`` None under greedy, else ``[rows, 0, V]``)."""
        q = None if sampling.is_greedy else torch.zeros(rows, 0, vocab_size, device=device)
        return cls(torch.zeros(rows, 0, dtype=torch.long, device=device), q,
                   torch.zeros(rows, dtype=torch.long, device=device))

    def row(self, b: int) -> list[int]:
        """Row ``b``'s proposed ids (one host read)."""
        return self.tokens[b, : int(self.num_drafts[b])].tolist()


@dataclass
class TargetFeatures:
    """The target's hidden states for a drafter that asked for them (``target_layer_ids``).

    Attributes:
        hidden: ``[B, n, len(target_layer_ids) * hidden_size]`` in the target's dtype and device:
            ``hidden[b, :num_fed[b]]`` are the features of the positions row b fed to this target
            pass, in order (pending tokens, then the proposed drafts); the rest is padding. The
            ``j``-th fed position's feature is computed from the tokens up to and including it
            (it predicts the token after it). Layer blocks are concatenated in
            ``target_layer_ids`` order (:func:`specdec.core.features.capture_features`).
        num_fed: LongTensor ``[B]``: positions row b fed (pending tokens + its proposed drafts).
        num_verified: LongTensor ``[B]``: the first this-many fed positions are verified (pending
            tokens + accepted drafts); the positions after them were rejected (or are beyond an
            accepted stop token) and must be dropped. The token after the last verified position
            is ``next_tokens[b]`` of the same ``accept`` call.
    """

    hidden: torch.Tensor
    num_fed: torch.Tensor
    num_verified: torch.Tensor


@runtime_checkable
class Drafter(Protocol):
    """The one drafter protocol (see the module docstring). Every member is real: the loops read them
    directly. :class:`DrafterBase` gives the ones most drafters leave alone their defaults
    (``target_layer_ids`` and ``model`` None, no prefix adoption)."""

    forward_passes: int
    #: target layers whose hidden states ``accept`` needs (:class:`TargetFeatures`); None: none
    target_layer_ids: tuple[int, ...] | None
    #: the draft causal LM, for the context-length and sliding-window checks; None: no draft LM
    model: torch.nn.Module | None

    def start(self, contexts: list[list[int]]) -> None: ...

    def propose(self, contexts: list[list[int]], limits: list[int], sampling: SamplingConfig, vocab_size: int,
                generator: torch.Generator | None, stop_token_ids: frozenset[int]) -> Proposal: ...

    def accept(self, num_accepted: list[int], next_tokens: list[int], features: TargetFeatures | None = None) -> None: ...

    def select(self, rows: torch.Tensor) -> None: ...

    def can_adopt_prefix(self, target: torch.nn.Module, prompt_len: int) -> bool: ...

    def adopt_prefix(self, target_cache, positions: int) -> None: ...


class DrafterBase:
    """Defaults of the :class:`Drafter` members a drafter may leave alone; subclass it and write
    ``start``/``propose``/``accept``/``select``.

    ``target_layer_ids = None`` (reads no target features: the target runs without feature hooks),
    ``model = None`` (no draft LM to check), ``forward_passes = 0``, :meth:`can_adopt_prefix` False
    (B = 1 never skips the drafter's own prefill), :meth:`adopt_prefix` refused, :attr:`timed_module`
    the draft LM (None: a drafter without a network, whose proposals cost no forward pass).
    """

    forward_passes: int = 0
    target_layer_ids: tuple[int, ...] | None = None
    model: torch.nn.Module | None = None

    @property
    def timed_module(self) -> torch.nn.Module | None:
        """The module whose forward passes are this drafter's cost (validation times its passes)."""
        return self.model

    def can_adopt_prefix(self, target, prompt_len: int) -> bool:
        """Whether, at B = 1, this drafter takes the target's prompt KV instead of its own prefill: no."""
        return False

    def adopt_prefix(self, target_cache, positions: int) -> None:
        """Take the target's prompt KV (only called after :meth:`can_adopt_prefix` said True).

        Raises:
            NotImplementedError: this drafter cannot.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot adopt the target's prompt KV")


class DrafterWrapper:
    """A drafter around another one (recorders, probes): every :class:`Drafter` member is written out here
    and forwards to ``inner``; subclasses override the calls they observe.

    No ``__getattr__``: since Python 3.12, ``isinstance(x, Drafter)`` looks members up with
    ``inspect.getattr_static``, which never calls ``__getattr__``, so a forwarding wrapper would stop being a
    drafter there (tests/core/test_drafter_wrappers.py checks every wrapper statically). Drafter-specific
    members (an n-gram's ``lookup``, a head's ``head``) are read from :func:`unwrap_drafter`.

    Args:
        inner: a :class:`Drafter` (a causal LM is wrapped by :func:`as_drafter` first).
    """

    def __init__(self, inner) -> None:
        self.inner = as_drafter(inner)

    @property
    def forward_passes(self) -> int:
        return self.inner.forward_passes

    @forward_passes.setter
    def forward_passes(self, value: int) -> None:
        self.inner.forward_passes = value

    @property
    def target_layer_ids(self) -> tuple[int, ...] | None:
        return self.inner.target_layer_ids

    @property
    def model(self) -> torch.nn.Module | None:
        return self.inner.model

    @property
    def timed_module(self) -> torch.nn.Module | None:
        """The inner drafter's timed module (its ``model`` where it has no ``timed_module``)."""
        return getattr(self.inner, "timed_module", self.inner.model)

    def start(self, contexts: list[list[int]]) -> None:
        self.inner.start(contexts)

    def propose(self, contexts, limits, sampling, vocab_size, generator=None, stop_token_ids=frozenset()) -> Proposal:
        return self.inner.propose(contexts, limits, sampling, vocab_size, generator, stop_token_ids)

    def accept(self, num_accepted, next_tokens, features=None) -> None:
        self.inner.accept(num_accepted, next_tokens, features)

    def select(self, rows: torch.Tensor) -> None:
        self.inner.select(rows)

    def can_adopt_prefix(self, target, prompt_len: int) -> bool:
        return self.inner.can_adopt_prefix(target, prompt_len)

    def adopt_prefix(self, target_cache, positions: int) -> None:
        self.inner.adopt_prefix(target_cache, positions)


def unwrap_drafter(drafter):
    """The innermost drafter under any :class:`DrafterWrapper` layers (``drafter`` itself when it is none)."""
    while isinstance(drafter, DrafterWrapper):
        drafter = drafter.inner
    return drafter


def first_true(flags: torch.Tensor) -> torch.Tensor:
    """Per row of ``flags`` (BoolTensor ``[B, w]``): 1 + the index of the first True, ``w`` if none
    (the number of drafts kept when drafting stops right after the flagged one)."""
    w = flags.shape[1]
    return torch.where(flags.any(dim=1), flags.long().argmax(dim=1) + 1, torch.full_like(flags[:, 0], w, dtype=torch.long))


def limit_at_stop(tokens: torch.Tensor, limits: torch.Tensor, stop: frozenset[int]) -> torch.Tensor:
    """Per-row draft count: ``limits[b]`` (LongTensor ``[B]``) capped at ``tokens.shape[1]``, cut
    right after the first drafted stop token. Returns LongTensor ``[B]``."""
    n = limits.clamp(max=tokens.shape[1])
    if stop and tokens.shape[1]:
        is_stop = torch.isin(tokens, torch.tensor(sorted(stop), device=tokens.device))
        first = torch.where(is_stop.any(dim=1), is_stop.long().argmax(dim=1) + 1, tokens.shape[1])
        n = torch.minimum(n, first)
    return n


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


class ModelDrafter(DrafterBase):
    """A draft causal LM with its own KV cache.

    Per row the cache holds a prefix of the context. ``propose`` first feeds whatever the cache
    lacks (the prompt at the first step, then the recovered/bonus token, plus the last draft after
    a fully accepted block), then drafts autoregressively, one batched pass per token. ``accept``
    rolls the cache back to the verified prefix, so nothing is recomputed from scratch. One row
    uses a plain ``DynamicCache`` (:class:`~specdec.core.kv.SingleKV`), several rows a masked
    cache (:class:`~specdec.core.kv.MaskedKV`).

    A precision-lowered copy of the target itself (``derived:bf16`` / ``derived:fp8``, whose
    :func:`specdec.models.derived.derive_draft` records its source module) skips its own prompt
    prefill: the loop runs the target's prefill as a plain step and the drafter adopts the
    target's prompt KV cast to its own dtype (:meth:`can_adopt_prefix`, :meth:`adopt_prefix`).
    The output stays exactly the target's (the target verifies every token); only the draft's
    view of the prompt comes from the target. It pays at every prompt length (one plain target step
    costs less than a draft prefill plus the drafts it would enable), most on long prompts
    (docs/metrics.md, "Speed").
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
        self.start([])

    def start(self, contexts: list[list[int]]) -> None:
        """New batch: an empty cache; every row's prompt is pending (fed at the first proposal)."""
        self.kv = new_kv(self.model, max(len(contexts), 1))
        self.pending = [list(c) for c in contexts]  # per active row: tokens not yet in the draft cache
        self.last: torch.Tensor | None = None  # the last proposal's tokens [B, k]

    @torch.inference_mode()
    def propose(self, contexts, limits, sampling, vocab_size, generator=None, stop_token_ids=frozenset()) -> Proposal:
        """Draft up to ``max(limits)`` tokens per row (one batched pass each, the proposal rule of
        :func:`~specdec.core.sampling.draft_step`); row b keeps ``limits[b]``, cut after a drafted
        stop token and, with ``sampling.assistant_confidence_threshold``, right after its first
        draft whose confidence is below it (drafting ends once every row has stopped). Greedy or
        the argmax rule: argmax on the device, ``q`` None (one-hot); one host read per block
        without a threshold (the passes' finiteness checks, folded into one), one per step with one.
        Returns a :class:`Proposal` (``q`` float32 ``[B, k, V]`` under the sampled rule).

        Raises:
            ValueError: a pending id the draft cannot embed (:func:`check_draft_embeds`).
            RuntimeError: a row has nothing pending (``accept`` was not called).
        """
        k, rows, device = max(limits, default=0), len(self.pending), self.kv.device
        if k <= 0:
            self.last = None
            return Proposal.empty(rows, vocab_size, sampling, device)
        if not all(self.pending):
            raise RuntimeError("draft cache is ahead of the context; accept() was not called")
        check_draft_embeds(self.embed_rows, [t for row in self.pending for t in row])
        ids, valid = left_pad(self.pending, device)
        tokens, qs, confs, low = [], [], [], []
        limit = torch.tensor(limits, device=device)
        # an argmax proposal folds the passes' checks into one read; a sampled one checks each pass before
        # ``torch.multinomial`` reads its NaN (a RuntimeError on CPU, a device-side assert on CUDA)
        defer = sampling.is_greedy or getattr(sampling, "draft_sampling", "sampled") == "argmax"
        for i in range(k):
            logits = fit_vocab(self.kv.forward(ids, valid, logits_to_keep=1, check=not defer)[:, -1], vocab_size)
            self.forward_passes += 1
            x, q, confidence = draft_step(logits, sampling, generator)
            tokens.append(x)
            if q is not None:
                qs.append(q)
            if confidence is not None:  # draft-length policy: stop after an unconfident draft
                confs.append(confidence)
                low.append(confidence < sampling.assistant_confidence_threshold)
                if bool(torch.stack(low, dim=1).any(dim=1).logical_or(limit <= i + 1).all()):
                    break
            ids, valid = x[:, None], torch.ones(rows, 1, dtype=torch.bool, device=device)
        self.kv.check_pending()  # the block's finiteness checks: one host read, not one per pass
        self.pending = [[] for _ in range(rows)]  # all fed but the last draft, which is only sampled
        self.last = torch.stack(tokens, dim=1)
        num_drafts = limit_at_stop(self.last, limit, stop_token_ids)
        if low:
            num_drafts = torch.minimum(num_drafts, first_true(torch.stack(low, dim=1)))
        q = torch.stack(qs, dim=1) if qs else None
        confidence = torch.stack(confs, dim=1) if confs else None
        return Proposal(self.last, q, num_drafts, forward_passes=len(tokens), confidence=confidence)

    def accept(self, num_accepted, next_tokens, features=None) -> None:
        """Drop the drafts after each row's accepted prefix; queue what the cache now lacks (the
        next token, after the last draft when a full block was accepted: it was never fed)."""
        k = 0 if self.last is None else self.last.shape[1]
        if k:
            self.kv.invalidate_tail(torch.tensor(num_accepted, device=self.kv.device), k - 1)
            drafted = self.last[:, -1].tolist()
        for i, (n, nxt) in enumerate(zip(num_accepted, next_tokens)):
            tail = [drafted[i]] if k and n == k else []
            self.pending[i] = self.pending[i] + tail + ([] if nxt == NO_NEXT_TOKEN else [nxt])
        self.last = None

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (indices into the active rows)."""
        self.kv.select(rows)
        self.pending = [self.pending[i] for i in rows.tolist()]

    def can_adopt_prefix(self, target, prompt_len: int) -> bool:
        """True when this draft is a precision-lowered copy of ``target`` itself (same KV layout;
        recipe ``adopts_target_prefix``) and the prompt has >= :attr:`ADOPT_PREFIX_MIN_TOKENS` tokens."""
        source = getattr(self.model, "derived_source", None)
        recipe = getattr(self.model, "derived_recipe", None)
        return (prompt_len >= self.ADOPT_PREFIX_MIN_TOKENS and getattr(recipe, "adopts_target_prefix", False)
                and source is not None and source() is target)

    def adopt_prefix(self, target_cache, positions: int) -> None:
        """B = 1: take the first ``positions`` positions of the target's KV cache (cast to the
        draft's dtype) as this draft's cache, instead of computing them; nothing stays pending
        (the next :meth:`accept` queues the next token)."""
        dtype = self.model.get_input_embeddings().weight.dtype
        self.kv = SingleKV(self.model, copy_cache_prefix(target_cache, self.model, positions, dtype))
        self.pending = [[]]
        self.last = None


class NgramDrafter(DrafterBase):
    """Prompt-lookup drafter: copy the continuation of an earlier occurrence of the context's suffix.

    For n from ``max_ngram`` down to ``min_ngram``, find the most recent earlier occurrence of the
    last n tokens in the context (prompt + generated); propose the tokens that followed it. A miss
    proposes nothing, and the step is a plain target step; lookups go through an incremental
    index (:mod:`specdec.core.ngram_index`), so a miss costs a few dict reads, not a scan.

    The default matches 3 down to 2 tokens (vLLM's ``prompt_lookup_max = 3``, ``prompt_lookup_min = 2``;
    spec ``ngram``, also ``ngram:3:2``) and proposes nothing after a 1-token match: a short match is weak
    evidence, and on a CPU, where verifying even one drafted token costs about 1.6 one-token passes,
    that is the faster policy (exact replay on 48 Spec-Bench prompts priced with the measured v(n):
    predicted 1.185x against 1.063x for the classic ``min_ngram=1`` and 1.054x for transformers' prompt
    lookup, ahead in every category; benchmarks/results/2026-12-02-ngram-policy-cpu.md). With
    ``min_ngram=1`` (spec ``ngram:3:1``, what pairs registered before the change run) the proposal length
    depends on the match length n: ``min(k, match_tokens[n - 1])`` tokens (``k`` for n beyond the
    tuple), one token after a 1-token match and k after a longer one; where verification is nearly
    free (a GPU) it proposes more for the same cost.
    ``q`` is one-hot on each proposed token, so acceptance is ``p(x)`` and the residual is ``p``
    with ``x`` removed: sampling stays exactly the target's.

    Args:
        max_ngram: longest suffix to match (tokens), >= min_ngram (vLLM's ``prompt_lookup_max``).
        min_ngram: shortest suffix to match (tokens), >= 1 (vLLM's ``prompt_lookup_min``).
        match_tokens: most tokens proposed after a match of 1, 2, ... tokens (each >= 0; 0: such a
            match is treated as a miss); ``()`` proposes k after any match (the classic prompt lookup).
        first_occurrence: continue the earliest occurrence of the suffix instead of the most
            recent one (transformers' prompt lookup takes the earliest).
    Raises:
        ValueError: on invalid sizes.
    """

    DEFAULT_MATCH_TOKENS: tuple[int, ...] = (1,)
    DEFAULT_MAX_NGRAM: int = 3
    DEFAULT_MIN_NGRAM: int = 2

    def __init__(self, max_ngram: int = DEFAULT_MAX_NGRAM, min_ngram: int = DEFAULT_MIN_NGRAM,
                 match_tokens: tuple[int, ...] | None = None, first_occurrence: bool = False) -> None:
        if min_ngram < 1 or max_ngram < min_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        match_tokens = self.DEFAULT_MATCH_TOKENS if match_tokens is None else tuple(match_tokens)
        if any(isinstance(m, bool) or not isinstance(m, int) or m < 0 for m in match_tokens):
            raise ValueError(f"match_tokens must be ints >= 0, got {match_tokens!r}")
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

    def start(self, contexts: list[list[int]]) -> None:
        """New batch: :meth:`reset`."""
        self.reset()

    def accept(self, num_accepted, next_tokens, features=None) -> None:
        """No cache; the lookup reads the contexts."""

    def select(self, rows: torch.Tensor) -> None:
        """No per-row state."""

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

    def proposal(self, context: list[int], k: int, vocab_size: int, stop_token_ids=frozenset()) -> list[int]:
        """One row's proposal: :meth:`lookup`, cut before an id the target lacks (>= ``vocab_size``)
        and right after a stop token."""
        tokens = []
        for x in self.lookup(context, k):
            if x >= vocab_size:
                break  # never propose an id the target lacks
            tokens.append(x)
            if x in stop_token_ids:
                break
        return tokens

    def propose(self, contexts, limits, sampling, vocab_size, generator=None, stop_token_ids=frozenset()) -> Proposal:
        """Each row's :meth:`proposal`, padded to ``[B, k]`` (on the CPU); ``q`` one-hot
        ``[B, k, V]`` (``None`` under greedy sampling, where the loops verify ids directly)."""
        props = [self.proposal(c, lim, vocab_size, stop_token_ids) for c, lim in zip(contexts, limits)]
        k = max((len(t) for t in props), default=0)
        ids = torch.zeros(len(props), k, dtype=torch.long)
        for b, t in enumerate(props):
            ids[b, : len(t)] = torch.tensor(t, dtype=torch.long)
        n = torch.tensor([len(t) for t in props], dtype=torch.long)
        if sampling.is_greedy:
            return Proposal(ids, None, n)
        drafted = torch.arange(k)[None, :] < n[:, None]
        q = torch.zeros(len(props), k, vocab_size).scatter_(2, ids[..., None], drafted[..., None].float())
        return Proposal(ids, q, n)


def as_drafter(drafter) -> Drafter:
    """Wrap a transformers model in :class:`ModelDrafter`; pass drafter objects through.

    Raises:
        TypeError: if ``drafter`` is neither a :class:`Drafter` nor a causal LM (an object of the
            old ``reset/propose/rollback`` protocol is named as such).
    """
    if isinstance(drafter, Drafter):
        return drafter
    if isinstance(drafter, torch.nn.Module) and hasattr(drafter, "config"):
        return ModelDrafter(drafter)
    if hasattr(drafter, "rollback"):
        raise TypeError(f"{type(drafter).__name__} follows the old reset/propose/rollback drafter protocol; "
                        "implement start/propose/accept/select (specdec.core.drafters.Drafter)")
    if all(hasattr(drafter, m) for m in ("start", "propose", "accept", "select")):
        raise TypeError(f"{type(drafter).__name__} lacks members of the drafter protocol (target_layer_ids, model, "
                        "can_adopt_prefix, adopt_prefix): subclass specdec.core.drafters.DrafterBase for their defaults")
    raise TypeError(f"drafter must be a transformers causal LM or a Drafter (e.g. NgramDrafter), got {type(drafter).__name__}")
