"""The decode measurement: speculative decoding of every drafter next to target-only decoding, timed.

:func:`measure_decode` runs the prompts through :mod:`specdec.validation.runner` (groups of
``config.batch_size``; per prompt target-only and each drafter's speculative run back to back, the
teacher-forced passes, the exactness audit) under the timing protocol every validation uses: warm-up, then
the pass costs (c, v(n)) measured once (:func:`specdec.validation.timing.calibrate`, unless given), then
target-only and speculative runs alternating which goes first, the load sampled after each, a group that ran
under load re-timed once (:func:`specdec.validation.runner.under_load`), and a drafter whose measured speedup
disagrees with the speed model beyond :data:`specdec.validation.speed.TIMING_BAND` has its outlying prompts
timed once more (B = 1). The speedup is the median of the paired per-prompt ratios
(:func:`specdec.validation.speed.paired_speedup`). Entered through :func:`specdec.validation.validate`.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

from specdec.validation import speed
from specdec.validation.aggregate import groups
from specdec.validation.request import ValidationRun, calibrate_on
from specdec.validation.config import ValidationConfig
from specdec.validation.heldout import HeldoutSet, prompt_token_ids
from specdec.validation.prompt_run import PromptRun
from specdec.validation.replay import RecordingDrafter
from specdec.validation.report import GroupMetrics
from specdec.validation.runner import DecodeSetup, band_outliers, retime_prompts, run_prompts, warmup
from specdec.validation.timing import Calibration, PassTimer

__all__ = ["DecodeMeasurement", "DecodedDrafter", "measure_decode"]


@dataclass
class DecodedDrafter:
    """One drafter's decode measurement.

    Attributes:
        runs: one :class:`PromptRun` per prompt of the decoded subset, in held-out order (skipped included).
        overall / categories: their pooled :class:`GroupMetrics` (with the run's calibrated costs).
        agg: the :func:`aggregate` keywords they were pooled with (bootstrap settings, calibrated costs).
        proposals: recorded runs only, per prompt id: ``(blocks, contexts)`` of the drafter's proposals
            (:class:`specdec.validation.replay.RecordingDrafter`), to compare with a replay.
    """

    runs: list[PromptRun]
    overall: GroupMetrics
    categories: dict[str, GroupMetrics]
    agg: dict[str, Any]
    proposals: dict[str, tuple[list, list]] = field(default_factory=dict)

    def groups(self, config: ValidationConfig,
               acceptance: list[PromptRun] | None = None) -> tuple[GroupMetrics, dict[str, GroupMetrics]]:
        """``(overall, categories)``: the decoded ones, or with ``acceptance`` (a replay's runs on every prompt,
        which gates) pooled again with the acceptance fields from those runs and the rest from decoding."""
        if acceptance is None:
            return self.overall, self.categories
        overall, categories = groups(self.runs, config.num_speculative_tokens, acceptance=acceptance, **self.agg)
        overall.speedup_before_retime = self.overall.speedup_before_retime
        return overall, categories


@dataclass
class DecodeMeasurement:
    """The decode measurement of every drafter: per drafter a :class:`DecodedDrafter`, the calibration used
    (None: in-run costs) and the wall seconds (warm-up and calibration included)."""

    drafters: list[DecodedDrafter]
    calibration: Calibration | None
    wall_seconds: float


def measure_decode(run: ValidationRun, subset: HeldoutSet, calibration: Calibration | None = None,
                   record: bool = False) -> DecodeMeasurement:
    """Decode ``subset`` (the run's subset, or a subsample of it) with every drafter of ``run`` (module docstring).

    Args:
        run: the resolved request (target eval mode). subset: the prompts decoded.
        calibration: pass costs to reuse; None: measured after the warm-up when ``warmup`` and B = 1.
        record: B = 1: record each drafter's proposals per prompt (``DecodedDrafter.proposals``).
    Raises:
        specdec.core.finite.BrokenModel: a model produced non-finite logits.
    """
    t_wall, config = time.perf_counter(), run.config
    duts = [replace(d, obj=RecordingDrafter(d.obj)) for d in run.drafters] if record else run.drafters
    setup = DecodeSetup(run.model, run.tokenizer, duts, config, run.eos, run.ctx_limit)
    if config.warmup:
        warmup(setup, subset)
        if calibration is None and config.batch_size == 1:  # batched runs: the in-run (batched) c and v
            calibration = calibrate_on(run.model, [d.model for d in duts], subset, run.tokenizer,
                                       config.num_speculative_tokens)
    subset_runs: list[list[PromptRun] | None] = [None] * len(subset.prompts)
    proposals: list[dict[str, tuple[list, list]]] = [{} for _ in duts]
    with contextlib.ExitStack() as timers:
        setup = replace(setup, target_timer=timers.enter_context(PassTimer(run.model)))
        for d in duts:
            timers.enter_context(d.timer)
        for done, (i, runs) in enumerate(run_prompts(subset.prompts, setup), 1):
            subset_runs[i] = runs
            for j, d in enumerate(duts if record else []):
                proposals[j][subset.prompts[i].id] = (list(d.obj.blocks), list(d.obj.contexts))
            run.progress("decode", done, len(subset.prompts), [r.row for r in runs])
        first = _pooled(subset_runs, len(duts), config, calibration)
        before = _retime_band_outliers(subset, subset_runs, setup, first,
                                       lambda done, total, rows: run.progress("re-time", done, total, rows))
    out = _pooled(subset_runs, len(duts), config, calibration) if any(not math.isnan(b) for b in before) else first
    for dd, b, p in zip(out, before, proposals):
        dd.overall.speedup_before_retime, dd.proposals = b, p
    return DecodeMeasurement(out, calibration, time.perf_counter() - t_wall)


def _pooled(subset_runs: list, n: int, config: ValidationConfig, calibration: Calibration | None) -> list[DecodedDrafter]:
    """Per drafter (``n``), its runs pooled overall and per category (with the calibrated c, v(n) when given)."""
    out = []
    for j in range(n):
        runs = [r[j] for r in subset_runs if r is not None]
        agg: dict[str, Any] = dict(seed=config.seed, n_resamples=config.bootstrap_resamples)
        if calibration is not None:
            agg.update(verify_cost=calibration.verify_cost, cost_ratio=calibration.cost_ratios[j],
                       prefill=(calibration.target_prefill, calibration.draft_prefill[j]
                                if j < len(calibration.draft_prefill) else None))
        out.append(DecodedDrafter(runs, *groups(runs, config.num_speculative_tokens, **agg), agg))
    return out


def _retime_band_outliers(subset: HeldoutSet, subset_runs: list, setup: DecodeSetup,
                          first: list[DecodedDrafter], progress) -> list[float]:
    """A drafter whose measured speedup disagrees with the speed model beyond ``TIMING_BAND`` has its slow
    (or fast) prompts timed once more (:func:`specdec.validation.runner.band_outliers`, B = 1 only); returns
    per drafter the median speedup before (NaN where nothing was re-timed). The verdict uses the re-timed runs.
    ``progress(done, total, rows)`` is told after each re-timed prompt (phase ``re-time``: on a busy machine it
    can take as long as the first pass)."""
    before = [math.nan] * len(setup.drafters)
    if setup.config.batch_size != 1:
        return before
    ids: set[str] = set()
    for j, dd in enumerate(first):
        out = band_outliers(dd.runs, dd.overall.predicted_speedup, speed.TIMING_BAND) if dd.overall.timing_suspect else []
        if out:
            ids.update(out)
            before[j] = dd.overall.speedup
    todo = [(i, p, prompt_token_ids(p, setup.tokenizer)) for i, p in enumerate(subset.prompts) if p.id in ids]
    for done, (i, runs) in enumerate(retime_prompts(todo, setup), 1):
        subset_runs[i] = runs
        progress(done, len(todo), [r.row for r in runs])
    return before
