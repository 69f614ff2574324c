"""Batched decoding (B > 1): target-only and speculative, with per-row acceptance.

Rows accept different numbers of drafts at each step, so their sequences drift apart; the
caches stay consistent through a per-row validity mask (:class:`specdec.core.kv.MaskedKV`):
rejected drafts become masked-out columns instead of forcing a re-pad, and finished rows (EOS or
``max_new_tokens``) leave the batch. The loops are :mod:`specdec.core.loops`' (``target_only``,
``speculate``) on a :class:`~specdec.core.target_cache.MaskedTargetCache` (B = 1 runs the same loops on a
static cache); this module checks the inputs and builds them.
"""

from __future__ import annotations

import torch

from specdec.core.config import ProposalSampling, SamplingConfig, check_sampling
from specdec.core.drafters import Drafter, as_drafter
from specdec.core.inputs import (
    check_batch_inputs,
    check_draft_context,
    check_no_sliding_window,
    num_speculative_tokens_argument,
    stop_token_ids,
)
from specdec.core.kv import model_device
from specdec.core.loops import StepPlan, speculate, target_only
from specdec.core.results import BatchGenerationResult
from specdec.core.target_cache import MaskedTargetCache

__all__ = ["autoregressive_generate_batch", "speculative_generate_batch", "BatchGenerationResult"]


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
    vocab_size = target.get_output_embeddings().weight.shape[0]
    contexts = [input_ids[b][mask[b]].tolist() for b in range(input_ids.shape[0])]
    plan = StepPlan(num_speculative_tokens=0, max_new_tokens=max_new_tokens, sampling=sampling,
                    proposal_sampling=None, stop_token_ids=stop_token_ids(eos_token_id), vocab_size=vocab_size,
                    generator=generator, device=model_device(target))
    return target_only(MaskedTargetCache(target, input_ids, mask, vocab_size), contexts, plan)


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
    vocab_size = target.get_output_embeddings().weight.shape[0]
    contexts = [input_ids[b][mask[b]].tolist() for b in range(input_ids.shape[0])]
    drafter = _started_drafter(target, drafter, contexts, int(mask.sum(dim=1).max()) + max_new_tokens)
    plan = StepPlan(num_speculative_tokens=k, max_new_tokens=max_new_tokens, sampling=sampling,
                    proposal_sampling=proposal_sampling, stop_token_ids=stop_token_ids(eos_token_id),
                    vocab_size=vocab_size, generator=generator, device=model_device(target))
    return speculate(MaskedTargetCache(target, input_ids, mask, vocab_size), drafter, contexts, plan)


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
