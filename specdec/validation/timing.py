"""Timing model passes: forward hooks split into prefill and decode passes, and the calibration of c and v(n)
(isolated warm passes) that every prediction of a validation run uses."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from specdec.core.kv import model_device, sync

__all__ = ["PassTimer", "pass_costs", "calibrate", "Calibration", "PrefillCost", "verify_widths", "PREFILL_LONG_TOKENS"]

#: the second prefill length (tokens) :func:`calibrate` times, beside the calibration prompt: prefill per token
#: falls with the length until the GEMMs are wide (SmolLM2-135M fp32 on 2 EPYC threads: 0.047 one-token passes
#: per token at 40 tokens, 0.030 at 100, 0.027-0.028 from 200 to 1,100; docs/metrics.md)
PREFILL_LONG_TOKENS = 256


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


@torch.inference_mode()
def pass_costs(models: dict[str, tuple[Any, list[int]]], prompt: list[int], reps: int) -> dict[str, dict[int, float]]:
    """Median seconds of one forward pass per (model, width), warm KV cache, repetitions interleaved.

    Args:
        models: name -> (causal LM, widths). Each pass appends ``width`` tokens to the cached prompt
            and keeps ``width`` logits (as verification does); the cache is cropped back after it.
        prompt: token ids prefilled once per model (the KV the passes extend).
        reps: timed rounds (a first, untimed round warms up).
    Returns:
        ``{name: {width: median seconds}}``.
    """
    from specdec.core.kv import crop_cache, model_kwargs, new_cache

    state = {}
    for name, (model, _) in models.items():
        cache = new_cache(model)
        dev = model_device(model)
        model(input_ids=torch.tensor([prompt], device=dev), **model_kwargs(model, cache, 1))
        state[name] = (cache, dev)
    times: dict[str, dict[int, list[float]]] = {n: {w: [] for w in ws} for n, (_, ws) in models.items()}
    for _ in range(reps + 1):  # the first round warms up and is dropped
        for name, (model, widths) in models.items():
            cache, dev = state[name]
            for w in widths:
                ids = torch.full((1, w), prompt[-1], dtype=torch.long, device=dev)
                sync(dev)
                t0 = time.perf_counter()
                model(input_ids=ids, **model_kwargs(model, cache, w))
                sync(dev)
                times[name][w].append(time.perf_counter() - t0)
                crop_cache(cache, len(prompt))
    return {n: {w: statistics.median(v[1:]) for w, v in ws.items()} for n, ws in times.items()}


def verify_widths(kmax: int) -> list[int]:
    """The n whose verification cost v(n) is measured: 1..8 and 10, 12, 16, 24, 32 up to ``kmax``
    (every n >= kmax is covered by the last one; between measured n, v is interpolated)."""
    ns = [n for n in (*range(1, 9), 10, 12, 16, 24, 32) if n < kmax]
    return ns + [kmax] if kmax not in ns else ns


@dataclass(frozen=True)
class PrefillCost:
    """A prefill's cost over ``L`` prompt tokens, in one-token target passes: ``base + per_token * L``
    (a line through two measured lengths, :func:`calibrate`); 0 for ``L = 0`` (no prefill)."""

    per_token: float
    base: float = 0.0

    def __call__(self, tokens: int) -> float:
        return max(self.base + self.per_token * tokens, 0.0) if tokens > 0 else 0.0

    @classmethod
    def through(cls, points: list[tuple[int, float]]) -> "PrefillCost":
        """The line through ``[(tokens, cost)]`` (one point: through the origin; two: the first and
        the last), the slope floored at 0."""
        (l1, c1), (l2, c2) = points[0], points[-1]
        if l2 <= l1:
            return cls(c1 / l1 if l1 else math.nan)
        slope = max((c2 - c1) / (l2 - l1), 0.0)
        return cls(slope, c1 - slope * l1)


@dataclass
class Calibration:
    """Pass costs measured once per validation run, shared by every prediction of that run.

    Attributes:
        verify_cost: the fitted v(n) curve (:class:`specdec.validation.speed.VerifyCost`).
        cost_ratios: per drafter, c = draft one-token pass / target one-token pass (NaN for a drafter
            without a model: its lookup is timed in the run itself).
        target_step_s: the target's one-token pass, seconds.
        raw_verify: measured v(n) before the fit.
        target_prefill / draft_prefill: the target's and each draft model's prefill cost by prompt
            length (:class:`PrefillCost`, in one-token target passes; None: not measured; a drafter
            without a model: ``PrefillCost(0.0)``).
    """

    verify_cost: Any
    cost_ratios: list[float]
    target_step_s: float
    raw_verify: dict[int, float] = field(default_factory=dict)
    target_prefill: PrefillCost | None = None
    draft_prefill: list[PrefillCost | None] = field(default_factory=list)


def calibrate(target: torch.nn.Module, draft_models: list[torch.nn.Module | None], prompt: list[int], kmax: int,
              reps: int = 7, long_prompt: list[int] | None = None) -> Calibration:
    """Measure c for each draft model and v(n) for n in :func:`verify_widths` (isolated passes,
    warm KV cache, interleaved rounds, medians) on ``prompt``; v as measured (clipped to [1, n + 1],
    :meth:`VerifyCost.fit`). Prefill costs are timed on ``prompt`` and, when given, on the first
    :data:`PREFILL_LONG_TOKENS` tokens of ``long_prompt`` (:class:`PrefillCost` through both)."""
    from specdec.validation.speed import VerifyCost

    ns = verify_widths(max(1, kmax))
    models = {"target": (target, [1] + [n + 1 for n in ns])}
    models.update({f"d{i}": (m, [1]) for i, m in enumerate(draft_models) if m is not None})
    costs = pass_costs(models, prompt, reps)
    t1 = costs["target"][1]
    raw = {n: costs["target"][n + 1] / t1 for n in ns}
    c = [costs[f"d{i}"][1] / t1 if m is not None else math.nan for i, m in enumerate(draft_models)]
    long = (long_prompt or [])[:PREFILL_LONG_TOKENS]
    lengths = [prompt] + ([long] if len(long) > len(prompt) else [])  # a second length only if it is longer

    def prefill(m: torch.nn.Module) -> PrefillCost:
        return PrefillCost.through([(len(p), prefill_seconds(m, p) / t1) for p in lengths])

    pre = [prefill(m) if m is not None else PrefillCost(0.0) for m in draft_models]
    return Calibration(VerifyCost.fit(raw), c, t1, raw, prefill(target), pre)


def prefill_seconds(model: torch.nn.Module, prompt: list[int], reps: int = 3) -> float:
    """Median seconds of a prefill of ``prompt`` into a fresh KV cache (after one untimed one)."""
    from specdec.core.kv import model_kwargs, new_cache

    dev = model_device(model)
    ids = torch.tensor([prompt], device=dev)
    times = []
    for _ in range(reps + 1):
        cache = new_cache(model)
        sync(dev)
        t0 = time.perf_counter()
        model(input_ids=ids, **model_kwargs(model, cache, 1))
        sync(dev)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])
