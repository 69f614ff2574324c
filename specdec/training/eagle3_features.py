"""Draft vocabulary from token frequencies, and the target's features for head training.

The features of one sequence are what one teacher-forced target pass gives: the auxiliary hidden
states at ``eagle_aux_hidden_state_layer_ids`` (layer id ``i`` = the input of decoder layer ``i``,
residual included: ``transformers``' ``hidden_states[i]``, what vLLM collects for EAGLE-3 and what
``speculators`` trains on) and the final-norm output, from which the target's next-token logits over
the draft vocabulary are recomputed during training (``last @ lm_head[d2t ids].T``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specdec.training.eagle3_data import TrainingDataError, TrainingSequence

FEATURE_DTYPE = torch.bfloat16


class TrainingMemoryError(MemoryError):
    """Not enough free memory for the features or the training batch."""


def token_frequencies(seqs: list[TrainingSequence], vocab_size: int) -> torch.Tensor:
    """int64 ``[vocab_size]``: how often each target token occurs in the responses (loss-mask tokens)."""
    freq = torch.zeros(vocab_size, dtype=torch.long)
    for s in seqs:
        freq += torch.bincount(s.input_ids[s.loss_mask], minlength=vocab_size)[:vocab_size]
    return freq


def draft_vocab_mapping(freq: torch.Tensor, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d2t, t2d)`` in the ``speculators`` layout from token frequencies.

    The ``draft_vocab_size`` most frequent target tokens (ties and unseen tokens by lowest id), sorted
    by id. ``d2t``: int64 ``[draft_vocab_size]`` offsets, ``target_id = draft_id + d2t[draft_id]``;
    ``t2d``: bool ``[target_vocab_size]``, True for target ids in the draft vocabulary.

    Raises:
        ValueError: ``draft_vocab_size`` is not in ``1..len(freq)``.
    """
    v = len(freq)
    if not 1 <= draft_vocab_size <= v:
        raise ValueError(f"draft vocabulary size {draft_vocab_size} must be in 1..{v} (the target's vocabulary)")
    order = sorted(range(v), key=lambda t: (-int(freq[t]), t))
    ids = torch.tensor(sorted(order[:draft_vocab_size]), dtype=torch.long)
    d2t = ids - torch.arange(draft_vocab_size, dtype=torch.long)
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[ids] = True
    return d2t, t2d


def draft_token_ids(d2t: torch.Tensor) -> torch.Tensor:
    """Target ids of the draft vocabulary, int64 ``[draft_vocab_size]`` (``arange + d2t``)."""
    return torch.arange(len(d2t), dtype=torch.long) + d2t


@dataclass
class SequenceFeatures:
    """Target features of one :class:`TrainingSequence` (CPU, :data:`FEATURE_DTYPE`).

    Attributes:
        input_ids: int64 ``[T]``; loss_mask: bool ``[T]``.
        aux: ``[T, len(layer_ids) * hidden_size]``: auxiliary hidden states, concatenated in layer-id order.
        last: ``[T, hidden_size]``: the target's final-norm output (its logits are ``lm_head(last)``).
    """

    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    aux: torch.Tensor
    last: torch.Tensor


def _mem_available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_feature_memory(num_tokens: int, hidden_size: int, num_aux: int, headroom: float = 0.5) -> int:
    """Bytes the features of ``num_tokens`` tokens need; raises :class:`TrainingMemoryError` (one line)
    when that exceeds ``headroom`` times the available memory (``/proc/meminfo``; unchecked elsewhere)."""
    need = num_tokens * (num_aux + 1) * hidden_size * torch.finfo(FEATURE_DTYPE).bits // 8
    avail = _mem_available_bytes()
    if avail is not None and need > headroom * avail:
        raise TrainingMemoryError(f"the target features of {num_tokens} tokens need {need / 2**30:.1f} GiB but only "
                                  f"{avail / 2**30:.1f} GiB is free: use fewer or shorter training sequences")
    return need


@torch.inference_mode()
def target_features(model: torch.nn.Module, seq: TrainingSequence, layer_ids: list[int]) -> SequenceFeatures:
    """One teacher-forced pass of the target's decoder over ``seq`` (no LM head): the aux hidden states
    (:func:`specdec.core.features.capture_features`) and the final-norm output.

    Args:
        model: a ``transformers`` causal LM (its ``.model`` is the decoder stack).
        layer_ids: aux layer ids, each in ``0..num_hidden_layers``.
    Raises:
        ValueError: a layer id outside the target.
    """
    from specdec.core.features import capture_features

    dev = next(model.parameters()).device
    with capture_features(model, layer_ids) as grabbed:
        out = model.model(input_ids=seq.input_ids[None].to(dev), use_cache=False)
    return SequenceFeatures(seq.input_ids, seq.loss_mask, grabbed[-1][0].to("cpu", FEATURE_DTYPE),
                            out.last_hidden_state[0].to("cpu", FEATURE_DTYPE))


def all_target_features(model: torch.nn.Module, seqs: list[TrainingSequence], layer_ids: list[int],
                        progress: Callable[[int, int], None] | None = None) -> list[SequenceFeatures]:
    """:func:`target_features` of every sequence, after :func:`check_feature_memory`.

    Raises:
        TrainingDataError: no sequence; TrainingMemoryError: not enough memory.
    """
    if not seqs:
        raise TrainingDataError("no training sequences: the corpus gave no usable prompt")
    check_feature_memory(sum(len(s.input_ids) for s in seqs), model.config.hidden_size, len(layer_ids))
    feats = []
    for n, s in enumerate(seqs, 1):
        feats.append(target_features(model, s, layer_ids))
        if progress:
            progress(n, len(seqs))
    return feats


@torch.inference_mode()
def generated_features(target, prompts: list[list[int]], response_tokens: int, layer_ids: list[int], *,
                       batch_size: int = 16, progress: Callable[[int, int], None] | None = None
                       ) -> list[SequenceFeatures]:
    """The target answers ``prompts`` greedily and its features are kept from the same passes.

    Recipe ``tasks`` (:mod:`specdec.training.eagle3_prompts`): one ``generate`` call per ``batch_size``
    left-padded prompts (batched in order of length), with the aux hidden states
    (:func:`specdec.core.features.capture_features`) and the final-norm output captured on every pass
    (prefill, then one token per step), so no second teacher-forced pass is needed. A response is
    the greedy answer up to and including the end-of-sequence token, cut to the tokens whose
    features exist (the very last generated token of a batch is never fed back).

    Args:
        target: a ``LoadedModel`` (``.model``, ``.tokenizer``); prompts: token ids (chat template applied).
        response_tokens: at most this many new tokens per answer.
        layer_ids: aux layer ids (:func:`specdec.core.features.check_layer_ids`).
    Returns:
        :class:`SequenceFeatures` in the order of ``prompts`` (prompts with no kept answer token left out).
    """
    from specdec.core.features import capture_features

    model, tok = target.model, target.tokenizer
    dev = next(model.parameters()).device
    eos = tok.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else (eos if eos is not None else 0)
    order = sorted(range(len(prompts)), key=lambda j: len(prompts[j]))
    done: dict[int, SequenceFeatures] = {}
    normed: list[torch.Tensor] = []
    hook = model.model.norm.register_forward_hook(lambda m, a, out: normed.append(out))
    try:
        for i in range(0, len(order), batch_size):
            idx = order[i:i + batch_size]
            chunk = [prompts[j] for j in idx]
            width = max(len(p) for p in chunk)
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk], device=dev)
            attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=dev)
            normed.clear()
            with capture_features(model, layer_ids) as grabbed:
                out = model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=response_tokens,
                                     do_sample=False, pad_token_id=pad, eos_token_id=eos)
            aux, last = torch.cat(grabbed, dim=1), torch.cat(normed, dim=1)
            for r, (j, p) in enumerate(zip(idx, chunk)):
                row = out[r, width:].tolist()
                ans = (row[:row.index(eos) + 1] if eos is not None and eos in row else row)[:aux.shape[1] - width]
                if ans:
                    span = slice(width - len(p), width + len(ans))
                    seq = torch.tensor(p + ans, dtype=torch.long)
                    mask = torch.zeros(len(seq), dtype=torch.bool)
                    mask[len(p):] = True
                    done[j] = SequenceFeatures(seq, mask, aux[r, span].to("cpu", FEATURE_DTYPE),
                                               last[r, span].to("cpu", FEATURE_DTYPE))
            if progress:
                progress(min(i + batch_size, len(prompts)), len(prompts))
    finally:
        hook.remove()
    return [done[j] for j in range(len(prompts)) if j in done]
