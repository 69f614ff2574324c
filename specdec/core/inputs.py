"""Up-front checks of what the public decoding functions receive (shapes, types, ranges).

Every check raises before any model runs, with a message naming the argument.
"""

from __future__ import annotations

import warnings

import torch

from specdec.core.config import require_int


def stop_token_ids(eos_token_id) -> frozenset[int]:
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


def is_batch(input_ids) -> bool:
    """True for a tensor ``[B, L]`` with B > 1 (the batched path)."""
    return isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2 and input_ids.shape[0] > 1


def strip_padding(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """A single left-padded row ``[1, L]`` without its padding (validated as the batch path does)."""
    if attention_mask is None or not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        return input_ids
    mask = check_batch_inputs(None, input_ids, attention_mask, 0)  # no context bound here
    return input_ids[:, mask[0]]


def check_prompt(target, input_ids: torch.Tensor, max_new_tokens: int) -> list[int]:
    """Validate one prompt ``[1, L]`` (same checks as a batch) and return its ids as a list."""
    check_batch_inputs(target, input_ids, None, max_new_tokens)
    return [int(t) for t in input_ids[0].tolist()]


def check_batch_inputs(target, input_ids, attention_mask, max_new_tokens) -> torch.Tensor:
    """Validate a left-padded batch; returns the attention mask as a BoolTensor ``[B, L]``.

    Args:
        target: the target model (its ``config.max_position_embeddings`` bounds the length), or
            an object whose ``config`` is None (no bound).
        input_ids: integer tensor ``[B, L]``, B >= 1, L >= 1.
        attention_mask: ``[B, L]`` of 0/1 (bool, int or float) with left padding, or None.
        max_new_tokens: int >= 0.
    Raises:
        ValueError: wrong shapes or dtypes, mask values other than 0/1, right padding, an empty
            row, a token id outside ``[0, vocab_size)`` of the target, a negative
            ``max_new_tokens``, or a row + ``max_new_tokens`` longer than the target's context.
        TypeError: ``max_new_tokens`` not an int.
    """
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[0] < 1:
        shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise ValueError(f"input_ids must be an integer tensor of shape [batch >= 1, prompt_len], got {shape}")
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
        raise ValueError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
    if input_ids.shape[1] == 0:
        raise ValueError("empty prompt: input_ids must hold at least one token")
    require_int("max_new_tokens", max_new_tokens, 0)
    if attention_mask is None:
        mask = torch.ones(input_ids.shape, dtype=torch.bool, device=input_ids.device)
    else:
        attention_mask = torch.as_tensor(attention_mask, device=input_ids.device)
        if attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask shape {tuple(attention_mask.shape)} != input_ids shape {tuple(input_ids.shape)}"
            )
        if not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
            raise ValueError("attention_mask must hold only 0 (padding) and 1 (token)")
        mask = attention_mask.to(torch.bool)
    lengths = mask.sum(dim=1)
    if bool((lengths == 0).any()):
        raise ValueError("empty prompt: every row of attention_mask needs at least one 1")
    # left padding: each row is 0…0 1…1
    expected = torch.arange(mask.shape[1], device=mask.device)[None, :] >= (mask.shape[1] - lengths)[:, None]
    if not bool((expected == mask).all()):
        raise ValueError("attention_mask must use left padding (each row 0…0 1…1); pad with padding_side='left'")
    check_token_range("input_ids", input_ids[mask], vocab_size(target))
    config = getattr(target, "config", None)
    limit = getattr(config, "max_position_embeddings", None)
    if limit is not None and int(lengths.max()) + max_new_tokens > limit:
        raise ValueError(
            f"a prompt of {int(lengths.max())} tokens + max_new_tokens={max_new_tokens} exceeds the "
            f"target's context of {limit} tokens"
        )
    return mask


def sliding_window(model) -> int | None:
    """The attention window (tokens) of a sliding-window model (Mistral, Gemma 2/3, ...), else None."""
    cfg = getattr(model, "config", None)
    window = getattr(cfg, "sliding_window", None)
    if not window or getattr(cfg, "use_sliding_window", True) is False:
        return None
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types and not any("sliding" in str(t) for t in layer_types):
        return None
    return int(window)


def check_no_sliding_window(models, batched: bool, max_columns: int) -> None:
    """Refuse sliding-window models where the window could be reached.

    A sliding window counts cache columns. The batched cache keeps masked-out columns (left
    padding, rejected drafts), so a row would see less context than alone; and transformers'
    ``DynamicCache.crop`` (the B = 1 rollback) fails once a sliding layer is full.

    Raises:
        ValueError: if a model has a window smaller than ``max_columns`` (batched: any window).
    """
    for m in models:
        window = sliding_window(m)
        if window is not None and (batched or max_columns > window):
            raise ValueError(
                f"{type(m).__name__} uses sliding-window attention (window {window} tokens), which "
                + ("batched decoding does not support (masked cache columns would count against the window)"
                   if batched else f"speculative decoding does not support beyond the window "
                   f"(prompt + max_new_tokens + k = {max_columns} tokens)")
            )


def check_draft_context(draft_model, tokens: int) -> None:
    """Refuse a generation the draft model's context cannot hold (``max_position_embeddings``).

    The target's context is checked by :func:`check_batch_inputs`; a draft with a shorter context
    would otherwise fail (or silently degrade) in the middle of decoding.

    Args:
        draft_model: the draft causal LM, or None (n-gram drafter: nothing to check).
        tokens: the longest prompt + ``max_new_tokens``.
    Raises:
        ValueError: ``tokens`` exceeds the draft's context.
    """
    limit = getattr(getattr(draft_model, "config", None), "max_position_embeddings", None)
    if limit is not None and tokens > limit:
        raise ValueError(
            f"prompt + max_new_tokens = {tokens} tokens exceeds the draft model's context of {limit} tokens"
        )


def vocab_size(model) -> int | None:
    """Rows of ``model``'s output embedding (the ids it can score), or None for a non-model."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    weight = getattr(head, "weight", None)
    return int(weight.shape[0]) if weight is not None else None


def check_token_range(name: str, ids: torch.Tensor, vocab: int | None) -> None:
    """Refuse token ids outside ``[0, vocab)`` before they reach an embedding lookup.

    Args:
        name: the argument, for the message. ids: integer tensor of any shape. vocab: the
            model's vocabulary size (None: only negative ids are refused).
    Raises:
        ValueError: naming the first offending id.
    """
    if ids.numel() == 0:
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or (vocab is not None and high >= vocab):
        bad = low if low < 0 else high
        bound = f"[0, {vocab})" if vocab is not None else "[0, vocab_size)"
        raise ValueError(f"{name} holds token id {bad}, outside the target's vocabulary {bound}")


def check_draft_tokens(draft_tokens, vocab: int | None) -> None:
    """Refuse draft ids that are not token ids of the vocabulary, before any indexing.

    ``-1`` is vLLM's placeholder for an empty draft slot; a Python index of -1 would silently
    read the last vocabulary entry, so it is refused like any id outside ``[0, vocab)``.

    Args:
        draft_tokens: a list of ints or an integer tensor. vocab: the distributions' last
            dimension ``V`` (None: only negative ids are refused).
    Raises:
        ValueError: naming the first offending id and its position.
    """
    ids = draft_tokens.reshape(-1).tolist() if isinstance(draft_tokens, torch.Tensor) else list(draft_tokens)
    for i, x in enumerate(ids):
        if isinstance(x, bool) or not isinstance(x, int) and not hasattr(x, "__index__"):
            raise ValueError(f"draft token {i} is {x!r}, not an integer token id")
        if int(x) < 0 or (vocab is not None and int(x) >= vocab):
            bound = f"[0, {vocab})" if vocab is not None else "[0, vocab_size)"
            raise ValueError(f"draft token {i} is id {int(x)}, outside the vocabulary {bound}"
                             + (" (-1 is vLLM's placeholder for an empty slot, not a token)" if int(x) == -1 else ""))


def num_speculative_tokens_argument(num_speculative_tokens: int | None, num_draft_tokens: int | None) -> int:
    """k from the public keyword, or from the deprecated ``num_draft_tokens`` keyword.

    ``num_draft_tokens`` now names only the counter of proposed tokens (vLLM); passing k under
    that name still works for one release, with a ``DeprecationWarning``.

    Raises:
        TypeError: both given, neither given, or k not an int. ValueError: k < 1.
    """
    if num_draft_tokens is not None:
        if num_speculative_tokens is not None:
            raise TypeError("pass num_speculative_tokens only (num_draft_tokens is its deprecated name)")
        warnings.warn(
            "num_draft_tokens= is deprecated for k: use num_speculative_tokens= "
            "(num_draft_tokens now names only the counter of proposed tokens)",
            DeprecationWarning,
            stacklevel=3,
        )
        num_speculative_tokens = num_draft_tokens
    if num_speculative_tokens is None:
        raise TypeError("missing required keyword argument: num_speculative_tokens (k, draft tokens per step)")
    return require_int("num_speculative_tokens", num_speculative_tokens, 1)
