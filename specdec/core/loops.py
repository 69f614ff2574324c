"""The decoding loops, each one loop for B >= 1 rows: speculative decoding and the target-only reference.

:func:`speculate` (Leviathan et al. 2022, Alg. 1; Chen et al. 2023, Alg. 2). Each step: the drafter proposes up
to k tokens for every active row (:mod:`specdec.core.drafters`); the target cache scores every row's block in
one forward pass (:mod:`specdec.core.target_cache`); :func:`~specdec.core.sampling.verify_drafts`, the one
verifier, accepts a prefix of each row's drafts and emits a recovered or bonus token; the target cache and the
drafter roll back to the verified prefix; :meth:`~specdec.core.results.GenerationResult.record_verified`, the
per-row bookkeeping shared with the replay, counts it. Rows that emitted a stop token or reached
``max_new_tokens`` leave the batch.

:func:`target_only`: one target pass per token on the same target caches, the tokens drawn with
:func:`~specdec.core.sampling.sample_rows` from the same :func:`~specdec.core.sampling.logits_to_probs` (greedy:
the argmax). It shares no drafting, verification or rollback with :func:`speculate`, so the exactness tests
compare against an independent reference.

B = 1 (:mod:`specdec.core.decoding`) is a batch of one on a
:class:`~specdec.core.target_cache.StaticTargetCache`; B > 1 (:mod:`specdec.core.batch`) runs on a
:class:`~specdec.core.target_cache.MaskedTargetCache`. All probability math lives in
:mod:`specdec.core.sampling`; nothing here decides acceptance.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.core.config import ProposalSampling, SamplingConfig
from specdec.core.drafters import Drafter, Proposal
from specdec.core.kv import now
from specdec.core.results import BatchGenerationResult, GenerationResult, pool_stats
from specdec.core.sampling import VerifyOutcome, sample_rows, verify_drafts
from specdec.core.stats import DecodingStats
from specdec.core.target_cache import TargetCache, TargetScores

__all__ = ["StepPlan", "speculate", "target_only"]


@dataclass(frozen=True)
class StepPlan:
    """What every step of one generation shares.

    Attributes:
        num_speculative_tokens: k >= 1; row b drafts ``min(k, max_new_tokens - emitted_b - 1)`` (0: target-only).
        max_new_tokens: per row (>= 0).
        sampling: the target's :class:`SamplingConfig` (temperature 0 = greedy).
        proposal_sampling: the drafter's rule and draft-length policy (:class:`ProposalSampling`); None for
            :func:`target_only`.
        stop_token_ids: ids that end a row (emitted).
        vocab_size: the target's vocabulary (its output embedding rows).
        generator: the coins and draws of sampling (None: torch's default generator).
        device: the target's device (for the timers' syncs).
    """

    num_speculative_tokens: int
    max_new_tokens: int
    sampling: SamplingConfig
    proposal_sampling: ProposalSampling | None
    stop_token_ids: frozenset[int]
    vocab_size: int
    generator: torch.Generator | None
    device: torch.device


@dataclass
class _StepCost:
    """One step's shared cost, charged to every row that took part: wall seconds and draft model passes."""

    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    draft_passes: int = 0


@dataclass
class _Step:
    """One verified step of the active rows: its cost, and per active row its drafts and verdict."""

    cost: _StepCost
    drafts: list[list[int]]
    outcomes: list[VerifyOutcome]


@torch.inference_mode()
def speculate(target_cache: TargetCache, drafter: Drafter, contexts: list[list[int]],
              plan: StepPlan) -> BatchGenerationResult:
    """Run speculative decoding to the end for every row.

    Args:
        target_cache: the target side, holding nothing yet (its first pass is the prefill).
        drafter: a started :class:`~specdec.core.drafters.Drafter` (``start`` called on copies of ``contexts``).
        contexts: per row its prompt ids; extended in place with the emitted tokens.
        plan: the :class:`StepPlan`.
    Returns:
        :class:`BatchGenerationResult`: per-row results (vLLM's counters; a row's seconds and passes are those
        of the steps it took part in), pooled stats whose seconds are the batch's wall seconds, and the
        batched target / draft calls made.
    Raises:
        NonFiniteLogits: non-finite target logits. ValueError: target logits of the wrong vocabulary size.
    """
    k = plan.num_speculative_tokens
    rows = [GenerationResult(stats=DecodingStats(num_speculative_tokens=k)) for _ in contexts]
    active = list(range(len(contexts)))
    wall = _StepCost()
    target_calls, draft_passes_before = 0, drafter.forward_passes
    adopt = target_cache.adopts(drafter, plan.max_new_tokens)  # a plain first step, then the draft takes the prompt KV
    while active and plan.max_new_tokens > 0:
        step = _step(target_cache, drafter, [contexts[b] for b in active], [rows[b] for b in active], plan,
                     adopt=adopt)
        adopt = False
        target_calls += 1
        wall.draft_seconds += step.cost.draft_seconds
        wall.target_seconds += step.cost.target_seconds
        keep = _record_rows([rows[b] for b in active], [contexts[b] for b in active], step, plan)
        if keep and len(keep) < len(active):
            selected = torch.tensor(keep, dtype=torch.long, device=plan.device)
            target_cache.select(selected)
            drafter.select(selected)
        active = [active[i] for i in keep]
        target_cache.feed_next([step.outcomes[i].next_token for i in keep])
    for r in rows:
        r.stats.num_emitted_tokens = len(r.token_ids)
    return BatchGenerationResult(rows=rows, stats=pool_stats(rows, k, wall.target_seconds, wall.draft_seconds), target_calls=target_calls,
                                 draft_calls=drafter.forward_passes - draft_passes_before)


@torch.inference_mode()
def target_only(target_cache: TargetCache, contexts: list[list[int]], plan: StepPlan) -> BatchGenerationResult:
    """Target-only decoding to the end for every row: the reference speculative decoding must match.

    Args:
        target_cache: the target side, holding nothing yet (its first pass is the prefill).
        contexts: per row its prompt ids; extended in place with the emitted tokens.
        plan: the :class:`StepPlan` (``num_speculative_tokens`` 0, ``proposal_sampling`` None).
    Returns:
        :class:`BatchGenerationResult`: per row its tokens and counters (target passes and seconds, no drafts),
        pooled stats whose seconds are the batch's wall seconds, and the batched target calls made.
    Raises:
        NonFiniteLogits: non-finite target logits. ValueError: target logits of the wrong vocabulary size.
    """
    rows = [GenerationResult(stats=DecodingStats()) for _ in contexts]
    active = list(range(len(contexts)))
    wall, calls = 0.0, 0
    while active and plan.max_new_tokens > 0:
        t0 = now(plan.device)
        empty = [[] for _ in active]
        scores = target_cache.score(Proposal.empty(len(active), plan.vocab_size, plan.sampling), empty, plan.sampling,
                                    None)
        tokens = ([a[0] for a in scores.target_argmax] if scores.target_argmax is not None
                  else sample_rows(scores.p[:, 0], plan.generator).tolist())
        target_cache.commit([0] * len(active), empty, None)
        dt = now(plan.device) - t0
        wall, calls = wall + dt, calls + 1
        keep = []
        for i, b in enumerate(active):
            rows[b].stats.target_forward_passes += 1
            rows[b].stats.target_seconds += dt
            rows[b].token_ids.append(tokens[i])
            rows[b].finish_reason = "eos" if tokens[i] in plan.stop_token_ids else rows[b].finish_reason
            contexts[b].append(tokens[i])
            if not rows[b].finished(plan.max_new_tokens):
                keep.append(i)
        if keep and len(keep) < len(active):
            target_cache.select(torch.tensor(keep, dtype=torch.long, device=plan.device))
        active = [active[i] for i in keep]
        target_cache.feed_next([tokens[i] for i in keep])
    for r in rows:
        r.stats.num_emitted_tokens = len(r.token_ids)
    return BatchGenerationResult(rows=rows, stats=pool_stats(rows, 0, wall, 0.0), target_calls=calls)


def _step(target_cache: TargetCache, drafter: Drafter, contexts: list[list[int]], rows: list[GenerationResult],
          plan: StepPlan, *, adopt: bool) -> _Step:
    """One speculative step of the active rows (``contexts`` / ``rows``: theirs, in order): propose, score,
    verify, roll both sides back. Returns the :class:`_Step` (its cost, each row's drafts and verdict)."""
    k, device, passes = plan.num_speculative_tokens, plan.device, drafter.forward_passes
    t0 = now(device)
    if adopt:
        proposal = Proposal.empty(len(contexts), plan.vocab_size, plan.sampling)
    else:
        limits = [min(k, plan.max_new_tokens - len(r.token_ids) - 1) for r in rows]
        proposal = drafter.propose(contexts, limits, plan.proposal_sampling, plan.vocab_size, plan.generator,
                                   plan.stop_token_ids)
    drafts = [t[:n] for t, n in zip(proposal.tokens.tolist(), proposal.num_drafts.tolist())]
    t1 = now(device)
    scores = target_cache.score(proposal, drafts, plan.sampling, drafter.target_layer_ids)
    outcomes = _verify(scores, drafts, proposal, plan)
    features = target_cache.commit([o.num_accepted for o in outcomes], drafts, scores.hidden)
    t2 = now(device)
    if adopt:
        target_cache.hand_prefix(drafter)
    drafter.accept([o.num_accepted for o in outcomes], [o.next_token for o in outcomes], features)
    t3 = now(device)
    cost = _StepCost(draft_seconds=(t1 - t0) + (t3 - t2), target_seconds=t2 - t1,
                     draft_passes=drafter.forward_passes - passes)
    return _Step(cost, drafts, outcomes)


def _verify(scores: TargetScores, drafts: list[list[int]], proposal: Proposal, plan: StepPlan) -> list[VerifyOutcome]:
    """:func:`~specdec.core.sampling.verify_drafts` on the pass's scores: its greedy branch on the target's
    argmax ids, else its sampling branch with the proposal's ``q`` (None: one-hot on the drafts)."""
    if scores.target_argmax is not None:
        return verify_drafts(drafts, plan.stop_token_ids, target_argmax=scores.target_argmax)
    return verify_drafts(drafts, plan.stop_token_ids, p=scores.p, q=proposal.q, generator=plan.generator)


def _record_rows(rows: list[GenerationResult], contexts: list[list[int]], step: _Step, plan: StepPlan) -> list[int]:
    """One step's per-row bookkeeping (``rows`` / ``contexts``: the active rows', in the step's order): each row's
    seconds and draft passes, then :meth:`GenerationResult.record_verified` (the vLLM counters and the target
    pass, its accepted drafts plus the recovered / bonus token, EOS), the emitted tokens appended to its context,
    and whether it finished (an emitted stop token, or ``max_new_tokens`` reached).

    Returns:
        the indices into the active rows of the rows that go on.
    """
    keep = []
    for i, (row, context) in enumerate(zip(rows, contexts)):
        row.stats.target_seconds += step.cost.target_seconds
        row.stats.draft_seconds += step.cost.draft_seconds
        row.stats.draft_forward_passes += step.cost.draft_passes
        context.extend(row.record_verified(step.drafts[i], step.outcomes[i], stop_token_ids=plan.stop_token_ids))
        if not row.finished(plan.max_new_tokens):
            keep.append(i)
    return keep
