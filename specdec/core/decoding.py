"""The B = 1 entry points: the target-only reference loop and speculative decoding.

:func:`autoregressive_generate` (the target-only reference) and :func:`speculative_generate` check their inputs
and run the decoding loops of :mod:`specdec.core.loops` (:func:`~specdec.core.loops.target_only`,
:func:`~specdec.core.loops.speculate`) as a batch of one on a static target cache
(:class:`~specdec.core.target_cache.StaticTargetCache`). A left-padded batch (B > 1) goes to
:mod:`specdec.core.batch`, which runs the same loops on a masked cache.

All probability math lives in :mod:`specdec.core.sampling`.
"""

from __future__ import annotations

import torch

from specdec.core.batch import autoregressive_generate_batch, speculative_generate_batch
from specdec.core.config import ProposalSampling, SamplingConfig, check_sampling
from specdec.core.drafters import Drafter, as_drafter
from specdec.core.inputs import (
    check_draft_context,
    check_no_sliding_window,
    check_prompt,
    is_batch,
    num_speculative_tokens_argument,
    stop_token_ids,
    strip_padding,
)
from specdec.core.kv import model_device
from specdec.core.loops import StepPlan, speculate, target_only
from specdec.core.results import GenerationResult
from specdec.core.target_cache import StaticTargetCache

__all__ = ["autoregressive_generate", "speculative_generate", "GenerationResult"]


@torch.inference_mode()
def autoregressive_generate(
    target,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    max_new_tokens: int,
    sampling: SamplingConfig,
    eos_token_id: int | list[int] | None = None,
    generator: torch.Generator | None = None,
):
    """Target-only decoding with a KV cache: the reference that speculative decoding must match
    (:func:`specdec.core.loops.target_only`, a batch of one on a static cache).

    Args:
        target: transformers causal LM (eval mode).
        input_ids: LongTensor ``[1, prompt_len]``, prompt_len >= 1; or ``[B, L]`` with B > 1,
            left-padded, which runs :func:`specdec.core.batch.autoregressive_generate_batch`.
        attention_mask: ``[B, L]`` (1 = token, 0 = left padding) or None.
        max_new_tokens: maximum new tokens (>= 0).
        sampling: :class:`SamplingConfig` (temperature 0 = greedy).
        eos_token_id: an id or list of ids that end generation (the EOS is emitted).
        generator: ``torch.Generator`` for reproducible sampling.
    Returns:
        :class:`GenerationResult` for B = 1 (``stats`` counts target passes and seconds, no
        drafts); :class:`specdec.core.results.BatchGenerationResult` for B > 1.
    Raises:
        ValueError: malformed input or padding, empty prompt, negative ``max_new_tokens``, or
            prompt + ``max_new_tokens`` longer than the target's context.
    """
    check_sampling(sampling)
    if is_batch(input_ids):
        return autoregressive_generate_batch(
            target, input_ids, attention_mask, max_new_tokens=max_new_tokens, sampling=sampling,
            eos_token_id=eos_token_id, generator=generator,
        )
    input_ids = strip_padding(input_ids, attention_mask)
    context = check_prompt(target, input_ids, max_new_tokens)
    vocab_size = target.get_output_embeddings().weight.shape[0]
    plan = StepPlan(num_speculative_tokens=0, max_new_tokens=max_new_tokens, sampling=sampling,
                    proposal_sampling=None, stop_token_ids=stop_token_ids(eos_token_id), vocab_size=vocab_size,
                    generator=generator, device=model_device(target))
    cache = StaticTargetCache(target, context, len(context) + max_new_tokens, vocab_size)
    return target_only(cache, [context], plan).rows[0]


@torch.inference_mode()
def speculative_generate(
    target,
    drafter,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    num_speculative_tokens: int | None = None,
    max_new_tokens: int,
    sampling: SamplingConfig,
    eos_token_id: int | list[int] | None = None,
    generator: torch.Generator | None = None,
    num_draft_tokens: int | None = None,
    draft_sampling: str = "sampled",
    assistant_confidence_threshold: float | None = None,
) -> GenerationResult:
    """Exact speculative decoding (Leviathan et al. 2022, Alg. 1; Chen et al. 2023, Alg. 2).

    Each step: the drafter proposes up to k tokens; one target forward pass scores them all;
    :func:`~specdec.core.sampling.verify_drafts` accepts a prefix, then emits a recovered token (from
    the residual ``norm(max(0, p − q))``) or, if all were accepted, a bonus token. Output is
    distributed exactly as :func:`autoregressive_generate`'s; greedy output is token-identical.

    Args:
        target: transformers causal LM.
        drafter: a transformers causal LM (the draft model, wrapped in
            :class:`~specdec.core.drafters.ModelDrafter`), an :class:`~specdec.core.drafters.NgramDrafter`, or
            any object following the :class:`~specdec.core.drafters.Drafter` protocol.
        input_ids: LongTensor ``[1, prompt_len]``; or ``[B, L]`` with B > 1, left-padded, which
            runs :func:`specdec.core.batch.speculative_generate_batch` (per-row acceptance, per-row
            finishing, per-row stats; the same drafter protocol).
        attention_mask: ``[B, L]`` (1 = token, 0 = left padding) or None.
        num_speculative_tokens: k >= 1, tokens drafted per step. Fewer are drafted when fewer than
            k + 1 tokens remain (output never exceeds ``max_new_tokens``), after a drafted EOS, or
            when the n-gram drafter misses.
        max_new_tokens, sampling, eos_token_id, generator: as in :func:`autoregressive_generate`.
            An EOS accepted in the middle of a block ends generation at that token.
        num_draft_tokens: deprecated name of ``num_speculative_tokens`` (``DeprecationWarning``).
        draft_sampling: the proposal rule, ``"sampled"`` (x ~ q) or ``"argmax"`` (vLLM's: the
            draft's argmax verified with one-hot q); see :func:`~specdec.core.sampling.draft_step`.
            Both exact. The n-gram drafter is the same under both.
        assistant_confidence_threshold: stop drafting within a block right after a draft whose
            probability is below it (transformers' name; llama.cpp ``--draft-p-min``); None = off.
    Returns:
        :class:`GenerationResult` (B = 1) whose ``stats`` follow vLLM's counters: a step counts in
        ``num_drafts`` only if at least one token was proposed; for B > 1 a
        :class:`specdec.core.results.BatchGenerationResult` (``.rows`` of those, pooled ``.stats``).
    Raises:
        ValueError: as :func:`autoregressive_generate`, or ``num_speculative_tokens < 1``.
        TypeError: ``drafter`` is not a drafter or causal LM; ``sampling`` is not a
            :class:`SamplingConfig`; ``num_speculative_tokens`` is not an int.
    """
    k = num_speculative_tokens_argument(num_speculative_tokens, num_draft_tokens)
    check_sampling(sampling)
    if is_batch(input_ids):
        return speculative_generate_batch(
            target, drafter, input_ids, attention_mask, num_speculative_tokens=k,
            max_new_tokens=max_new_tokens, sampling=sampling, eos_token_id=eos_token_id, generator=generator,
            draft_sampling=draft_sampling, assistant_confidence_threshold=assistant_confidence_threshold,
        )
    proposal_sampling = ProposalSampling.of(sampling, draft_sampling, assistant_confidence_threshold)
    context, drafter = _checked_inputs(target, drafter, input_ids, attention_mask, max_new_tokens, k)
    drafter.start([list(context)])
    vocab_size = target.get_output_embeddings().weight.shape[0]
    plan = StepPlan(num_speculative_tokens=k, max_new_tokens=max_new_tokens, sampling=sampling,
                    proposal_sampling=proposal_sampling, stop_token_ids=stop_token_ids(eos_token_id),
                    vocab_size=vocab_size, generator=generator, device=model_device(target))
    cache = StaticTargetCache(target, context, len(context) + max_new_tokens + k + 1, vocab_size)
    return speculate(cache, drafter, [context], plan).rows[0]


def _checked_inputs(target, drafter, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                    max_new_tokens: int, k: int) -> tuple[list[int], Drafter]:
    """The prompt as a list of ids (padding stripped) and the drafter (:func:`as_drafter`), after checking
    that prompt + ``max_new_tokens`` (+ k drafts) fit both models' contexts and no model slides its window.

    Raises:
        ValueError: malformed input or padding, empty prompt, too long for a context, a sliding window.
        TypeError: ``drafter`` is not a drafter or causal LM.
    """
    input_ids = strip_padding(input_ids, attention_mask)
    context = check_prompt(target, input_ids, max_new_tokens)
    drafter = as_drafter(drafter)
    draft_model = drafter.model
    check_draft_context(draft_model, len(context) + max_new_tokens)
    check_no_sliding_window([target] + [m for m in [draft_model] if m is not None],
                            batched=False, max_columns=len(context) + max_new_tokens + k)
    return context, drafter
