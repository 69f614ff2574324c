"""The decoding loops: target-only reference and speculative decoding (thin and stateful).

All probability math lives in :mod:`specdec.sampling`; this module only moves tokens and KV
caches around and counts what happened.

KV-cache discipline (both models): the target cache holds a prefix of the sequence; each step
feeds the not-yet-cached tokens plus the k drafts in **one** target forward pass, then crops the
cache back to the verified prefix (the recovered or bonus token stays pending and is fed at the
next step). The first step's pass is the prefill. Nothing is recomputed from scratch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specdec.drafters import as_drafter, crop_cache, forward_tokens, model_device, new_cache, now
from specdec.sampling import SamplingConfig, logits_to_probs, sample, verify_block, verify_greedy
from specdec.stats import DecodingStats


@dataclass
class GenerationResult:
    """What a generation produced.

    Attributes:
        token_ids: the new tokens only (prompt excluded), at most ``max_new_tokens``; ends with
            the EOS token if one was generated.
        stats: the pooled :class:`DecodingStats` of this generation.
        finish_reason: ``"eos"`` or ``"length"``.
    """

    token_ids: list[int] = field(default_factory=list)
    stats: DecodingStats = field(default_factory=DecodingStats)
    finish_reason: str = "length"


def _stop_ids(eos_token_id) -> frozenset[int]:
    """EOS ids as a frozenset: None, an int (Python, NumPy or a 0-d tensor) or an iterable of them.

    Raises:
        ValueError: a string or anything else that is not token ids.
    """
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, (str, bytes)):
        raise ValueError(f"eos_token_id must be an int or a list of ints, got {eos_token_id!r}")
    if isinstance(eos_token_id, torch.Tensor):
        return frozenset(int(t) for t in eos_token_id.reshape(-1).tolist())
    try:
        return frozenset([int(eos_token_id.__index__())])
    except (AttributeError, TypeError):
        pass
    try:
        return frozenset(int(t.__index__()) for t in eos_token_id)
    except (AttributeError, TypeError) as e:
        raise ValueError(f"eos_token_id must be an int or a list of ints, got {eos_token_id!r}") from e


def _is_batch(input_ids) -> bool:
    return isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2 and input_ids.shape[0] > 1


def _strip_padding(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """A single left-padded row ``[1, L]`` without its padding (validated as the batch path does)."""
    if attention_mask is None or not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        return input_ids
    from specdec.batch import check_batch_inputs

    mask = check_batch_inputs(None, input_ids, attention_mask, 0)  # no context bound here
    return input_ids[:, mask[0]]


def _check_inputs(target, input_ids: torch.Tensor, max_new_tokens: int) -> list[int]:
    """Validate one prompt ``[1, L]`` (same checks as a batch) and return its ids as a list."""
    from specdec.batch import check_batch_inputs

    check_batch_inputs(target, input_ids, None, max_new_tokens)
    return [int(t) for t in input_ids[0].tolist()]


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
    """Target-only decoding with a KV cache: the reference that speculative decoding must match.

    Uses the same :func:`~specdec.sampling.logits_to_probs` and :func:`~specdec.sampling.sample`
    as the speculative path.

    Args:
        target: transformers causal LM (eval mode).
        input_ids: LongTensor ``[1, prompt_len]``, prompt_len >= 1; or ``[B, L]`` with B > 1,
            left-padded, which runs :func:`specdec.batch.autoregressive_generate_batch`.
        attention_mask: ``[B, L]`` (1 = token, 0 = left padding) or None.
        max_new_tokens: maximum new tokens (>= 0).
        sampling: :class:`SamplingConfig` (temperature 0 = greedy).
        eos_token_id: an id or list of ids that end generation (the EOS is emitted).
        generator: ``torch.Generator`` for reproducible sampling.
    Returns:
        :class:`GenerationResult` for B = 1 (``stats`` counts target passes and seconds, no
        drafts); :class:`specdec.batch.BatchGenerationResult` for B > 1.
    Raises:
        ValueError: malformed input or padding, empty prompt, negative ``max_new_tokens``, or
            prompt + ``max_new_tokens`` longer than the target's context.
    """
    if _is_batch(input_ids):
        from specdec.batch import autoregressive_generate_batch

        return autoregressive_generate_batch(
            target, input_ids, attention_mask, max_new_tokens=max_new_tokens, sampling=sampling,
            eos_token_id=eos_token_id, generator=generator,
        )
    input_ids = _strip_padding(input_ids, attention_mask)
    context = _check_inputs(target, input_ids, max_new_tokens)
    stop = _stop_ids(eos_token_id)
    device = model_device(target)
    stats = DecodingStats()
    result = GenerationResult(stats=stats)
    cache = new_cache(target)
    pending = context
    while len(result.token_ids) < max_new_tokens:
        t0 = now(device)
        logits = forward_tokens(target, pending, cache, logits_to_keep=1)[-1]
        if sampling.is_greedy:
            token = int(logits.argmax())  # = sample(logits_to_probs(...)) for one-hot, one host read
        else:
            token = sample(logits_to_probs(logits, sampling), generator)
        stats.target_seconds += now(device) - t0
        stats.target_forward_passes += 1
        result.token_ids.append(token)
        pending = [token]
        if token in stop:
            result.finish_reason = "eos"
            break
    stats.num_emitted_tokens = len(result.token_ids)
    return result


@torch.inference_mode()
def speculative_generate(
    target,
    drafter,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    num_draft_tokens: int,
    max_new_tokens: int,
    sampling: SamplingConfig,
    eos_token_id: int | list[int] | None = None,
    generator: torch.Generator | None = None,
) -> GenerationResult:
    """Exact speculative decoding (Leviathan et al. 2022, Alg. 1; Chen et al. 2023, Alg. 2).

    Each step: the drafter proposes up to k tokens; one target forward pass scores them all;
    :func:`~specdec.sampling.verify_block` accepts a prefix, then emits a recovered token (from
    the residual ``norm(max(0, p − q))``) or, if all were accepted, a bonus token. Output is
    distributed exactly as :func:`autoregressive_generate`'s; greedy output is token-identical.

    Args:
        target: transformers causal LM.
        drafter: a transformers causal LM (the draft model, wrapped in
            :class:`~specdec.drafters.ModelDrafter`), an :class:`~specdec.drafters.NgramDrafter`, or
            any object following the :class:`~specdec.drafters.Drafter` protocol.
        input_ids: LongTensor ``[1, prompt_len]``; or ``[B, L]`` with B > 1, left-padded, which
            runs :func:`specdec.batch.speculative_generate_batch` (per-row acceptance, per-row
            finishing, per-row stats; a custom drafter object is then not supported).
        attention_mask: ``[B, L]`` (1 = token, 0 = left padding) or None.
        num_draft_tokens: k >= 1, tokens drafted per step. Fewer are drafted when fewer than
            k + 1 tokens remain (output never exceeds ``max_new_tokens``), after a drafted EOS, or
            when the n-gram drafter misses.
        max_new_tokens, sampling, eos_token_id, generator: as in :func:`autoregressive_generate`.
            An EOS accepted in the middle of a block ends generation at that token.
    Returns:
        :class:`GenerationResult` (B = 1) whose ``stats`` follow vLLM's counters: a step counts in
        ``num_drafts`` only if at least one token was proposed; for B > 1 a
        :class:`specdec.batch.BatchGenerationResult` (``.rows`` of those, pooled ``.stats``).
    Raises:
        ValueError: as :func:`autoregressive_generate`, or ``num_draft_tokens < 1``.
        TypeError: if ``drafter`` is not a drafter or causal LM.
    """
    if isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, int) or num_draft_tokens < 1:
        raise ValueError(f"num_draft_tokens must be an int >= 1, got {num_draft_tokens!r}")
    if _is_batch(input_ids):
        from specdec.batch import speculative_generate_batch

        return speculative_generate_batch(
            target, drafter, input_ids, attention_mask, num_draft_tokens=num_draft_tokens,
            max_new_tokens=max_new_tokens, sampling=sampling, eos_token_id=eos_token_id, generator=generator,
        )
    input_ids = _strip_padding(input_ids, attention_mask)
    context = _check_inputs(target, input_ids, max_new_tokens)
    drafter = as_drafter(drafter)
    from specdec.batch import check_no_sliding_window

    check_no_sliding_window([target] + [m for m in [getattr(drafter, "model", None)] if m is not None],
                            batched=False, max_columns=len(context) + max_new_tokens + num_draft_tokens)
    drafter.reset()
    stop = _stop_ids(eos_token_id)
    device = model_device(target)
    k = num_draft_tokens
    vocab_size = target.get_output_embeddings().weight.shape[0]
    stats = DecodingStats(num_draft_tokens_k=k)
    result = GenerationResult(stats=stats)
    cache = new_cache(target)
    num_cached = 0  # positions of `context` held in the target cache
    draft_passes_before = drafter.forward_passes

    while len(result.token_ids) < max_new_tokens:
        budget = min(k, max_new_tokens - len(result.token_ids) - 1)
        t0 = now(device)
        drafts, q = drafter.propose(context, budget, sampling, vocab_size, generator, stop)
        t1 = now(device)
        stats.draft_seconds += t1 - t0

        logits = forward_tokens(target, context[num_cached:] + drafts, cache, logits_to_keep=len(drafts) + 1)
        if logits.shape[-1] != vocab_size:
            raise ValueError(f"target logits have {logits.shape[-1]} entries, expected {vocab_size}")
        if q is None:  # greedy drafter output: ids only (see Drafter protocol)
            outcome = verify_greedy(drafts, logits.argmax(dim=-1).tolist(), stop)
        else:
            p = logits_to_probs(logits, sampling)
            outcome = verify_block(drafts, p, q.to(p.device), generator, stop)
        stats.target_seconds += now(device) - t1
        stats.target_forward_passes += 1

        n_acc = outcome.num_accepted
        if drafts:
            stats.num_drafts += 1
            stats.num_draft_tokens += len(drafts)
            stats.num_accepted_tokens += n_acc
            if not outcome.is_bonus and outcome.next_token >= 0:  # ended at a rejected draft
                stats.num_rejected_steps += 1
            for i in range(len(drafts)):
                stats.drafted_per_position[i] += 1
            for i in range(n_acc):
                stats.accepted_per_position[i] += 1

        verified = len(context) + n_acc  # prompt + emitted + accepted drafts
        emitted = drafts[:n_acc] + ([outcome.next_token] if outcome.next_token >= 0 else [])
        context.extend(emitted)
        result.token_ids.extend(emitted)
        crop_cache(cache, verified)  # drop rejected drafts; the recovered/bonus token stays pending
        num_cached = verified
        drafter.rollback(verified)
        if emitted and emitted[-1] in stop:
            result.finish_reason = "eos"
            break

    stats.draft_forward_passes = drafter.forward_passes - draft_passes_before
    stats.num_emitted_tokens = len(result.token_ids)
    return result
