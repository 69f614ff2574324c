"""The one validation entry: :func:`validate` of a :class:`ValidationRequest`, with the core that serves the pair.

Three measurements, each with a typed result:

- **decode** (:func:`specdec.validation.decode.measure_decode` -> :class:`~specdec.validation.decode.DecodeMeasurement`):
  per group of prompts (:mod:`specdec.validation.runner`; B = 1 by default) target-only decoding, speculative
  decoding of each drafter on the same prompts and settings, one teacher-forced pass of each model over
  prompt + the target's continuation (:mod:`specdec.validation.teacher_forcing`) and, greedy only, the
  exactness audit; the speed protocol (warm-up, calibrated c and v(n), interleaved timings, re-timing).
- **replay** (:func:`specdec.validation.replay_report.measure_replay` ->
  :class:`~specdec.validation.replay_report.ReplayMeasurement`): the target's (cached) continuation of every
  prompt and one teacher-forced pass per drafter: counters for every k (docs/metrics.md "Replay").
- **engine** (:func:`specdec.validation.engine_check.measure_engine` ->
  :class:`~specdec.validation.engine_report.EngineCheckReport`), with ``engine_check``: the held-out prompts through
  the engine serving the pair, its counters against the core's exact replay of the same tokens (docs/engine-check.md);
  the drafter's report carries it as ``engine_check``.

``method`` picks what runs: ``"decode"``, ``"replay"``, ``"both"`` (replay every prompt, decode a
stratified subsample, :func:`decode_subsample`, and compare the two), or ``"engine"`` (the engine check alone: its
report holds no decoding or replay figures); with ``engine_check`` the engine measurement runs after the others.
Each report is built from the measurement that gates (:func:`gate_method`: with fp32 on both sides the
replay, on every prompt; with a reduced-precision side, bf16 / fp16 / fp8, or counters a replay cannot count
exactly, decoding); speed, c, v and exactness always come from decoding when it ran. Counters are pooled per
category and overall (never averaging per-prompt ratios), with 95% bootstrap CIs over prompts and the one
speed model (:mod:`specdec.validation.aggregate`). Definitions: ``docs/metrics.md``.
"""

from __future__ import annotations

import copy
import datetime as _dt
import math
from typing import Any

import torch

from specdec.core.kv import model_device
from specdec.core.sampling import acceptance_rule_of
from specdec.validation.config import ValidationConfig
from specdec.validation.findings import findings
from specdec.validation.heldout import HeldoutSet
from specdec.validation.prompt_run import DrafterUnderTest, context_limit
from specdec.validation.provenance import ALPHA_HAT_ESTIMATOR, code_version, environment, eos_token_ids
from specdec.validation.decode import DecodeMeasurement, measure_decode
from specdec.validation.engine_check import measure_engine
from specdec.validation.engine_report import EngineCheckReport
from specdec.validation.report import GroupMetrics
from specdec.validation.replay_report import ReplayMeasurement, measure_replay, replay_result
from specdec.validation.report import ValidationReport
from specdec.validation.served_target import is_served
from specdec.validation.request import (CALIBRATED_KMAX, METHODS, REDUCED_PRECISIONS, ValidationProgress,
                                        ValidationRequest, ValidationRun, calibrate_on, gate_method, precision_of)
from specdec.validation.timing import PassTimer

__all__ = ["validate", "prepare_run", "ValidationRequest", "ValidationProgress", "ValidationRun", "METHODS", "decode_subsample",
           "gate_method", "precision_of", "REDUCED_PRECISIONS", "drafter_parts", "report_common", "calibrate_on",
           "CALIBRATED_KMAX"]


def validate(request: ValidationRequest) -> list[ValidationReport]:
    """Validate each drafter of ``request`` against its target on the held-out set (module docstring).

    Returns:
        one :class:`~specdec.validation.report.ValidationReport` per drafter, in order, with ``overall`` and
        per-category :class:`~specdec.validation.report.GroupMetrics`, one
        :class:`~specdec.validation.report.PromptResult` per prompt (skipped prompts carry ``status="skipped"``
        and the reason; with ``"both"`` the decoded subsample's), ``method``, and for a replay its ``replay``
        section; with ``engine_check`` its ``engine_check`` section (method ``engine``: that section alone, the
        figures of ``overall`` unmeasured). Rates in [0, 1], lengths in tokens, times in seconds, KL in nats.
    Raises:
        ValueError: unknown method, bad ``decode_fraction``, bad config, no drafter, no tokenizer for a bare model;
            method ``engine`` without ``engine_check``, or ``engine_check`` with more than one drafter; a drafter the
            engine check cannot compare.
        TypeError: unsupported drafter type; ``config`` not a ValidationConfig; ``heldout`` not a HeldoutSet.
        specdec.core.finite.BrokenModel: a model produced non-finite logits.
        specdec.engines.errors.EngineRequestError: the engine check could not measure the engine (one line;
            :func:`~specdec.validation.engine_check.measure_engine`).
    """
    run = prepare_run(request)
    was_training = run.model.training
    run.model.eval()
    try:
        decoded, replayed = _measure(run)
        engine = measure_engine(run) if request.engine_check is not None else None
    finally:
        run.model.train(was_training)
    if request.method == "engine":
        return _name_adapters([_engine_report(run, engine)], request)
    reports = [_report(run, j, decoded, replayed) for j in range(len(run.drafters))]
    reports[0].engine_check = engine
    if is_served(run.model):  # the target's weights never were on this device
        for r in reports:
            r.device, r.dtype = f"engine:{request.engine.name}", r.replay["target"]["served_dtype"]
    return _name_adapters(reports, request)


def _name_adapters(reports: list[ValidationReport], request: ValidationRequest) -> list[ValidationReport]:
    """Each report's ``target_adapter`` / ``draft_adapter``: the LoRA adapter merged into the request's target
    (``LoadedModel.adapter``) and into its draft (``ResolvedDrafter.loaded.adapter``) as dicts, else None."""
    target_adapter = getattr(request.target, "adapter", None)
    for report, drafter in zip(reports, request.drafters):
        draft_adapter = getattr(getattr(drafter, "loaded", None), "adapter", None)
        report.target_adapter = target_adapter.to_dict() if target_adapter is not None else None
        report.draft_adapter = draft_adapter.to_dict() if draft_adapter is not None else None
    return reports


def _measure(run: ValidationRun) -> tuple[DecodeMeasurement | None, ReplayMeasurement | None]:
    """The decode and replay measurements the request's method asks for (None where one does not run)."""
    request, method = run.request, run.request.method
    replayed = measure_replay(run) if method in ("replay", "both") else None
    decoded = None
    if method in ("decode", "both"):
        sub = decode_subsample(run.subset, request.decode_fraction, run.config.seed) if method == "both" else run.subset
        calibration = request.calibration if replayed is None else replayed.calibration
        decoded = measure_decode(run, sub, calibration, record=method == "both" and run.config.batch_size == 1)
    return decoded, replayed


def _engine_report(run: ValidationRun, engine: EngineCheckReport) -> ValidationReport:
    """Method ``engine``: the drafter's report with the engine check as its only measurement, under the acceptance rule
    of the rule the engine check replayed (its profile's verifier)."""
    d = run.drafters[0]
    report = ValidationReport(**report_common(run.subset, run.target_ref, run.config, run.model), drafter_kind=d.kind,
                              drafter_ref=d.ref, drafter_recipe=d.recipe, overall=GroupMetrics(), method="engine",
                              engine_check=engine)
    report.wall_seconds = engine.wall_seconds
    validated = (engine.rule or {}).get("validated") or {}
    if validated.get("draft_sampling"):  # the engine's verifier (its profile's rule), not the command line's default
        report.acceptance_rule = acceptance_rule_of(validated["draft_sampling"])
    return report


def decode_subsample(subset: HeldoutSet, fraction: float, seed: int) -> HeldoutSet:
    """The stratified subsample decoded next to the replay: ``ceil(fraction * n)`` prompts, at least
    2 per category (all of a category with fewer), chosen by :meth:`HeldoutSet.subset`.

    Raises:
        ValueError: ``fraction`` outside (0, 1].
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"decode_fraction must be in (0, 1], got {fraction}")
    return subset.subset(max(math.ceil(fraction * len(subset)), 2 * len(subset.categories)), seed=seed)


def prepare_run(request: ValidationRequest) -> ValidationRun:
    """The :class:`ValidationRun` of ``request``, after checking its types and values (raises as :func:`validate`;
    ValueError also for a served target without engine continuations or with a method that decodes)."""
    config = ValidationConfig() if request.config is None else request.config
    if request.method not in METHODS:
        raise ValueError(f"unknown method {request.method!r}; use one of {', '.join(METHODS)}")
    if not isinstance(config, ValidationConfig):
        raise TypeError(f"config must be a ValidationConfig, got {type(config).__name__}")
    if not isinstance(request.heldout, HeldoutSet):
        raise TypeError("heldout must be a HeldoutSet (see specdec.validation.heldout.load_heldout), got "
                        f"{type(request.heldout).__name__}")
    if not request.drafters:
        raise ValueError("validate needs at least one drafter")
    if request.engine_check is not None and len(request.drafters) != 1:
        raise ValueError("the engine check checks one pair: give one drafter (the draft the engine serves)")
    if request.method == "engine" and request.engine_check is None:
        raise ValueError("method 'engine' needs engine_check (the engine serving the pair)")
    model, tok, target_ref = _target_parts(request.target, request.tokenizer, request.target_ref)
    if is_served(model) and (request.engine is None or request.method not in ("replay", "engine")):
        raise ValueError("a served target (no weights here) needs engine continuations and method 'replay' or 'engine'")
    drafters = _drafters_under_test(list(request.drafters), model)
    return ValidationRun(request, config, model, tok, target_ref, request.heldout.subset(config.limit, seed=config.seed),
                         eos_token_ids(tok, model), context_limit(model, *[d.model for d in drafters]), drafters)


def _target_parts(target: Any, tokenizer: Any, target_ref: str | None) -> tuple[torch.nn.Module, Any, str]:
    """``(model, tokenizer, target_ref)`` of a LoadedModel or a bare module (which needs ``tokenizer``)."""
    bare = isinstance(target, torch.nn.Module)  # note: a causal LM also has a `.model` (its body)
    model = target if bare else target.model
    tok = tokenizer if tokenizer is not None else (None if bare else getattr(target, "tokenizer", None))
    if tok is None:
        raise ValueError("validate needs a tokenizer: pass a LoadedModel or tokenizer=")
    if target_ref is None:
        source = getattr(target, "source", None) or {}
        target_ref = str(source.get("ref") or getattr(target, "path", None) or type(model).__name__)
    return model, tok, target_ref


def _drafters_under_test(drafters: list[Any], model: torch.nn.Module) -> list[DrafterUnderTest]:
    """One :class:`DrafterUnderTest` per drafter, in eval mode, each with its own pass timer (a drafter that is the
    target module itself is deep-copied, so the timers can tell the two apart)."""
    ctxs: list[DrafterUnderTest] = []
    for drafter in drafters:
        obj, draft_model, kind, dref, recipe = drafter_parts(drafter)
        if draft_model is model:  # same module as both: a copy, so the pass timers can tell them apart
            draft_model = copy.deepcopy(model)
            obj = draft_model
        if draft_model is not None:
            draft_model.eval()
        timed = draft_model if draft_model is not None else obj.timed_module  # a head: its passes
        ctxs.append(DrafterUnderTest(obj, draft_model, kind, dref, recipe, PassTimer(timed)))
    return ctxs


def _report(run: ValidationRun, j: int, decoded: DecodeMeasurement | None,
            replayed: ReplayMeasurement | None) -> ValidationReport:
    """Drafter ``j``'s report, built from the measurement that gates (decoding alone; the replay alone; with
    both, the replay's acceptance on every prompt and decoding's speed, or decoding's all).

    ``decoded`` / ``replayed``: None where that measurement did not run."""
    d = run.drafters[j]
    dd = decoded.drafters[j] if decoded is not None else None
    rep = replay_result(run, j, replayed, dd) if replayed is not None else None
    if rep is not None and rep.gate == "replay" and dd is None:
        overall, categories, rows = rep.overall, rep.categories, [r.row for r in rep.runs]
    else:
        overall, categories = dd.groups(run.config, acceptance=rep.runs if rep is not None and rep.gate == "replay"
                                        else None)
        rows = [r.row for r in dd.runs]
    if rep is not None:
        rep.describe(overall)
    report = ValidationReport(**report_common(run.subset, run.target_ref, run.config, run.model), drafter_kind=d.kind,
                              drafter_ref=d.ref, drafter_recipe=d.recipe, overall=overall, categories=categories,
                              prompts=rows, method=run.request.method, replay=rep.section if rep is not None else None)
    report.notes = findings(report) if dd is not None else []
    report.wall_seconds = decoded.wall_seconds if decoded is not None else rep.seconds
    return report


def drafter_parts(drafter: Any) -> tuple[Any, torch.nn.Module | None, str, str | None, dict | None]:
    """(object for speculative_generate, draft model or None, kind label, ref, recipe): the kinds
    registry's :func:`specdec.kinds.drafter_parts`.

    Raises:
        TypeError: not a causal LM, ModelDrafter, NgramDrafter, Eagle3Drafter or ResolvedDrafter.
    """
    from specdec.kinds import drafter_parts as parts

    return parts(drafter)


def report_common(subset: HeldoutSet, target_ref: str | None, config: ValidationConfig, model: torch.nn.Module) -> dict[str, Any]:
    """The :class:`ValidationReport` fields every drafter's report of one run shares (held-out
    version, target, config, device, dtype, code version, timestamp, environment, the served acceptance rule:
    the config's proposal rule, which :func:`specdec.validation.serving.engine_config` set from the pair's engine
    profile)."""
    return dict(
        heldout_name=subset.name,
        heldout_version=subset.version,
        target_ref=target_ref or type(model).__name__,
        config=config.to_dict(),
        device=str(model_device(model)),
        dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
        code_version=code_version(),
        created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        alpha_hat_estimator=ALPHA_HAT_ESTIMATOR,
        heldout_source_version=subset.source_version,
        acceptance_rule=acceptance_rule_of(config.speculative.draft_sampling),
        environment=environment(),
    )
