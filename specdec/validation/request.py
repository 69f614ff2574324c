"""The one validation entry's typed request, its resolved form, and the rules the measurements share.

:class:`ValidationRequest` is what every caller builds for :func:`specdec.validation.validate`;
:class:`ValidationRun` is the request resolved once (target, tokenizer, subset, drafters under test) and
handed to the measurements (:mod:`specdec.validation.decode`, :mod:`specdec.validation.replay_report`, and with
``engine_check`` :mod:`specdec.validation.engine_check`);
:func:`gate_method` decides which measurement a report is built from; :func:`calibrate_on` measures the pass
costs both share.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from specdec.validation.config import ValidationConfig
from specdec.validation.heldout import HeldoutSet
from specdec.validation.prompt_run import DrafterUnderTest
from specdec.validation.report import PromptResult
from specdec.validation.timing import Calibration, calibrate

__all__ = ["ValidationRequest", "ValidationProgress", "ValidationRun", "METHODS", "REDUCED_PRECISIONS",
           "gate_method", "precision_of", "calibrate_on", "CALIBRATED_KMAX"]

#: the v(n) curve is measured for n up to at least this (the recommended k is chosen among 1..it)
CALIBRATED_KMAX = 8
#: what a validation measures: speculative decoding, replay, replay with a decoded subsample, or only the engine
#: check (``engine``: needs ``engine_check``; with the others ``engine_check`` runs after them)
METHODS = ("decode", "replay", "both", "engine")
#: activations computed in these precisions make replay and decoding two measurements (decoding gates)
REDUCED_PRECISIONS = ("bf16", "fp16", "fp8")


@dataclass(frozen=True)
class ValidationProgress:
    """One step of a validation, for a progress callback: ``phase`` (``"replay"``, ``"decode"`` or ``"engine"``),
    prompts ``done`` of ``total``, and in the decode phase each drafter's :class:`PromptResult` of the prompt just done
    (skipped prompts as they are found; with ``batch_size`` > 1 once per prompt after its group)."""

    phase: str
    done: int
    total: int
    rows: tuple[PromptResult, ...] = ()


@dataclass(frozen=True)
class ValidationRequest:
    """What to validate and how (the one input of :func:`validate`).

    Attributes:
        target: a :class:`specdec.models.LoadedModel` (model + tokenizer), or a bare causal LM with ``tokenizer``.
        drafters: each a draft causal LM, an :class:`~specdec.NgramDrafter`, an EAGLE-3 drafter, or a
            :class:`specdec.kinds.ResolvedDrafter` (which carries its kind, ref and recipe).
        heldout: the prompts; ``config.limit`` takes a stratified subset (seeded by ``config.seed``).
        config: :class:`ValidationConfig` (None: k=4, 64 new tokens, greedy).
        method: one of :data:`METHODS`.
        decode_fraction: ``"both"``: share of the prompts decoded, in (0, 1] (:func:`decode_subsample`).
        kmax: largest k of the replayed acceptance-by-k table (sampling: at most 8).
        exact: greedy replay: also run the draft after each rejected token (exact ``num_draft_tokens``).
        cache: the continuation cache of replay and of the engine check's core continuations (the entry
            point's, :meth:`ContinuationCache.in_home`); needed by methods ``replay``, ``both`` and ``engine``.
        calibration: pass costs to reuse (:func:`specdec.validation.timing.calibrate`); None: measured after a
            warm-up when ``config.warmup`` and ``batch_size`` is 1.
        target_ref: name recorded in the reports (None: the LoadedModel's source ref or path).
        tokenizer: required when ``target`` is a bare model.
        progress: called with a :class:`ValidationProgress` after each prompt of each phase.
        engine: greedy replay: the target's continuations come from the engine serving it
            (:class:`~specdec.validation.engine_continuations.EngineContinuations`); ``target`` may then be a
            :func:`~specdec.validation.served_target.served_target` (no weights; method ``replay`` only).
        target_weights: the target's weights sha256 as registered (keys the continuation cache without
            hashing the weight files; None: hashed here, or for a served target its config's hash).
        replayed: a replay measured elsewhere (:func:`specdec.validation.shard.pool` of a night's shards):
            the report is built from it instead of replaying here.
        engine_check: the engine check of the (one) drafter where it is served
            (:class:`~specdec.validation.engine_check.EngineCheck`: endpoint, concurrency, limits, pair identity);
            its :class:`~specdec.validation.engine_report.EngineCheckReport` is the report's ``engine_check``.
            Method ``engine`` runs only it.
    """

    target: Any
    drafters: Sequence[Any]
    heldout: HeldoutSet
    config: ValidationConfig | None = None
    method: str = "decode"
    decode_fraction: float = 0.25
    kmax: int = 16
    exact: bool = False
    cache: Any = None  # specdec.validation.continuation_cache.ContinuationCache
    calibration: Calibration | None = None
    target_ref: str | None = None
    tokenizer: Any = None
    progress: Callable[[ValidationProgress], None] | None = None
    engine: Any = None  # specdec.validation.engine_continuations.EngineContinuations
    target_weights: str | None = None
    replayed: Any = None  # specdec.validation.replay_report.ReplayMeasurement
    engine_check: Any = None  # specdec.validation.engine_check.EngineCheck


@dataclass(frozen=True)
class ValidationRun:
    """A request resolved once for the measurements: the target (model, tokenizer, ref), the config, the
    held-out subset, EOS ids, the models' smallest context and the drafters under test."""

    request: ValidationRequest
    config: ValidationConfig
    model: torch.nn.Module
    tokenizer: Any
    target_ref: str
    subset: HeldoutSet
    eos: Any
    ctx_limit: int | None
    drafters: list[DrafterUnderTest]

    def continuation_cache(self) -> Any:
        """The request's :class:`~specdec.validation.continuation_cache.ContinuationCache`.

        Raises:
            ValueError: the request has none (one line: the caller hands its home's cache down).
        """
        if self.request.cache is None:
            raise ValueError(f"method {self.request.method!r} replays continuations: give the request a continuation "
                             "cache (ValidationRequest.cache = ContinuationCache.in_home(home))")
        return self.request.cache

    def progress(self, phase: str, done: int, total: int, rows: Sequence[PromptResult] = ()) -> None:
        """Tell the request's progress callback, if any."""
        if self.request.progress is not None:
            self.request.progress(ValidationProgress(phase, done, total, tuple(rows)))


def gate_method(method: str, precision: str, counted: bool) -> str:
    """Which measurement a report is built from: ``"replay"`` alone, ``"decode"`` alone, and with ``"both"``
    the replay when it is the same computation as decoding (fp32 activations on both sides; int8/int4 copies
    quantize weights only) and counts exactly, else decoding, which is what serving runs."""
    if method != "both":
        return method
    return "decode" if precision in REDUCED_PRECISIONS or not counted else "replay"


def precision_of(target: torch.nn.Module, draft: torch.nn.Module | None, recipe: dict | None) -> str:
    """The lowest precision either side computes in: ``fp8``, ``bf16``, ``fp16``, ``int4``, ``int8`` or ``fp32``."""
    dtypes = {p.dtype for m in (target, draft) if m is not None for p in m.parameters() if p.is_floating_point()}
    names = {str(d).removeprefix("torch.") for d in dtypes}
    if any(n.startswith("float8") for n in names) or (recipe or {}).get("kind") == "fp8":
        return "fp8"
    if "bfloat16" in names:
        return "bf16"
    if "float16" in names:
        return "fp16"
    if (recipe or {}).get("kind") in ("int8", "int4"):
        return str(recipe["kind"])
    return "fp32"


def calibrate_on(model: torch.nn.Module, draft_models: list[torch.nn.Module | None], subset: HeldoutSet, tok: Any,
                 k: int, *, kmax: int = CALIBRATED_KMAX, reps: int = 7) -> Calibration | None:
    """:func:`specdec.validation.timing.calibrate` on the shortest usable prompt of ``subset``
    (v(n) for n up to ``max(k, kmax)``; prefill also on the longest); None when no prompt has tokens."""
    from specdec.validation.heldout import prompt_token_ids

    ids = [prompt_token_ids(p, tok) for p in subset.prompts[:16] if not p.is_empty]
    ids = [x for x in ids if x]
    if not ids:
        return None
    return calibrate(model, draft_models, min(ids, key=len), max(k, kmax), reps, long_prompt=max(ids, key=len))
