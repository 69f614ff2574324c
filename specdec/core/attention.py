"""Attention for the verification pass: grouped-query attention without copying the KV cache.

A verification pass feeds ``k + 1`` tokens against a cache of ``n`` positions, so transformers
builds an attention mask, and with a mask its ``sdpa`` attention repeats every layer's keys and
values to all query heads (``repeat_kv``: a copy of ``[B, H_q, n, D]`` per layer and pass, growing with
the context; SmolLM2-135M has 9 query heads over 3 KV heads). PyTorch's CPU SDPA kernels take a mask
together with ``enable_gqa=True`` and give bitwise the same output (checked in
tests/core/test_attention.py and benchmarks/results/2026-12-02-step-profile-cpu.md), so the loops of
:mod:`specdec.core` ask for that path with the keyword :data:`NATIVE_GQA` (see
:func:`specdec.core.kv.model_kwargs`). Every other call of ``sdpa`` (transformers' own ``generate``
included) is left to transformers' function unchanged.
"""

from __future__ import annotations

import torch

__all__ = ["NATIVE_GQA", "install", "wants_native_gqa"]

#: the forward keyword the loops pass to select native-GQA attention (popped before transformers' sdpa)
NATIVE_GQA = "specdec_native_gqa"
_ORIGINAL: list = []


def install() -> bool:
    """Register the wrapper as transformers' ``sdpa`` attention (once). Returns False where
    transformers has no ``AttentionInterface`` (then the keyword is never passed)."""
    if _ORIGINAL:
        return _ORIGINAL[0] is not None
    try:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface
    except ImportError:
        _ORIGINAL.append(None)
        return False
    _ORIGINAL.append(ALL_ATTENTION_FUNCTIONS["sdpa"])
    AttentionInterface.register("sdpa", sdpa_native_gqa)
    return True


def wants_native_gqa(model) -> bool:
    """True when ``model`` runs transformers' ``sdpa`` with fewer KV heads than query heads on the CPU
    (and the wrapper is installed): then the loops pass :data:`NATIVE_GQA`."""
    cfg = getattr(model, "config", None)
    if getattr(cfg, "_attn_implementation", None) != "sdpa":
        return False
    q, kv = getattr(cfg, "num_attention_heads", None), getattr(cfg, "num_key_value_heads", None)
    return bool(q and kv and kv < q) and install()


def sdpa_native_gqa(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, *, dropout: float = 0.0, scaling: float | None = None,
                    **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' ``sdpa`` attention (query ``[B, H_q, m, D]``, key/value ``[B, H_kv, n, D]``,
    mask ``[B, 1, m, n]``; returns ``([B, m, H_q, D], None)``), except that with :data:`NATIVE_GQA`
    set, a mask, m > 1 and a CPU tensor, SDPA runs with ``enable_gqa=True`` instead of on repeated KV."""
    native = kwargs.pop(NATIVE_GQA, False)
    if not (native and attention_mask is not None and query.shape[2] > 1 and query.device.type == "cpu"
            and getattr(module, "num_key_value_groups", 1) > 1 and kwargs.get("position_bias") is None
            and kwargs.get("softcap") is None and not module.training):
        return _ORIGINAL[0](module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scaling,
                                                           enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None
