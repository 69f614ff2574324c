"""Timing model passes: forward hooks split into prefill and decode passes (Leviathan's c needs per-pass costs)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from specdec.core.kv import model_device, sync

__all__ = ["PassTimer", "timed"]


class PassTimer:
    """Forward hooks that time every call of a model, split into prefill and later passes.

    The decoding core times whole steps; Leviathan's c is a ratio of *per-pass* costs in the
    decode loop, which the prompt prefill (hundreds of tokens for Spec-Bench summarization/RAG)
    would bias. The first call after :meth:`new_generation` is the prefill.
    """

    def __init__(self, model: torch.nn.Module | None) -> None:
        self.model = model
        self.handles: list[Any] = []
        self.decode_seconds = 0.0
        self.decode_passes = 0
        self.prefill_seconds = 0.0
        self._t0 = 0.0
        self._first = True
        self.device = model_device(model) if model is not None else torch.device("cpu")

    def __enter__(self) -> "PassTimer":
        if self.model is not None:
            self.handles = [
                self.model.register_forward_pre_hook(self._pre),
                self.model.register_forward_hook(self._post),
            ]
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    def new_generation(self) -> None:
        """The next call is a prefill (not counted as a decode pass)."""
        self._first = True

    def start_generation(self) -> tuple[float, int]:
        """:meth:`new_generation`, returning the decode totals so far (for :meth:`since`)."""
        self.new_generation()
        return self.decode_seconds, self.decode_passes

    def since(self, start: tuple[float, int]) -> tuple[float, int]:
        """Decode seconds and passes recorded after ``start`` (from :meth:`start_generation`)."""
        return self.decode_seconds - start[0], self.decode_passes - start[1]

    def _pre(self, module: Any, args: Any) -> None:
        sync(self.device)
        self._t0 = time.perf_counter()

    def _post(self, module: Any, args: Any, output: Any) -> None:
        sync(self.device)
        dt = time.perf_counter() - self._t0
        if self._first:
            self.prefill_seconds += dt
            self._first = False
        else:
            self.decode_seconds += dt
            self.decode_passes += 1


def timed(fn: Callable[[], Any], device: torch.device) -> tuple[Any, float]:
    """``(fn(), wall seconds)``, with ``device`` synchronised before and after."""
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t0
