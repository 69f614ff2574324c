"""CPU kernel choice for one-token passes of a bf16 draft.

On a CPU, PyTorch sends a bf16 ``nn.Linear`` to oneDNN (mkldnn) whenever oneDNN is enabled. For a
matrix-*vector* product (one query row: the draft's decode step) oneDNN is the slower choice here;
ATen's own bf16 GEMV is faster. For two or more rows oneDNN wins by a wide margin (its blocked GEMM),
so the switch is per call, decided by the number of query rows.

Measured per CPU (one decode pass of the fp32 target, of its bf16 copy and of the LM head, with oneDNN on
and off, one and eight rows): ``benchmarks/results/bf16_kernels.md`` (AMD EPYC) and ``bf16_kernels-xeon.md``;
docs/metrics.md, "Speed". Only *which kernel runs* changes; the weights and the model are the same,
and exactness never depends on it (the target verifies).
"""

from __future__ import annotations

import threading
from typing import Any

import torch

__all__ = ["use_gemv_for_single_row", "single_row"]


def single_row(args: tuple, kwargs: dict) -> bool:
    """True when a causal-LM call (``model(input_ids=...)`` or ``model(inputs_embeds=...)``, or
    ``input_ids`` as the first positional argument) carries exactly one query token over the whole
    batch (``input_ids.numel() == 1``, or ``inputs_embeds`` of shape ``[1, 1, hidden]``)."""
    ids = kwargs.get("input_ids", args[0] if args else None)
    if isinstance(ids, torch.Tensor):
        return ids.numel() == 1
    emb = kwargs.get("inputs_embeds")
    return isinstance(emb, torch.Tensor) and emb.dim() == 3 and emb.shape[0] * emb.shape[1] == 1


def use_gemv_for_single_row(model: torch.nn.Module) -> torch.nn.Module:
    """Make ``model``'s one-row forward passes run with oneDNN disabled (ATen's bf16 GEMV).

    Two forward hooks on the instance do it (the class and other instances are untouched, and a
    ``copy.deepcopy`` of the model keeps the behaviour without referring back to the original): the
    pre-hook turns oneDNN off for a one-row call, the post-hook (``always_call=True``) restores the
    previous setting, even when the forward raises. ``torch.backends.mkldnn.set_flags`` changes a
    process-global flag (the enable flag only), so the switch is made and undone around each call
    (about a microsecond). Calls with more than one query row run exactly as before.

    Args:
        model: a CPU causal LM whose weights are bfloat16 (a ``derived:bf16`` draft).
    Returns:
        The same module, with ``model.single_row_kernel == "aten-gemv"``.
    Raises:
        ValueError: ``model`` is not on the CPU or its weights are not bfloat16 (nothing to gain, and
            on a GPU oneDNN is not involved).
    """
    p = next(model.parameters())
    if p.device.type != "cpu" or p.dtype != torch.bfloat16:
        raise ValueError(f"use_gemv_for_single_row is for bf16 models on the CPU, got {p.dtype} on {p.device.type}")
    if getattr(model, "single_row_kernel", None) == "aten-gemv":
        return model
    saved = threading.local()

    def before(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        stack = saved.__dict__.setdefault("stack", [])
        if single_row(args, kwargs):
            stack.append(torch.backends.mkldnn.set_flags(False, None, None, None)[0])
        else:
            stack.append(None)

    def after(module: torch.nn.Module, args: tuple, output: Any) -> None:
        stack = saved.__dict__.get("stack")
        if stack:
            was_enabled = stack.pop()
            if was_enabled is not None:
                torch.backends.mkldnn.set_flags(was_enabled, None, None, None)

    model.register_forward_pre_hook(before, with_kwargs=True)
    model.register_forward_hook(after, always_call=True)
    model.single_row_kernel = "aten-gemv"
    return model
