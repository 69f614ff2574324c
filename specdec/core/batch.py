"""Batched decoding (B > 1): target-only and speculative, with per-row acceptance.

Rows accept different numbers of drafts at each step, so their sequences drift apart; the
caches stay consistent through a per-row validity mask (:class:`specdec.core.kv.MaskedKV`):
rejected drafts become masked-out columns instead of forcing a re-pad, and finished rows (EOS or
``max_new_tokens``) leave the batch. Drafts come from the one drafter protocol
(:mod:`specdec.core.drafters`), with every active row at once.

The probability math is :func:`specdec.core.sampling.verify_drafts` (Leviathan Alg. 1 per row, the
verifier of the B = 1 loop too); the per-row bookkeeping is
:meth:`specdec.core.results.GenerationResult.record_verified`, shared with B = 1 and the replay;
nothing here decides acceptance.
"""

from __future__ import annotations

import torch

from specdec.core.config import ProposalSampling, SamplingConfig, check_sampling
from specdec.core.drafters import Drafter, Proposal, TargetFeatures, as_drafter
from specdec.core.inputs import (
    check_batch_inputs,
    check_draft_context,
    check_no_sliding_window,
    num_speculative_tokens_argument,
    stop_token_ids,
)
from specdec.core.kv import MaskedKV, compact_rows, model_device, now
from specdec.core.results import BatchGenerationResult, GenerationResult
from specdec.core.sampling import VerifyOutcome, logits_to_probs, sample_rows, verify_drafts
from specdec.core.stats import DecodingStats

__all__ = ["autoregressive_generate_batch", "speculative_generate_batch", "BatchGenerationResult"]


def _new_rows(batch_size: int, k: int) -> list[GenerationResult]:
    return [GenerationResult(stats=DecodingStats(num_speculative_tokens=k)) for _ in range(batch_size)]


def _pool(rows, k: int, target_seconds: float, draft_seconds: float) -> DecodingStats:
    pooled = DecodingStats(num_speculative_tokens=k)
    for r in rows:
        pooled = pooled.merge(r.stats)
    pooled.target_seconds, pooled.draft_seconds = target_seconds, draft_seconds
    return pooled


@torch.inference_mode()
def autoregressive_generate_batch(
    target, input_ids, attention_mask=None, *, max_new_tokens, sampling: SamplingConfig,
    eos_token_id=None, generator=None,
) -> BatchGenerationResult:
    """Target-only decoding of a left-padded batch; each row as :func:`autoregressive_generate`.

    Args:
        target: transformers causal LM.
        input_ids: LongTensor ``[B, L]``, left-padded.
        attention_mask: ``[B, L]`` (1 = token, 0 = left padding) or None (no padding).
        max_new_tokens, sampling, eos_token_id, generator: as :func:`autoregressive_generate`.
    Returns:
        :class:`BatchGenerationResult`.
    Raises:
        ValueError: see :func:`check_batch_inputs`.
    """
    check_sampling(sampling)
    mask = check_batch_inputs(target, input_ids, attention_mask, max_new_tokens)
    check_no_sliding_window([target], batched=True, max_columns=0)
    input_ids = input_ids.long().masked_fill(~mask, 0)  # padding ids may lie outside the vocabulary
    stop = stop_token_ids(eos_token_id)
    device = model_device(target)
    rows = _new_rows(input_ids.shape[0], 0)
    active = list(range(len(rows)))
    kv = MaskedKV(target, len(rows))
    ids, valid = input_ids.to(device), mask.to(device)
    wall, calls = 0.0, 0
    while active and max_new_tokens > 0:
        t0 = now(device)
        logits = kv.forward(ids, valid, logits_to_keep=1)[:, -1]
        tokens = sample_rows(logits_to_probs(logits, sampling), generator).tolist()
        dt = now(device) - t0
        wall += dt
        calls += 1
        keep = []
        for i, b in enumerate(active):
            r = rows[b]
            r.stats.target_forward_passes += 1
            r.stats.target_seconds += dt
            r.token_ids.append(tokens[i])
            if tokens[i] in stop:
                r.finish_reason = "eos"
            elif len(r.token_ids) < max_new_tokens:
                keep.append(i)
        if len(keep) < len(active):
            sel = torch.tensor(keep, dtype=torch.long, device=device)
            kv.select(sel)
            tokens = [tokens[i] for i in keep]
            active = [active[i] for i in keep]
        ids = torch.tensor(tokens, dtype=torch.long, device=device)[:, None]
        valid = torch.ones(len(active), 1, dtype=torch.bool, device=device)
    for r in rows:
        r.stats.num_emitted_tokens = len(r.token_ids)
    return BatchGenerationResult(rows=rows, stats=_pool(rows, 0, wall, 0.0), target_calls=calls)


@torch.inference_mode()
def speculative_generate_batch(
    target, drafter, input_ids, attention_mask=None, *, num_speculative_tokens=None, max_new_tokens,
    sampling: SamplingConfig, eos_token_id=None, generator=None, num_draft_tokens=None,
    draft_sampling: str = "sampled", assistant_confidence_threshold: float | None = None,
) -> BatchGenerationResult:
    """Exact speculative decoding of a left-padded batch (Leviathan et al. 2022, Alg. 1 per row).

    Every step drafts up to k tokens for all active rows, scores all rows' blocks in one target
    forward pass ``[B, k + 1]`` (the first pass is the prefill), and verifies each row with
    :func:`~specdec.core.sampling.verify_drafts`. Rows accept different numbers of tokens; their
    caches stay consistent through the validity mask (:class:`~specdec.core.kv.MaskedKV`). Each
    row's output is distributed as its own B = 1 target-only output; greedy rows are
    token-identical to it (up to float rounding differences between batched and single-row kernels).

    Args:
        target: transformers causal LM.
        drafter: draft causal LM, or any :class:`~specdec.core.drafters.Drafter`
            (:class:`~specdec.core.drafters.ModelDrafter`, :class:`~specdec.core.drafters.NgramDrafter`).
        input_ids: LongTensor ``[B, L]``, left-padded.
        attention_mask: ``[B, L]`` (1 = token, 0 = left padding) or None.
        num_speculative_tokens: k >= 1. Row b drafts ``min(k, max_new_tokens − emitted_b − 1)``.
        max_new_tokens, sampling, eos_token_id, generator: as :func:`speculative_generate`.
        num_draft_tokens: deprecated name of ``num_speculative_tokens`` (``DeprecationWarning``).
        draft_sampling, assistant_confidence_threshold: the proposal rule and the draft-length
            policy, as :func:`specdec.core.decoding.speculative_generate`.
    Returns:
        :class:`BatchGenerationResult`: per-row results and stats (vLLM counters), pooled stats.
    Raises:
        ValueError: bad shapes, padding or token ids (:func:`check_batch_inputs`), k < 1.
        TypeError: unsupported drafter, ``sampling`` not a SamplingConfig, k not an int.
    """
    k = num_speculative_tokens_argument(num_speculative_tokens, num_draft_tokens)
    check_sampling(sampling)
    proposal_sampling = ProposalSampling.of(sampling, draft_sampling, assistant_confidence_threshold)
    mask = check_batch_inputs(target, input_ids, attention_mask, max_new_tokens)
    input_ids = input_ids.long().masked_fill(~mask, 0)  # padding ids may lie outside the vocabulary
    stop = stop_token_ids(eos_token_id)
    device = model_device(target)
    vocab_size = target.get_output_embeddings().weight.shape[0]
    B = input_ids.shape[0]
    rows = _new_rows(B, k)
    contexts = [input_ids[b][mask[b]].tolist() for b in range(B)]
    active = list(range(B))
    target_kv = MaskedKV(target, B)
    drafter = _started_drafter(target, drafter, contexts, int(mask.sum(dim=1).max()) + max_new_tokens)
    layer_ids = drafter.target_layer_ids
    pending_ids, pending_valid = input_ids.to(device), mask.to(device)  # tokens not yet in the target cache
    target_wall = draft_wall = 0.0
    target_calls, draft_passes_before = 0, drafter.forward_passes
    while active and max_new_tokens > 0:
        limits = [min(k, max_new_tokens - len(rows[b].token_ids) - 1) for b in active]
        t0 = now(device)
        proposal = drafter.propose([contexts[b] for b in active], limits, proposal_sampling, vocab_size, generator, stop)
        drafts = [r[:n] for r, n in zip(proposal.tokens.tolist(), proposal.num_drafts.tolist())]
        t1 = now(device)
        outcomes, features = _verify_rows(target_kv, pending_ids, pending_valid, proposal, drafts, sampling=sampling,
                                          generator=generator, stop=stop, layer_ids=layer_ids)
        next_tokens = [o.next_token for o in outcomes]
        drafter.accept([o.num_accepted for o in outcomes], next_tokens, features)
        t2 = now(device)
        target_wall += t2 - t1
        target_calls += 1
        draft_wall += t1 - t0

        keep = _record_rows(rows, contexts, active, drafts, outcomes, draft_passes=proposal.forward_passes,
                            draft_seconds=t1 - t0, target_seconds=t2 - t1, stop=stop, max_new_tokens=max_new_tokens)
        if len(keep) < len(active):
            selected = torch.tensor(keep, dtype=torch.long, device=device)
            target_kv.select(selected)
            drafter.select(selected)
            active = [active[i] for i in keep]
        # the recovered/bonus token of each remaining row is fed at the next step
        pending_ids = torch.tensor([next_tokens[i] for i in keep], dtype=torch.long, device=device)[:, None]
        pending_valid = torch.ones(len(active), 1, dtype=torch.bool, device=device)
    for r in rows:
        r.stats.num_emitted_tokens = len(r.token_ids)
    return BatchGenerationResult(rows=rows, stats=_pool(rows, k, target_wall, draft_wall), target_calls=target_calls,
                                 draft_calls=drafter.forward_passes - draft_passes_before)


def _started_drafter(target, drafter, contexts: list[list[int]], max_columns: int) -> Drafter:
    """``drafter`` as a :class:`~specdec.core.drafters.Drafter`, started on copies of the rows' ``contexts``,
    after checking that ``max_columns`` (longest prompt + ``max_new_tokens``) fits the draft model's context
    and that no model slides its window (batched caches cannot).

    Raises:
        TypeError: unsupported drafter. ValueError: too long for the draft's context, a sliding window.
    """
    drafter = as_drafter(drafter)
    drafter.start([list(c) for c in contexts])
    draft_model = drafter.model
    check_draft_context(draft_model, max_columns)
    check_no_sliding_window([target] + [m for m in [draft_model] if m is not None], True, 0)
    return drafter


def _record_rows(rows: list[GenerationResult], contexts: list[list[int]], active: list[int], drafts: list[list[int]],
                 outcomes: list[VerifyOutcome], *, draft_passes: int, draft_seconds: float, target_seconds: float,
                 stop: frozenset[int], max_new_tokens: int) -> list[int]:
    """One step's per-row bookkeeping: each active row's pass counts and seconds, then
    :meth:`GenerationResult.record_verified` (the vLLM counters, its accepted drafts plus the recovered/bonus
    token, EOS), the emitted tokens appended to its context, and whether it finished (an emitted stop token,
    or ``max_new_tokens`` reached). ``drafts[i]`` / ``outcomes[i]``: active row i's drafts and verdict.

    Returns:
        the indices into ``active`` of the rows that go on.
    """
    keep = []
    for i, b in enumerate(active):
        row, stats = rows[b], rows[b].stats
        stats.target_seconds += target_seconds
        stats.draft_seconds += draft_seconds
        stats.draft_forward_passes += draft_passes
        contexts[b].extend(row.record_verified(drafts[i], outcomes[i], stop_token_ids=stop))
        if not row.finished(max_new_tokens):
            keep.append(i)
    return keep


def _verify_rows(target_kv: MaskedKV, pending_ids, pending_valid, proposal: Proposal, drafts: list[list[int]],
                 *, sampling: SamplingConfig, generator, stop: frozenset[int], layer_ids):
    """One target pass over every row's block (pending tokens ``[B, m]`` left-padded, then the
    proposal's drafts ``[B, w]``, slots at or beyond ``num_drafts[b]`` invalid), the verification of
    every row by :func:`~specdec.core.sampling.verify_drafts` (``drafts``: each row's proposed ids; its
    greedy branch on the target's argmax ids under greedy decoding, else its sampling branch), and the
    rollback of the target cache to each row's last pending token + accepted drafts.

    Returns:
        ``(list[VerifyOutcome] per row, TargetFeatures | None)``: features of each row's fed positions,
        compacted to ``[B, n, D]`` (None when ``layer_ids`` is None).
    Raises:
        NonFiniteLogits: non-finite target logits at a valid slot.
    """
    device = pending_ids.device
    tokens, num_drafts = proposal.tokens.to(device), proposal.num_drafts.to(device)
    width = tokens.shape[1]
    block = torch.cat([pending_ids, tokens], dim=1)
    block_valid = torch.cat([pending_valid, torch.arange(width, device=device)[None, :] < num_drafts[:, None]], dim=1)
    logits, hidden = target_kv.forward_features(block, block_valid, width + 1, layer_ids)
    if sampling.is_greedy:  # one host read: the target's argmax at each row's drafted and bonus slots
        argmax = [a[: len(d) + 1] for a, d in zip(logits.argmax(dim=-1).tolist(), drafts)]
        outcomes = verify_drafts(drafts, stop, target_argmax=argmax)
    else:
        outcomes = verify_drafts(drafts, stop, p=logits_to_probs(logits, sampling), q=proposal.q, generator=generator)
    num_accepted = torch.tensor([o.num_accepted for o in outcomes], dtype=torch.long, device=device)
    target_kv.invalidate_tail(num_accepted + 1, width + 1)  # keep the last pending token + accepted drafts
    if hidden is None:
        return outcomes, None
    num_fed = block_valid.sum(dim=1)
    return outcomes, TargetFeatures(compact_rows(hidden, block_valid), num_fed, num_fed - num_drafts + num_accepted)
