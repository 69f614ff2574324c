"""The decoding loops: target-only reference and speculative decoding (thin and stateful).

All probability math lives in :mod:`specdec.core.sampling`; this module only moves tokens and KV
caches around and counts what happened.

KV-cache discipline (both models): the target cache holds a prefix of the sequence; each step
feeds the not-yet-cached tokens plus the k drafts in **one** target forward pass, then crops the
cache back to the verified prefix (the recovered or bonus token stays pending and is fed at the
next step). The first step's pass is the prefill. Nothing is recomputed from scratch.
"""

from __future__ import annotations

import torch

from specdec.core.batch import autoregressive_generate_batch, speculative_generate_batch
from specdec.core.config import ProposalSampling, SamplingConfig, check_sampling
from specdec.core.drafters import Drafter, Proposal, TargetFeatures, as_drafter
from specdec.core.inputs import (
    check_draft_context,
    check_no_sliding_window,
    check_prompt,
    is_batch,
    num_speculative_tokens_argument,
    stop_token_ids,
    strip_padding,
)
from specdec.core.finite import checked_argmax
from specdec.core.kv import crop_cache, forward_tokens_features, model_device, new_cache, now
from specdec.core.results import GenerationResult
from specdec.core.sampling import VerifyOutcome, logits_to_probs, sample, verify_drafts
from specdec.core.stats import DecodingStats

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
    """Target-only decoding with a KV cache: the reference that speculative decoding must match.

    Uses the same :func:`~specdec.core.sampling.logits_to_probs` and :func:`~specdec.core.sampling.sample`
    as the speculative path.

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
    stop = stop_token_ids(eos_token_id)
    device = model_device(target)
    stats = DecodingStats()
    result = GenerationResult(stats=stats)
    cache = new_cache(target, static=True, need=len(context) + max_new_tokens)
    pending = context
    while len(result.token_ids) < max_new_tokens:
        t0 = now(device)
        end = cache.get_seq_length() + len(pending)
        logits, _ = forward_tokens_features(target, pending, cache, 1, None, check=not sampling.is_greedy)
        if sampling.is_greedy:  # = sample(logits_to_probs(...)) for one-hot; one host read, finiteness folded in
            token = checked_argmax(target, logits, end)[0]
        else:
            token = sample(logits_to_probs(logits[-1], sampling), generator)
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
    drafter.start([context])
    stop = stop_token_ids(eos_token_id)
    device = model_device(target)
    vocab_size = target.get_output_embeddings().weight.shape[0]
    layer_ids = drafter.target_layer_ids
    stats = DecodingStats(num_speculative_tokens=k)
    result = GenerationResult(stats=stats)
    cache = new_cache(target, static=True, need=len(context) + max_new_tokens + k + 1)
    num_cached = 0  # positions of `context` held in the target cache
    draft_passes_before = drafter.forward_passes
    # a draft derived from this target adopts the target's prompt KV after a plain first step
    adopt = max_new_tokens > 0 and drafter.can_adopt_prefix(target, len(context))

    while not result.finished(max_new_tokens):
        budget = min(k, max_new_tokens - len(result.token_ids) - 1)
        t0 = now(device)
        if adopt:
            proposal = Proposal.empty(1, vocab_size, sampling)
        else:
            proposal = drafter.propose([context], [budget], proposal_sampling, vocab_size, generator, stop)
        drafts = proposal.row(0)
        t1 = now(device)
        stats.draft_seconds += t1 - t0

        fed = context[num_cached:] + drafts
        outcome, hidden = _verify(target, fed, cache, proposal, sampling, vocab_size, generator=generator, stop=stop,
                                  layer_ids=layer_ids)
        stats.target_seconds += now(device) - t1
        emitted = result.record_verified(drafts, outcome, stop_token_ids=stop)  # counters, tokens, EOS
        num_cached = _advance(context, emitted, cache, drafter, drafts, outcome, hidden=hidden, num_fed=len(fed),
                              adopt=adopt)
        adopt = False

    stats.draft_forward_passes = drafter.forward_passes - draft_passes_before
    stats.num_emitted_tokens = len(result.token_ids)
    return result


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


def _advance(context: list[int], emitted: list[int], cache, drafter: Drafter, drafts: list[int],
             outcome: VerifyOutcome, *, hidden: torch.Tensor | None, num_fed: int, adopt: bool) -> int:
    """The caches' side of one step, after :meth:`GenerationResult.record_verified` counted it: the ``emitted``
    tokens (accepted drafts plus the recovered/bonus token) join ``context``; the target cache is cropped to
    the verified prefix (the rejected drafts leave, the recovered/bonus token stays pending for the next step);
    the drafter learns the outcome (with the target's features of the ``num_fed`` fed positions, and the
    target's prompt KV when it ``adopt``s it).

    Returns:
        the verified positions now held in the target cache (prompt + earlier tokens + accepted drafts).
    """
    n_acc = outcome.num_accepted
    verified = len(context) + n_acc  # prompt + emitted + accepted drafts
    context.extend(emitted)
    crop_cache(cache, verified)  # drop rejected drafts; the recovered/bonus token stays pending
    features = None if hidden is None else TargetFeatures(
        hidden, torch.tensor([num_fed]), torch.tensor([num_fed - len(drafts) + n_acc]))
    if adopt:
        drafter.adopt_prefix(cache, verified)
    drafter.accept([n_acc], [outcome.next_token], features)
    return verified


def _verify(target, fed: list[int], cache, proposal: Proposal, sampling: SamplingConfig, vocab_size: int,
            *, generator, stop: frozenset[int], layer_ids) -> tuple[VerifyOutcome, torch.Tensor | None]:
    """One target pass over ``fed`` (the tokens the cache lacks, then the drafts) and the
    verification of row 0 of ``proposal`` by :func:`~specdec.core.sampling.verify_drafts` (its greedy
    branch on the target's argmax ids under greedy decoding, one host read with the finiteness check
    folded in; else its sampling branch). Returns the outcome and the target features
    ``[1, len(fed), D]`` (None when ``layer_ids`` is None).

    Raises:
        ValueError: the target's logits do not have ``vocab_size`` entries.
        NonFiniteLogits: non-finite target logits.
    """
    n = int(proposal.num_drafts[0])
    drafts = fed[len(fed) - n:] if n else []
    end = cache.get_seq_length() + len(fed)
    logits, hidden = forward_tokens_features(target, fed, cache, n + 1, layer_ids, check=not sampling.is_greedy)
    if logits.shape[-1] != vocab_size:
        raise ValueError(f"target logits have {logits.shape[-1]} entries, expected {vocab_size}")
    if sampling.is_greedy:  # q is one-hot on the drafts or irrelevant: the target's argmax decides
        return verify_drafts([drafts], stop, target_argmax=[checked_argmax(target, logits, end)])[0], hidden
    p = logits_to_probs(logits, sampling)[None]
    return verify_drafts([drafts], stop, p=p, q=proposal.q, generator=generator)[0], hidden
