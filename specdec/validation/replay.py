"""Greedy replay: the counters speculative decoding would produce, for every k, from one draft pass.

Under greedy decoding the target's continuation ``y`` depends on neither the drafter nor k, and while a
block's drafts match ``y`` they are the draft's argmax on the teacher-forced ``prompt + y``: ONE pass
(:func:`draft_trace`; a tracer per drafter kind in :data:`TRACERS`, one trace class per decoding object, each
rebuilding its blocks) gives every block of every k (:func:`replay_counters`), verified with the core's verifier
(the greedy branch of :func:`~specdec.core.sampling.verify_drafts`) and counted with the decoding loops' own
per-row bookkeeping (:meth:`~specdec.core.results.GenerationResult.record_verified`). A fast trace cannot see a draft model's
tokens after a rejected draft (they never change acceptance; it bounds ``num_draft_tokens``);
``exact=True`` runs the draft there. See docs/metrics.md "Replay".
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from specdec.core.config import ProposalSampling, SamplingConfig
from specdec.core.drafters import DrafterWrapper, ModelDrafter, NgramDrafter, TargetFeatures, fit_vocab, unwrap_drafter
from specdec.core.head_drafter import Eagle3Drafter
from specdec.core.results import GenerationResult
from specdec.core.sampling import verify_drafts
from specdec.core.stats import DecodingStats
from specdec.kinds import DERIVED, EAGLE3, LAYERSKIP, MODEL, NGRAM, KindTable, claiming_kind
from specdec.validation.teacher_forcing import teacher_forced_logits

__all__ = ["DraftTrace", "ModelTrace", "NgramTrace", "HeadTrace", "TraceInput", "TRACERS", "draft_trace", "head_trace", "replay_counters", "replay_grid",
           "pooled", "RecordingDrafter", "first_flip", "target_divergence", "counters_equal", "COMPARED_COUNTERS", "UNSEEN"]

#: greedy proposals that record every token's confidence and never stop for it (threshold 0)
_RECORD_CONFIDENCE = ProposalSampling(assistant_confidence_threshold=0.0)
#: placeholder for a draft token the teacher-forced pass does not see (after a rejection); never a real id
UNSEEN = -2
#: the counters a replay must reproduce exactly (vLLM names, plus the per-position lists)
COMPARED_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_rejected_steps",
                     "accepted_per_position", "drafted_per_position", "num_emitted_tokens")


@dataclass
class DraftTrace:
    """What one teacher-forced pass of a drafter says about a continuation ``y`` of length N: ``margin``, the
    draft's logit margin (top-1 minus top-2) at each position (empty for a lookup); ``adopts_prefix``, decoding
    starts with one plain target step (a draft adopting the target's prompt KV, or a head); ``exact``, every
    counter is exact."""

    margin: list[float] = field(default_factory=list)
    adopts_prefix: bool = False
    exact: bool = False
    #: whether a confidence threshold (tau) can be replayed from this trace
    thresholds: ClassVar[bool] = True

    def block(self, y: list[int], m: int, budget: int, stop: frozenset[int], tau: float | None = None,
              past_stop: bool = False) -> list[int]:
        """The drafts (at most ``budget``) decoding proposes at a block after ``m`` emitted tokens; tau and
        ``past_stop`` as :func:`replay_counters`' threshold and ``drafts_past_stop``; unseen ones :data:`UNSEEN`."""
        raise NotImplementedError

    def replayed(self, m: int, i: int) -> int:  # draft i of the block after m emitted tokens, on the chain
        raise NotImplementedError


@dataclass
class ModelTrace(DraftTrace):
    """A draft model's trace: ``argmax[t]``, its greedy token after ``prompt + y[:t]``, and ``confidence[t]``, its
    top-1 probability there (T = 1, :func:`~specdec.core.sampling.draft_step`'s greedy confidence); exact mode:
    ``free_runs[t]`` (confidences ``free_run_confidence[t]``), its own proposal after ``prompt + y[:t] +
    [argmax[t]]`` where that leaves ``y``."""

    argmax: list[int] = field(default_factory=list)
    confidence: list[float] = field(default_factory=list)
    free_runs: dict[int, list[int]] = field(default_factory=dict)
    free_run_confidence: dict[int, list[float]] = field(default_factory=dict)

    def block(self, y, m, budget, stop, tau=None, past_stop=False):
        drafts: list[int] = []
        left = None  # where the chain left y (the first rejected draft), if it did
        for t in range(m, m + max(budget, 0)):
            confidence = None
            if left is None and t >= len(self.argmax):  # past the end of y (a drafted stop token that was not cut)
                drafts.append(UNSEEN)
            elif left is None:
                drafts.append(self.argmax[t])
                confidence = self.confidence[t] if self.confidence else None
                left = t if drafts[-1] != y[t] else None
            else:  # the draft follows its own (rejected) token: the free run after position `left`
                run, conf, j = self.free_runs.get(left, []), self.free_run_confidence.get(left, []), t - left - 1
                if j >= len(run) and self.exact:  # the exact free run ended (after a stop token): so did the proposal
                    break
                drafts.append(run[j] if j < len(run) else UNSEEN)
                confidence = conf[j] if j < len(conf) else None
            if (drafts[-1] in stop and not past_stop) or (tau is not None and confidence is not None and confidence < tau):
                break
        return drafts

    def replayed(self, m, i):
        return self.argmax[m + i]


@dataclass
class NgramTrace(DraftTrace):
    """An n-gram drafter's trace: ``proposals[t]``, its lookup proposal after ``prompt + y[:t]`` (ignores tau)."""

    proposals: list[list[int]] = field(default_factory=list)

    def block(self, y, m, budget, stop, tau=None, past_stop=False):
        return self.proposals[m][:budget] if budget > 0 else []

    def replayed(self, m, i):
        return (self.proposals[m] + [UNSEEN] * (i + 1))[i]


@dataclass
class HeadTrace(DraftTrace):
    """An EAGLE-3 head's trace: ``chains[m]``, its proposal at a block after ``m`` emitted tokens (it drafts from
    its own states, so it depends on where the block starts) up to the first token off ``y`` (exact mode: the
    whole proposal); ``argmax[m]``, its first draft. No per-draft confidence (no tau)."""

    chains: list[list[int]] = field(default_factory=list)
    argmax: list[int] = field(default_factory=list)
    thresholds: ClassVar[bool] = False

    def block(self, y, m, budget, stop, tau=None, past_stop=False):
        drafts: list[int] = []
        for x in self.chains[m][:max(budget, 0)]:
            drafts.append(x)
            if x in stop:
                return drafts
        return drafts + [UNSEEN] * (budget - len(drafts))

    def replayed(self, m, i):
        return (self.chains[m] + [UNSEEN] * (i + 1))[i]


@dataclass(frozen=True)
class TraceInput:
    """What :func:`draft_trace` traces a drafter over (its arguments but the drafter; see there)."""

    prompt_ids: list[int]
    continuation: list[int]
    vocab_size: int
    kmax: int = 16
    stop_token_ids: frozenset[int] = frozenset()
    exact: bool = False
    adopts_prefix: bool = False
    target: Any = None


@torch.inference_mode()
def draft_trace(drafter: Any, prompt_ids: list[int], continuation: list[int], vocab_size: int, *, kmax: int = 16,
                stop_token_ids: frozenset[int] = frozenset(), exact: bool = False, adopts_prefix: bool = False,
                target: Any = None) -> DraftTrace:
    """One teacher-forced pass of ``drafter`` (a decoding object: a draft causal LM, :class:`ModelDrafter`,
    :class:`NgramDrafter` or :class:`Eagle3Drafter`, which needs ``target``, maybe in a recorder) over
    ``prompt_ids + continuation[:-1]`` (``vocab_size``: the target's; ``exact``: plus the draft's own proposal
    wherever it leaves ``y``, up to ``kmax``), by the tracer of the kind that claims it (:data:`TRACERS`).

    Returns :class:`NgramTrace`, :class:`HeadTrace` or :class:`ModelTrace`. Raises ValueError: empty prompt; a
    head without ``target``. TypeError: no kind claims the drafter. MissingKindEntry: its kind has no tracer."""
    if not prompt_ids:
        raise ValueError("draft_trace needs a non-empty prompt")
    drafter = unwrap_drafter(drafter)  # a recorder's inner drafter
    tracer = TRACERS[claiming_kind(drafter)]
    return tracer(drafter, TraceInput(prompt_ids, continuation, vocab_size, kmax, stop_token_ids, exact, adopts_prefix,
                                      target))


def _ngram_trace(drafter: NgramDrafter, a: TraceInput) -> NgramTrace:
    """An n-gram lookup's proposal after every prefix of ``y`` (exact: the lookup is the proposal)."""
    drafter.reset()
    full = a.prompt_ids + a.continuation
    return NgramTrace(proposals=[drafter.proposal(full[: len(a.prompt_ids) + t], a.kmax, a.vocab_size, a.stop_token_ids)
                                 for t in range(len(a.continuation))], exact=True)


def _head_trace(drafter: Eagle3Drafter, a: TraceInput) -> HeadTrace:
    """:func:`head_trace` with the target (an EAGLE-3 head reads its features). Raises ValueError: no target."""
    if a.target is None:
        raise ValueError("draft_trace of an EAGLE-3 head needs the target (its features feed the head)")
    return head_trace(drafter, a.target, a.prompt_ids, a.continuation, a.vocab_size, kmax=a.kmax,
                      stop_token_ids=a.stop_token_ids, exact=a.exact)


def _model_trace(drafter: Any, a: TraceInput) -> ModelTrace:
    """A draft causal LM's (bare, or in a :class:`ModelDrafter`) greedy tokens, margins and confidences along ``y``
    in one teacher-forced pass; ``exact``: its free run wherever it leaves ``y``."""
    model, prompt_ids, continuation = MODEL.draft_model(drafter), a.prompt_ids, a.continuation
    if not continuation:
        return ModelTrace(adopts_prefix=a.adopts_prefix, exact=True)
    z = fit_vocab(teacher_forced_logits(model, prompt_ids + continuation[:-1], len(continuation)), a.vocab_size)
    top2, argmax = torch.topk(z, 2, dim=-1).values, z.argmax(dim=-1)
    trace = ModelTrace(argmax=argmax.tolist(), margin=(top2[:, 0] - top2[:, 1]).tolist(), adopts_prefix=a.adopts_prefix,
                       confidence=z.float().softmax(dim=-1).gather(-1, argmax[:, None]).squeeze(-1).tolist(),
                       exact=a.exact)
    runner = ModelDrafter(model) if a.exact and a.kmax > 1 else None
    for t, (d, y) in enumerate(zip(trace.argmax, continuation)):
        if runner is not None and d != y and d not in a.stop_token_ids:
            runner.start([context := prompt_ids + continuation[:t] + [d]])
            proposal = runner.propose([context], [a.kmax - 1], _RECORD_CONFIDENCE, a.vocab_size, None, a.stop_token_ids)
            trace.free_runs[t] = proposal.row(0)
            trace.free_run_confidence[t] = proposal.confidence[0, : len(trace.free_runs[t])].tolist()
    return trace


#: how replay traces each drafter kind's decoding object (keyed by the kind that claims it: a derived or
#: layer-skip draft is a causal LM like a draft model's); tests/validation/test_replay_tracers.py fails
#: until a new kind has its entry
TRACERS: KindTable[Callable[[Any, TraceInput], DraftTrace]] = KindTable(
    "the replay tracers (specdec.validation.replay.TRACERS)",
    {NGRAM: _ngram_trace, EAGLE3: _head_trace, MODEL: _model_trace, DERIVED: _model_trace, LAYERSKIP: _model_trace})


@torch.inference_mode()
def head_trace(drafter: Eagle3Drafter, target: Any, prompt_ids: list[int], continuation: list[int], vocab_size: int,
               *, kmax: int = 16, stop_token_ids: frozenset[int] = frozenset(), exact: bool = False) -> HeadTrace:
    """:func:`draft_trace` of an EAGLE-3 head: one teacher-forced target pass (its aux features) and ``kmax``
    head passes (one per draft depth). The block after ``m`` emitted tokens drafts from the features of
    positions ``< len(prompt) + m - 1`` (head entry ``len(prompt) + m - 2``); ``exact`` re-runs the drafter
    where the chain leaves ``y`` before ``kmax`` drafts."""
    from specdec.core.features import target_features

    P, N = len(prompt_ids), len(continuation)
    trace = HeadTrace(chains=[[] for _ in range(N)], adopts_prefix=True, exact=exact or not stop_token_ids)
    head, seq = drafter.head, prompt_ids + continuation
    T = P + N - 2  # head entries t = 0 .. P + N - 3 (the last block starts at m = N - 1)
    if T <= 0 or kmax < 1:
        return trace
    device = head.fc.weight.device
    _, feats = target_features(target, torch.tensor([seq[: P + N - 1]], device=device), drafter.target_layer_ids)
    ids = torch.tensor([seq[1:] + [0] * kmax], device=device)
    depths = [head.target_logits(z, vocab_size) for z in head.chain_logits(ids, feats[:, :T], kmax)]
    tokens = torch.stack([z.argmax(dim=-1) for z in depths], dim=1).tolist()  # [T, kmax]
    top2 = torch.topk(depths[0], 2, dim=-1).values
    for m in range(1, N):
        chain = []
        for i, x in enumerate(tokens[P + m - 2]):
            chain.append(x)
            if m + i >= N or x != continuation[m + i]:
                break
        if exact and len(chain) < kmax and chain[-1] not in stop_token_ids:
            n_f = torch.tensor([P + m - 1])
            drafter.start([seq[:P]])
            drafter.accept([0], [seq[P]], TargetFeatures(feats[:, : P + m - 1], n_f, n_f))
            chain = drafter.propose([seq[: P + m]], [kmax], SamplingConfig(), vocab_size, None, stop_token_ids).row(0)
        trace.chains[m] = chain
    trace.argmax = [c[0] if c else UNSEEN for c in trace.chains]
    trace.margin = [math.nan] + [float(top2[P + m - 2, 0] - top2[P + m - 2, 1]) for m in range(1, N)]
    return trace


def replay_counters(trace: DraftTrace, continuation: list[int], *, num_speculative_tokens: int, max_new_tokens: int,
                    stop_token_ids: frozenset[int] = frozenset(), assistant_confidence_threshold: float | None = None,
                    drafts_past_stop: bool = False) -> DecodingStats:
    """The counters :func:`specdec.speculative_generate` (greedy, B = 1) produces with this k and threshold.

    Args:
        trace: :func:`draft_trace` of ``continuation``, the target's greedy ``y`` (``max_new_tokens`` ids, or
            fewer ending with a stop token). num_speculative_tokens: k >= 1.
        assistant_confidence_threshold: tau (None = off), as ``speculative_generate``'s.
        drafts_past_stop: llama.cpp's drafting (``draft-simple``): a drafted stop token does not end the
            block; drafts past the end of ``y`` count as drafted and never accepted.
    Returns:
        :class:`DecodingStats`: step counters, ``num_emitted_tokens``, ``target_forward_passes``.
    Raises ValueError: k < 1; a threshold on a :class:`HeadTrace`; ``y`` inconsistent with the budget / stops.
    """
    k, y, stop = num_speculative_tokens, continuation, stop_token_ids
    if k < 1:
        raise ValueError(f"num_speculative_tokens must be >= 1, got {k}")
    if assistant_confidence_threshold is not None and not trace.thresholds:
        raise ValueError("assistant_confidence_threshold is not replayed for an EAGLE-3 head trace (no per-draft "
                         "confidence in its chains); replay it without a threshold")
    if len(y) > max_new_tokens or any(x in stop for x in y[:-1]):
        raise ValueError("continuation is longer than max_new_tokens or has a stop token before its end")
    if len(y) < max_new_tokens and (not y or y[-1] not in stop):
        raise ValueError("a continuation shorter than max_new_tokens must end with a stop token")
    row = GenerationResult(stats=DecodingStats(num_speculative_tokens=k))
    adopt = trace.adopts_prefix  # a draft that adopts the prompt KV (or a head) starts with one plain target step
    while not row.finished(max_new_tokens):
        m = len(row.token_ids)
        drafts = [] if adopt else trace.block(y, m, min(k, max_new_tokens - m - 1), stop,
                                              assistant_confidence_threshold, drafts_past_stop)
        adopt = False
        # UNSEEN drafts only follow a rejected one, so verification stops before them: verify the seen ones
        seen = drafts[:drafts.index(UNSEEN)] if UNSEEN in drafts else drafts
        pad = len(seen) + 1 - len(y[m:m + len(seen) + 1])
        outcome, = verify_drafts([seen], stop, target_argmax=[y[m:m + len(seen) + 1] + [UNSEEN] * pad])
        row.record_verified(seen, outcome, num_drafted=len(drafts), stop_token_ids=stop)
    row.stats.num_emitted_tokens = len(row.token_ids)
    return row.stats


def pooled(stats: list[DecodingStats], k: int) -> DecodingStats:
    """The core's pooled sum (:meth:`DecodingStats.merge`) of ``stats`` at k."""
    return functools.reduce(DecodingStats.merge, stats, DecodingStats(num_speculative_tokens=k))


def replay_grid(traces: list[DraftTrace], continuations: list[list[int]], ks: range | list[int],
                taus: list[float | None], *, max_new_tokens: int,
                stop_token_ids: frozenset[int] = frozenset()) -> dict[tuple[int, float | None], DecodingStats]:
    """Pooled replayed counters ``{(k, tau): DecodingStats}`` for every (k, tau) of a grid (``tau=None``: fixed
    k), one trace and greedy continuation per prompt. Raises ValueError: as :func:`replay_counters`, or lengths."""
    if len(traces) != len(continuations):
        raise ValueError(f"{len(traces)} traces for {len(continuations)} continuations")
    return {(k, tau): pooled([replay_counters(t, y, num_speculative_tokens=k, max_new_tokens=max_new_tokens,
                                              stop_token_ids=stop_token_ids, assistant_confidence_threshold=tau)
                              for t, y in zip(traces, continuations)], k)
            for k in ks for tau in taus}


def counters_equal(a: DecodingStats, b: DecodingStats, exact: bool = True) -> bool:
    """``a`` and ``b`` agree on :data:`COMPARED_COUNTERS` (``exact=False``: but the proposal counts a fast replay bounds)."""
    names = COMPARED_COUNTERS if exact else tuple(n for n in COMPARED_COUNTERS if "draft" not in n or n == "num_drafts")
    return all(getattr(a, n) == getattr(b, n) for n in names)


class RecordingDrafter(DrafterWrapper):
    """Any drafter (a causal LM as :func:`~specdec.core.drafters.as_drafter` wraps it) recording, for B = 1 runs,
    ``(len(context), tokens)`` of each proposal in ``blocks`` and its context in ``contexts`` (cleared by
    ``start``), to compare a decoded run with its replay (:func:`first_flip`); decoding is unchanged. Every
    other drafter member forwards explicitly (:class:`~specdec.core.drafters.DrafterWrapper`)."""

    def __init__(self, drafter: Any) -> None:
        super().__init__(drafter)
        self.blocks: list[tuple[int, list[int]]] = []
        self.contexts: list[list[int]] = []

    def start(self, contexts) -> None:
        self.blocks, self.contexts = [], []
        self.inner.start(contexts)

    def propose(self, contexts, limits, sampling, vocab_size, generator=None, stop_token_ids=frozenset()):
        proposal = self.inner.propose(contexts, limits, sampling, vocab_size, generator, stop_token_ids)
        for b, context in enumerate(contexts):
            self.blocks.append((len(context), proposal.row(b)))
            self.contexts.append(list(context))
        return proposal


def first_flip(blocks: list[tuple[int, list[int]]], prompt_len: int, trace: DraftTrace,
               continuation: list[int]) -> tuple[int, float] | None:
    """The first continuation position where a decoded draft token on the teacher-forced chain (up to the first
    one off ``continuation``) differs from the replayed one: ``(position, draft logit margin there)``, or None."""
    for ctx_len, tokens in blocks:
        m = ctx_len - prompt_len
        for i, x in enumerate(tokens):
            t = m + i
            if t >= len(continuation):
                break
            if x != trace.replayed(m, i):
                return t, (trace.margin[t] if trace.margin else math.nan)
            if x != continuation[t]:
                break
    return None


def target_divergence(contexts: list[list[int]], prompt_len: int, continuation: list[int]) -> int | None:
    """The first continuation position where a decoded run's emitted tokens (in its drafter's contexts) left
    ``continuation`` (a target-side difference, which the exactness audit explains), or None."""
    for ctx in contexts:
        emitted = ctx[prompt_len:]
        if emitted != continuation[: len(emitted)]:
            return next((i for i, (a, b) in enumerate(zip(emitted, continuation)) if a != b),
                        min(len(emitted), len(continuation)))
    return None
