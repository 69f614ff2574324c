"""Validate a (target, drafter) pair on a held-out set, with the same core that serves it.

For every group of prompts (:mod:`specdec.validation.runner`; B = 1 by default):

1. target-only decoding (:func:`specdec.autoregressive_generate`): the reference tokens, the
   target's own continuation for teacher forcing, and the target-only time;
2. speculative decoding (:func:`specdec.speculative_generate`) on the same prompts and settings:
   the pooled counters and the speculative time;
3. per prompt, one teacher-forced forward pass of each model over prompt + the target's
   continuation (:mod:`specdec.validation.teacher_forcing`);
4. greedy only: the exactness audit (speculative tokens == target-only tokens).

Then it pools counters per category and overall (never averaging per-prompt ratios), bootstraps
95% CIs over prompts, and fits Leviathan's speedup model (:mod:`specdec.validation.aggregate`).
Definitions: ``docs/metrics.md``.
"""

from __future__ import annotations

import contextlib
import math
import copy
import datetime as _dt
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from specdec.core.kv import model_device
from specdec.validation.aggregate import aggregate
from specdec.validation.config import ValidationConfig
from specdec.validation.findings import findings
from specdec.validation.heldout import HeldoutSet
from specdec.validation.prompt_run import DrafterUnderTest, PromptRun, context_limit
from specdec.validation.provenance import ALPHA_HAT_ESTIMATOR, code_version, environment, eos_token_ids
from specdec.validation.report import PromptResult, ValidationReport
from specdec.validation.runner import run_prompts, warmup
from specdec.validation.timing import Calibration, PassTimer, calibrate

__all__ = ["validate_pair", "validate_pairs", "drafter_parts", "report_common", "calibrate_on"]

#: the v(n) curve is measured for n up to at least this (the recommended k is chosen among 1..it)
CALIBRATED_KMAX = 8


def drafter_parts(drafter: Any) -> tuple[Any, torch.nn.Module | None, str, str | None, dict | None]:
    """(object for speculative_generate, draft model or None, kind label, ref, recipe): the kinds
    registry's :func:`specdec.kinds.drafter_parts`.

    Raises:
        TypeError: not a causal LM, ModelDrafter, NgramDrafter, Eagle3Drafter or ResolvedDrafter.
    """
    from specdec.kinds import drafter_parts as parts

    return parts(drafter)


def validate_pair(
    target: Any,
    drafter: Any,
    heldout: HeldoutSet,
    config: ValidationConfig | None = None,
    *,
    tokenizer: Any = None,
    target_ref: str | None = None,
    progress: Callable[[int, int, PromptResult], None] | None = None,
) -> ValidationReport:
    """Measure how well ``drafter`` serves ``target`` on a held-out set.

    Args:
        target: a :class:`specdec.models.LoadedModel` (model + tokenizer), or a bare transformers
            causal LM together with ``tokenizer=``.
        drafter: a draft causal LM (``kind="model"``), an :class:`~specdec.NgramDrafter`
            (``"ngram"``), or a :class:`specdec.models.drafter_spec.ResolvedDrafter` (which carries its
            kind, ref and derivation recipe).
        heldout: the prompts; ``config.limit`` takes a stratified subset (seeded by ``config.seed``).
        config: :class:`ValidationConfig` (defaults: k=4, 64 new tokens, greedy).
        tokenizer: required when ``target`` is a bare model.
        target_ref: name recorded in the report (default: the LoadedModel's source ref or path).
        progress: called after each prompt as ``progress(done, total, row)`` (with
            ``config.batch_size`` > 1: once per prompt after its group is done).
    Returns:
        :class:`~specdec.validation.report.ValidationReport` with ``overall`` and per-category
        :class:`~specdec.validation.report.GroupMetrics` and one :class:`~specdec.validation.report.PromptResult` per
        prompt (skipped prompts carry ``status="skipped"`` and the reason). Rates are in [0, 1],
        lengths in tokens, times in seconds, KL in nats.
    Raises:
        ValueError: bad config, or no tokenizer for a bare model.
        TypeError: unsupported drafter type.
    """
    cb = None if progress is None else (lambda done, total, rows: progress(done, total, rows[0]))
    return validate_pairs(target, [drafter], heldout, config, tokenizer=tokenizer, target_ref=target_ref, progress=cb)[0]


def validate_pairs(
    target: Any,
    drafters: list[Any],
    heldout: HeldoutSet,
    config: ValidationConfig | None = None,
    *,
    tokenizer: Any = None,
    target_ref: str | None = None,
    progress: Callable[[int, int, list[PromptResult]], None] | None = None,
    calibration: Calibration | None = None,
) -> list[ValidationReport]:
    """:func:`validate_pair` for several drafters of one target, sharing the target's work.

    Per prompt, target-only decoding and the target's teacher-forced pass run once; each
    drafter's speculative run follows right after, so all speed ratios compare runs made under
    the same machine conditions. Prompts run in groups of ``config.batch_size`` (B = 1 is a group
    of one; see :mod:`specdec.validation.runner`). Returns one report per drafter, in order;
    ``prompts`` keep the held-out order. ``progress`` gets the list of per-drafter rows of each
    prompt when it is done (skipped prompts as they are found).

    The timing protocol (the one every validation, the nightly and ``recommend`` use): warm-up,
    then the pass costs (c, v(n)) measured once (:func:`specdec.validation.timing.calibrate`; pass
    ``calibration`` to reuse one), then per prompt target-only and speculative runs back to back,
    alternating which goes first, the load sampled after each, a group that ran under load re-timed
    once (:func:`specdec.validation.runner.under_load`); the speedup is the median of the paired
    per-prompt ratios (:func:`specdec.validation.speed.paired_speedup`).

    Raises:
        ValueError: no drafter, no tokenizer for a bare model.
        TypeError: unsupported drafter type; ``config`` not a ValidationConfig; ``heldout`` not a HeldoutSet.
    """
    config = _checked_inputs(drafters, heldout, config)
    t_wall = time.perf_counter()
    model, tok, target_ref = _target_parts(target, tokenizer, target_ref)
    ctxs = _drafters_under_test(drafters, model)
    subset = heldout.subset(config.limit, seed=config.seed)
    eos = eos_token_ids(tok, model)
    ctx_limit = context_limit(model, *[c.model for c in ctxs])
    was_training = model.training
    model.eval()

    if config.warmup:
        warmup(model, [c.obj for c in ctxs], subset, tok, config, eos, ctx_limit)
        if calibration is None and config.batch_size == 1:  # batched runs: the in-run (batched) c and v
            calibration = calibrate_on(model, [c.model for c in ctxs], subset, tok, config.num_speculative_tokens)

    subset_runs: list[list[PromptRun] | None] = [None] * len(subset.prompts)
    with contextlib.ExitStack() as timers:
        target_timer = timers.enter_context(PassTimer(model))
        for c in ctxs:
            timers.enter_context(c.timer)
        try:
            for done, (i, runs) in enumerate(run_prompts(subset.prompts, model, tok, ctxs, config, eos, ctx_limit, target_timer), 1):
                subset_runs[i] = runs
                if progress is not None:
                    progress(done, len(subset.prompts), [r.row for r in runs])
            common = report_common(subset, target_ref, config, model)
            before = _retime_band_outliers(subset, subset_runs, _Run(model, tok, ctxs, config, eos, target_timer),
                                           calibration, common)
        finally:
            model.train(was_training)
    per_drafter = [[runs[j] for runs in subset_runs if runs is not None] for j in range(len(ctxs))]
    reports = _reports(ctxs, per_drafter, config, common, calibration, time.perf_counter() - t_wall)
    for report, first in zip(reports, before):
        report.overall.speedup_before_retime = first
    return reports


@dataclass(frozen=True)
class _Run:
    """What re-timing a prompt needs: the target, its tokenizer, the drafters, config, EOS, target timer."""

    model: torch.nn.Module
    tok: Any
    ctxs: list[DrafterUnderTest]
    config: ValidationConfig
    eos: Any
    target_timer: PassTimer


def _retime_band_outliers(subset: HeldoutSet, subset_runs: list, run: _Run, calibration: Calibration | None,
                          common: dict[str, Any]) -> list[float]:
    """A drafter whose measured speedup disagrees with the speed model beyond
    :data:`specdec.validation.speed.TIMING_BAND` has its slow (or fast) prompts timed once more
    (:func:`specdec.validation.runner.band_outliers`, B = 1 only); returns per drafter the median
    speedup before (NaN where nothing was re-timed). The verdict then uses the re-timed measurement."""
    import math

    from specdec.validation.heldout import prompt_token_ids
    from specdec.validation.runner import band_outliers, pad_token_id, retime_prompts
    from specdec.validation.speed import TIMING_BAND

    before = [math.nan] * len(run.ctxs)
    if run.config.batch_size != 1:
        return before
    per_drafter = [[runs[j] for runs in subset_runs if runs is not None] for j in range(len(run.ctxs))]
    first = _reports(run.ctxs, per_drafter, run.config, common, calibration, 0.0)
    ids: set[str] = set()
    for j, rep in enumerate(first):
        if rep.overall.timing_suspect:
            out = band_outliers(per_drafter[j], rep.overall.predicted_speedup, TIMING_BAND)
            if out:
                ids.update(out)
                before[j] = rep.overall.speedup
    todo = [(i, p, prompt_token_ids(p, run.tok)) for i, p in enumerate(subset.prompts) if p.id in ids]
    for i, runs in retime_prompts(todo, run.model, run.ctxs, run.config, run.eos, run.target_timer,
                                  pad_token_id(run.tok)):
        subset_runs[i] = runs
    return before


def _checked_inputs(drafters: list[Any], heldout: HeldoutSet, config: ValidationConfig | None) -> ValidationConfig:
    """``config`` (the default when None), after checking the argument types and that there is a drafter."""
    config = ValidationConfig() if config is None else config
    if not isinstance(config, ValidationConfig):
        raise TypeError(f"config must be a ValidationConfig, got {type(config).__name__}")
    if not isinstance(heldout, HeldoutSet):
        raise TypeError(f"heldout must be a HeldoutSet (see specdec.validation.heldout.load_heldout), got {type(heldout).__name__}")
    if not drafters:
        raise ValueError("validate_pairs needs at least one drafter")
    return config


def _target_parts(target: Any, tokenizer: Any, target_ref: str | None) -> tuple[torch.nn.Module, Any, str]:
    """``(model, tokenizer, target_ref)`` of a LoadedModel or a bare module (which needs ``tokenizer``)."""
    bare = isinstance(target, torch.nn.Module)  # note: a causal LM also has a `.model` (its body)
    model = target if bare else target.model
    tok = tokenizer if tokenizer is not None else (None if bare else getattr(target, "tokenizer", None))
    if tok is None:
        raise ValueError("validate_pair needs a tokenizer: pass a LoadedModel or tokenizer=")
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
        timed = draft_model if draft_model is not None else getattr(obj, "head", None)  # a head: its passes
        ctxs.append(DrafterUnderTest(obj, draft_model, kind, dref, recipe, PassTimer(timed)))
    return ctxs


def _reports(ctxs: list[DrafterUnderTest], per_drafter: list[list[PromptRun]], config: ValidationConfig,
             common: dict[str, Any], calibration: Calibration | None, wall: float) -> list[ValidationReport]:
    """One report per drafter: overall and per-category metrics (with the calibrated c, v(n) when given), findings."""
    k = config.num_speculative_tokens
    agg = dict(seed=config.seed, n_resamples=config.bootstrap_resamples)
    reports = []
    for j, (c, runs) in enumerate(zip(ctxs, per_drafter)):
        cats = sorted({r.row.category for r in runs})
        if calibration is not None:
            agg = dict(agg, verify_cost=calibration.verify_cost, cost_ratio=calibration.cost_ratios[j],
                       prefill=(calibration.target_prefill,
                                calibration.draft_prefill[j] if j < len(calibration.draft_prefill) else math.nan))
        report = ValidationReport(
            **common,
            drafter_kind=c.kind,
            drafter_ref=c.ref,
            drafter_recipe=c.recipe,
            overall=aggregate(runs, k, **agg),
            categories={cat: aggregate([r for r in runs if r.row.category == cat], k, **agg) for cat in cats},
            prompts=[r.row for r in runs],
        )
        report.notes = findings(report)
        report.wall_seconds = wall
        reports.append(report)
    return reports


def calibrate_on(model: torch.nn.Module, draft_models: list[torch.nn.Module | None], subset: HeldoutSet, tok: Any,
                 k: int, kmax: int = CALIBRATED_KMAX, reps: int = 7) -> Calibration | None:
    """:func:`specdec.validation.timing.calibrate` on the shortest usable prompt of ``subset``
    (v(n) for n up to ``max(k, kmax)``); None when no prompt has tokens."""
    from specdec.validation.heldout import prompt_token_ids

    ids = [prompt_token_ids(p, tok) for p in subset.prompts[:16] if not p.is_empty]
    ids = [x for x in ids if x]
    if not ids:
        return None
    return calibrate(model, draft_models, min(ids, key=len), max(k, kmax), reps)


def report_common(subset: HeldoutSet, target_ref: str | None, config: ValidationConfig, model: torch.nn.Module) -> dict[str, Any]:
    """The :class:`ValidationReport` fields every drafter's report of one run shares (held-out
    version, target, config, device, dtype, code version, timestamp, environment)."""
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
        environment=environment(),
    )
