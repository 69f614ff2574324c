"""Greedy replay: the counters speculative decoding would produce, for every k, from one draft pass.

Under greedy decoding the target's continuation ``y`` does not depend on the drafter or on k
(the output is the target's own greedy continuation, token for token). Speculative decoding with
k then proposes, at a block that starts after ``m`` emitted tokens, the draft's greedy tokens
``x_0, x_1, ...`` after ``prompt + y[:m]``; while they match ``y`` they are exactly the draft's
argmax on the teacher-forced sequence ``prompt + y``. So ONE teacher-forced draft pass over
``prompt + y[:-1]`` (:func:`draft_trace`) gives every block of every k; each block is verified
with the core's own :func:`specdec.core.sampling.verify_greedy` and counted with the core's
:class:`specdec.core.stats.DecodingStats` (:func:`replay_counters`), so the math stays in one place.

Bookkeeping follows :func:`specdec.core.decoding.speculative_generate` exactly: the budget of a
block is ``min(k, max_new_tokens - emitted - 1)`` (a block with budget 0 is a plain target step,
not counted in ``num_drafts``), drafts after a drafted stop token are dropped, an accepted stop
token ends generation, and a draft that adopts the target's prompt KV (``derived:bf16``/``fp8``)
starts with one plain target step.

What one teacher-forced pass cannot see: the draft's tokens after a *rejected* draft in the same
block (they follow the draft's own wrong token). They never change acceptance (verification
stops at the rejection), but a stop token among them would shorten the block's proposal; the
fast replay assumes none (``num_draft_tokens`` is then an upper bound). ``exact=True`` runs the
draft's own greedy proposal after each rejected token (:class:`specdec.core.drafters.ModelDrafter`)
and is exact in every counter. The n-gram drafter proposes from the context alone, so its replay
is always exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from specdec.core.config import ProposalSampling, SamplingConfig
from specdec.core.drafters import ModelDrafter, NgramDrafter, TargetFeatures, fit_vocab
from specdec.core.head_drafter import Eagle3Drafter
from specdec.core.sampling import NO_NEXT_TOKEN, verify_greedy
from specdec.core.stats import DecodingStats
from specdec.validation.teacher_forcing import teacher_forced_logits

__all__ = ["DraftTrace", "draft_trace", "replay_counters", "replay_curve", "replay_grid", "recording", "RecordingModelDrafter", "RecordingNgramDrafter", "first_flip",
           "target_divergence", "counters_equal", "COMPARED_COUNTERS", "UNSEEN"]

#: greedy proposals that record every token's confidence and never stop for it (threshold 0)
_RECORD_CONFIDENCE = ProposalSampling(assistant_confidence_threshold=0.0)
#: placeholder for a draft token the teacher-forced pass does not see (after a rejection); never a real id
UNSEEN = -2
#: the counters a replay must reproduce exactly (vLLM names, plus the per-position lists)
COMPARED_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_rejected_steps",
                     "accepted_per_position", "drafted_per_position", "num_emitted_tokens")


@dataclass
class DraftTrace:
    """What one teacher-forced draft pass says about a continuation ``y`` of length N.

    Attributes:
        argmax: ``N`` ids; ``argmax[t]`` is the draft's greedy token after ``prompt + y[:t]``
            (model drafter; empty for n-gram).
        margin: ``N`` floats, draft logit margin (top-1 minus top-2, in logits) at each t.
        confidence: ``N`` floats, the draft's top-1 probability at each t (softmax of its raw
            logits fitted to the target vocabulary, T = 1: the greedy confidence of
            :func:`specdec.core.sampling.draft_step`), for ``assistant_confidence_threshold``.
        proposals: n-gram only: ``N`` lists, the lookup proposal (up to ``kmax`` ids) after
            ``prompt + y[:t]``, already cut after a stop token / at an id the target lacks.
        free_runs: exact mode: ``{t: ids}``, the draft's own greedy proposal (up to ``kmax - 1``
            ids, cut after a stop token) after ``prompt + y[:t] + [argmax[t]]`` where
            ``argmax[t] != y[t]``.
        chains: EAGLE-3 head only: ``N`` lists; ``chains[m]`` is the head's proposal (target ids)
            at a block starting after ``m`` emitted tokens: its teacher-forced chain
            (:meth:`~specdec.models.eagle3.head.Eagle3Head.chain_logits`), up to and including the
            first token that leaves ``y``; in exact mode the drafter's own whole proposal there.
            A head drafts from its own states beyond the target's features, so its d-th draft
            depends on where the block starts, unlike a draft model's.
        free_run_confidence: exact mode: ``{t: floats}``, the confidence of each free-run token.
        adopts_prefix: decoding starts with one plain target step (no drafts): a draft that adopts
            the target's prompt KV, or a head (no target features before the prefill).
        exact: every counter is exact (n-gram, or ``free_runs`` filled).
    """

    argmax: list[int] = field(default_factory=list)
    margin: list[float] = field(default_factory=list)
    confidence: list[float] = field(default_factory=list)
    proposals: list[list[int]] | None = None
    free_runs: dict[int, list[int]] = field(default_factory=dict)
    chains: list[list[int]] | None = None
    free_run_confidence: dict[int, list[float]] = field(default_factory=dict)
    adopts_prefix: bool = False
    exact: bool = False


@torch.inference_mode()
def draft_trace(
    drafter: Any,
    prompt_ids: list[int],
    continuation: list[int],
    vocab_size: int,
    *,
    kmax: int = 16,
    stop_token_ids: frozenset[int] = frozenset(),
    exact: bool = False,
    adopts_prefix: bool = False,
    target: Any = None,
) -> DraftTrace:
    """One teacher-forced draft pass over ``prompt_ids + continuation[:-1]``.

    Args:
        drafter: a draft causal LM, a :class:`ModelDrafter` or an :class:`NgramDrafter`.
        prompt_ids: the prompt (>= 1 id).
        continuation: the target's greedy continuation ``y`` (may end with a stop token).
        vocab_size: the target's vocabulary size (draft logits are fitted to it as in decoding).
        kmax: the largest k replayed (bounds n-gram proposals and exact free runs).
        stop_token_ids: ids that end generation (EOS).
        exact: also run the draft's own greedy proposal after every rejected draft token.
        adopts_prefix: decoding adopts the target's prompt KV (see :class:`DraftTrace`).
        target: the target model; needed for an EAGLE-3 head (one teacher-forced target pass gives
            its features; :func:`head_trace`).
    Returns:
        :class:`DraftTrace`. Costs one full forward pass of the draft (``exact``: plus one
        short greedy proposal per position where the draft disagrees with ``y``).
    Raises:
        ValueError: empty prompt.
    """
    if not prompt_ids:
        raise ValueError("draft_trace needs a non-empty prompt")
    N = len(continuation)
    if isinstance(drafter, NgramDrafter):
        drafter.reset()
        full = prompt_ids + continuation
        props = [drafter.proposal(full[: len(prompt_ids) + t], kmax, vocab_size, stop_token_ids) for t in range(N)]
        return DraftTrace(proposals=props, adopts_prefix=False, exact=True)
    if isinstance(drafter, Eagle3Drafter):
        if target is None:
            raise ValueError("draft_trace of an EAGLE-3 head needs the target (its features feed the head)")
        return head_trace(drafter, target, prompt_ids, continuation, vocab_size, kmax=kmax,
                          stop_token_ids=stop_token_ids, exact=exact)
    model = drafter.model if isinstance(drafter, ModelDrafter) else drafter
    if N == 0:
        return DraftTrace(adopts_prefix=adopts_prefix, exact=True)
    z = fit_vocab(teacher_forced_logits(model, prompt_ids + continuation[:-1], N), vocab_size)
    top2 = torch.topk(z, 2, dim=-1).values
    argmax = z.argmax(dim=-1)
    trace = DraftTrace(argmax=argmax.tolist(), margin=(top2[:, 0] - top2[:, 1]).tolist(),
                       confidence=z.float().softmax(dim=-1).gather(-1, argmax[:, None]).squeeze(-1).tolist(),
                       adopts_prefix=adopts_prefix, exact=exact)
    if exact and kmax > 1:
        runner = ModelDrafter(model)
        for t, (d, y) in enumerate(zip(trace.argmax, continuation)):
            if d != y and d not in stop_token_ids:
                context = prompt_ids + continuation[:t] + [d]
                runner.start([context])
                proposal = runner.propose([context], [kmax - 1], _RECORD_CONFIDENCE, vocab_size, None, stop_token_ids)
                trace.free_runs[t] = proposal.row(0)
                trace.free_run_confidence[t] = proposal.confidence[0, : len(trace.free_runs[t])].tolist()
    return trace


@torch.inference_mode()
def head_trace(drafter: Eagle3Drafter, target: Any, prompt_ids: list[int], continuation: list[int], vocab_size: int,
               *, kmax: int = 16, stop_token_ids: frozenset[int] = frozenset(), exact: bool = False) -> DraftTrace:
    """:func:`draft_trace` of an EAGLE-3 head: one teacher-forced target pass (its aux features) and
    ``kmax`` teacher-forced head passes (one per draft depth, over every position at once).

    The block after ``m`` emitted tokens drafts from the target features of positions
    ``< len(prompt) + m - 1`` (the last emitted token is fed to the target with the drafts), so its
    chain starts at head entry ``e = len(prompt) + m - 2``. ``exact=True`` re-runs the drafter itself
    for every block whose chain leaves ``y`` before ``kmax`` drafts (what it drafts after its own
    rejected token). Decoding starts with a plain target step (``adopts_prefix``).

    Returns:
        :class:`DraftTrace` with ``chains``, ``argmax`` (the first draft of each block) and ``margin``.
    """
    from specdec.core.features import target_features

    P, N = len(prompt_ids), len(continuation)
    trace = DraftTrace(chains=[[] for _ in range(N)], adopts_prefix=True, exact=exact or not stop_token_ids)
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
        e = P + m - 2
        chain = []
        for i, x in enumerate(tokens[e]):
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
    trace.margin = [float("nan")] + [float(top2[P + m - 2, 0] - top2[P + m - 2, 1]) for m in range(1, N)]
    return trace


def _block(trace: DraftTrace, y: list[int], m: int, budget: int, stop: frozenset[int],
           tau: float | None = None, past_stop: bool = False) -> list[int]:
    """The drafts decoding proposes at a block starting after ``m`` emitted tokens (with a
    confidence threshold ``tau``: drafting stops right after a draft whose confidence < tau;
    ``past_stop``: a drafted stop token does not end the block, as in llama.cpp, whose drafts past
    the end of ``y`` are :data:`UNSEEN`)."""
    if budget <= 0:
        return []
    if trace.proposals is not None:
        return trace.proposals[m][:budget]
    if trace.chains is not None:
        if tau is not None:
            raise ValueError("a confidence threshold is not replayed for EAGLE-3 heads (their trace keeps no confidences)")
        return _head_block(trace.chains[m], budget, stop)
    drafts: list[int] = []
    left = None  # where the chain left y (the first rejected draft), if it did
    for i in range(budget):
        t = m + i
        confidence = None
        if left is None and t >= len(trace.argmax):  # past the end of y (a drafted stop token that was not cut)
            drafts.append(UNSEEN)
        elif left is None:
            drafts.append(trace.argmax[t])
            confidence = trace.confidence[t] if trace.confidence else None
            if drafts[-1] != y[t]:
                left = t
        else:  # the draft follows its own (rejected) token: the free run after position `left`
            run, conf = trace.free_runs.get(left, []), trace.free_run_confidence.get(left, [])
            j = t - left - 1
            if j < len(run):
                drafts.append(run[j])
                confidence = conf[j] if j < len(conf) else None
            elif trace.exact:  # the exact free run ended (after a stop token): so did decoding's proposal
                break
            else:
                drafts.append(UNSEEN)
        if drafts[-1] in stop and not past_stop:  # drafts after a drafted stop token are dropped
            break
        if tau is not None and confidence is not None and confidence < tau:
            break
    return drafts


def _head_block(chain: list[int], budget: int, stop: frozenset[int]) -> list[int]:
    """A head's drafts at a block: its chain, cut after a stop token. A fast trace's chain ends at
    the first token off ``y``; the drafts after it are :data:`UNSEEN` (they never change acceptance;
    they are counted, which is exact unless one of them would have been a stop token)."""
    drafts: list[int] = []
    for x in chain[:budget]:
        drafts.append(x)
        if x in stop:
            return drafts
    return drafts + [UNSEEN] * (budget - len(drafts))


def replay_counters(
    trace: DraftTrace,
    continuation: list[int],
    *,
    num_speculative_tokens: int,
    max_new_tokens: int,
    stop_token_ids: frozenset[int] = frozenset(),
    assistant_confidence_threshold: float | None = None,
    drafts_past_stop: bool = False,
) -> DecodingStats:
    """The counters :func:`specdec.speculative_generate` (greedy, B = 1) produces with this k
    and this confidence threshold.

    Args:
        trace: :func:`draft_trace` of the continuation.
        continuation: the target's greedy continuation ``y``: ``max_new_tokens`` ids, or fewer
            ending with a stop token.
        num_speculative_tokens: k >= 1.
        max_new_tokens: the decoding budget the continuation was produced with.
        stop_token_ids: ids that end generation.
        assistant_confidence_threshold: tau (None = off), as ``speculative_generate``'s: a block
            ends right after a draft whose confidence (``trace.confidence``; after a rejected
            draft ``trace.free_run_confidence``) is below tau. The n-gram drafter ignores it.
            Exact with an exact trace; a fast trace bounds ``num_draft_tokens`` as without tau.
        drafts_past_stop: llama.cpp's drafting (``draft-simple``): a drafted stop token does not end the
            block (it drafts ``n_max`` tokens whatever they are); drafts past the end of ``y`` count as
            drafted and never accepted (llama.cpp verifies them against the target's prediction after
            the stop token, which the output does not show).
    Returns:
        :class:`DecodingStats` with the step counters (``num_drafts``, ``num_draft_tokens``,
        ``num_accepted_tokens``, ``num_rejected_steps``, ``accepted_per_position``,
        ``drafted_per_position``), ``num_emitted_tokens`` and ``target_forward_passes`` (one per
        step); seconds and draft passes stay 0.
    Raises:
        ValueError: k < 1, or the continuation is inconsistent with ``max_new_tokens`` / stops.
    """
    k = num_speculative_tokens
    if k < 1:
        raise ValueError(f"num_speculative_tokens must be >= 1, got {k}")
    if assistant_confidence_threshold is not None and trace.chains is not None:
        raise ValueError("assistant_confidence_threshold is not replayed for an EAGLE-3 head trace (no per-draft "
                         "confidence in its chains); replay it without a threshold")
    y = continuation
    if len(y) > max_new_tokens or any(x in stop_token_ids for x in y[:-1]):
        raise ValueError("continuation is longer than max_new_tokens or has a stop token before its end")
    if len(y) < max_new_tokens and (not y or y[-1] not in stop_token_ids):
        raise ValueError("a continuation shorter than max_new_tokens must end with a stop token")
    stats = DecodingStats(num_speculative_tokens=k)
    m = 0
    if trace.adopts_prefix and max_new_tokens > 0:  # the plain first step of a draft that adopts the prompt KV
        m, stats.target_forward_passes = 1, 1
    while m < len(y) and not (m and y[m - 1] in stop_token_ids):
        drafts = _block(trace, y, m, min(k, max_new_tokens - m - 1), stop_token_ids, assistant_confidence_threshold,
                        drafts_past_stop)
        # UNSEEN drafts only follow a rejected one, so verification stops before them: verify the seen ones
        seen = drafts[:drafts.index(UNSEEN)] if UNSEEN in drafts else drafts
        pad = len(seen) + 1 - len(y[m:m + len(seen) + 1])
        outcome = verify_greedy(seen, y[m:m + len(seen) + 1] + [UNSEEN] * pad, stop_token_ids)
        stats.record_step(len(drafts), outcome.num_accepted, rejected=outcome.rejected)
        stats.target_forward_passes += 1
        m += outcome.num_accepted + (outcome.next_token != NO_NEXT_TOKEN)
    stats.num_emitted_tokens = m
    return stats


def replay_curve(trace: DraftTrace, continuation: list[int], ks: range | list[int], *, max_new_tokens: int,
                 stop_token_ids: frozenset[int] = frozenset(),
                 assistant_confidence_threshold: float | None = None) -> dict[int, DecodingStats]:
    """:func:`replay_counters` for every k in ``ks`` from the same trace: ``{k: DecodingStats}``."""
    return {k: replay_counters(trace, continuation, num_speculative_tokens=k, max_new_tokens=max_new_tokens,
                               stop_token_ids=stop_token_ids, assistant_confidence_threshold=assistant_confidence_threshold)
            for k in ks}


def replay_grid(traces: list[DraftTrace], continuations: list[list[int]], ks: range | list[int],
                taus: list[float | None], *, max_new_tokens: int,
                stop_token_ids: frozenset[int] = frozenset()) -> dict[tuple[int, float | None], DecodingStats]:
    """Pooled replayed counters for every (k, tau) of a grid, from one trace per prompt.

    Feed each pooled :class:`DecodingStats` (its per-step counters: ``num_drafts``,
    ``num_draft_tokens``, ``num_accepted_tokens``) to the speed model to pick the best (k, tau);
    ``tau=None`` in ``taus`` gives the fixed-k policy.

    Args:
        traces, continuations: per prompt, :func:`draft_trace` and the target's greedy continuation.
        ks: k values (each >= 1). taus: thresholds in [0, 1] or None.
        max_new_tokens, stop_token_ids: as :func:`replay_counters`.
    Returns:
        ``{(k, tau): DecodingStats}`` pooled over prompts (:meth:`DecodingStats.merge`).
    Raises:
        ValueError: as :func:`replay_counters`; traces and continuations of different lengths.
    """
    if len(traces) != len(continuations):
        raise ValueError(f"{len(traces)} traces for {len(continuations)} continuations")
    out: dict[tuple[int, float | None], DecodingStats] = {}
    for k in ks:
        for tau in taus:
            pooled = DecodingStats(num_speculative_tokens=k)
            for trace, y in zip(traces, continuations):
                pooled = pooled.merge(replay_counters(trace, y, num_speculative_tokens=k, max_new_tokens=max_new_tokens,
                                                      stop_token_ids=stop_token_ids,
                                                      assistant_confidence_threshold=tau))
            out[(k, tau)] = pooled
    return out


def counters_equal(a: DecodingStats, b: DecodingStats, exact: bool = True) -> bool:
    """True when ``a`` and ``b`` agree on :data:`COMPARED_COUNTERS` (``exact=False``: all but the
    proposal counts ``num_draft_tokens`` / ``drafted_per_position``, which a fast replay bounds)."""
    names = COMPARED_COUNTERS if exact else tuple(n for n in COMPARED_COUNTERS if "draft" not in n or n == "num_drafts")
    return all(getattr(a, n) == getattr(b, n) for n in names)


class _Recording:
    """Mixin: record ``(len(context), tokens)`` of every row's proposal in ``blocks`` (cleared by
    ``start``); meant for B = 1 runs (rows of a batch would interleave)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.blocks: list[tuple[int, list[int]]] = []
        self.contexts: list[list[int]] = []  # the context of each proposal (prompt + emitted tokens)
        super().__init__(*args, **kwargs)

    def start(self, contexts) -> None:
        self.blocks, self.contexts = [], []
        super().start(contexts)  # type: ignore[misc]

    def propose(self, contexts, limits, sampling, vocab_size, generator=None, stop_token_ids=frozenset()):
        proposal = super().propose(contexts, limits, sampling, vocab_size, generator, stop_token_ids)  # type: ignore[misc]
        for b, context in enumerate(contexts):
            self.blocks.append((len(context), proposal.row(b)))
            self.contexts.append(list(context))
        return proposal


class RecordingModelDrafter(_Recording, ModelDrafter):
    """A :class:`ModelDrafter` that records its proposals (decoding is unchanged)."""


class RecordingNgramDrafter(_Recording, NgramDrafter):
    """An :class:`NgramDrafter` that records its proposals (decoding is unchanged)."""


class RecordingEagle3Drafter(_Recording, Eagle3Drafter):
    """An :class:`Eagle3Drafter` that records its proposals (decoding is unchanged)."""


def recording(drafter: Any) -> Any:
    """A recording copy of ``drafter`` (a causal LM, :class:`ModelDrafter`, :class:`NgramDrafter` or
    :class:`Eagle3Drafter`): same model / head / n-gram settings, plus ``blocks``, so a decoded run can
    be compared block by block with its replay (:func:`first_flip`).

    Raises:
        TypeError: another drafter type.
    """
    if isinstance(drafter, NgramDrafter):
        return RecordingNgramDrafter(drafter.max_ngram, drafter.min_ngram, drafter.match_tokens, drafter.first_occurrence,
                                     drafter.distinct_single)
    if isinstance(drafter, ModelDrafter):
        return RecordingModelDrafter(drafter.model)
    if isinstance(drafter, Eagle3Drafter):
        return RecordingEagle3Drafter(drafter.head, drafter.target_layer_ids)
    if isinstance(drafter, torch.nn.Module):
        return RecordingModelDrafter(drafter)
    raise TypeError(f"cannot record proposals of a {type(drafter).__name__}")


def first_flip(blocks: list[tuple[int, list[int]]], prompt_len: int, trace: DraftTrace,
               continuation: list[int]) -> tuple[int, float] | None:
    """The first continuation position where a decoded draft token differs from the replayed one.

    Only tokens on the teacher-forced chain are compared (up to and including the first decoded
    token that differs from ``continuation``). Returns ``(position, draft logit margin there)``
    (margin ``nan`` for n-gram), or None when every compared token agrees.
    """
    for ctx_len, tokens in blocks:
        m = ctx_len - prompt_len
        for i, x in enumerate(tokens):
            t = m + i
            if t >= len(continuation):
                break
            if trace.proposals is not None or trace.chains is not None:  # n-gram / head: the block's own proposal
                block = (trace.proposals if trace.proposals is not None else trace.chains)[m]
                replayed = block[i] if i < len(block) else UNSEEN
            else:
                replayed = trace.argmax[t]
            if x != replayed:
                return t, (trace.margin[t] if trace.margin else float("nan"))
            if x != continuation[t]:
                break
    return None


def target_divergence(contexts: list[list[int]], prompt_len: int, continuation: list[int]) -> int | None:
    """The first continuation position where a decoded run's own emitted tokens (seen in the contexts
    its drafter was given) left ``continuation``: a target-side difference, which the exactness
    audit explains (target logit margin there). None when every context follows ``continuation``."""
    for ctx in contexts:
        emitted = ctx[prompt_len:]
        if emitted != continuation[: len(emitted)]:
            return next((i for i, (a, b) in enumerate(zip(emitted, continuation)) if a != b), min(len(emitted), len(continuation)))
    return None
