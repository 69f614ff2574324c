"""``method = replay | decode | both``: replay every prompt, decode a stratified subsample, compare.

:func:`validate_replay` is :func:`specdec.validation.validate_pairs` with a replay
(:mod:`specdec.validation.replay_run`): every prompt of the subset is replayed (exact counters for
every k under greedy decoding and, at temperature > 0, under the argmax rule and for n-gram drafts;
expected counters under the sampled rule), and with ``method="both"`` the shared core
also decodes a stratified subsample (``decode_fraction`` of the prompts, at least 2 per category)
with the full decoding validation (speed, c, v, exactness). The report's ``replay`` section holds
the acceptance-by-k table, per-method counters, ``replay_decode_agreement`` with each disagreement
named (prompt, position, logit margin at the flip, class), the reduced-precision comparison and
the recommended k from the replayed curve with the measured c and v.

Which measurement gates (``replay["gate_method"]``, and what ``overall`` / ``categories`` hold):
with fp32 on both sides the two are one computation and the replay (on every prompt) gates; with a
reduced-precision draft or target (bf16 / fp16 / fp8) they are two measurements, and decoding,
which is what serving runs (incremental passes, the target's prompt KV adopted by the draft), gates.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from specdec.core.drafters import NgramDrafter
from specdec.core.inputs import stop_token_ids
from specdec.validation.aggregate import REPLAY_BASIS, aggregate
from specdec.validation.config import ValidationConfig
from specdec.validation.continuation_cache import ContinuationCache, model_weights_hash
from specdec.validation.findings import findings
from specdec.validation.heldout import HeldoutSet
from specdec.validation.prompt_run import PromptRun, context_limit
from specdec.validation.provenance import eos_token_ids
from specdec.validation.replay import first_flip, recording, target_divergence
from specdec.validation.replay_curve import (acceptance_by_k, classify, decoded_stop_after_rejection, precision_of,
                                             best_k_tau, recommend_from_curve)
from specdec.validation.replay_expected import expected_curve
from specdec.validation.replay_run import ReplayedPrompt, replay_prompts, replays_exactly
from specdec.validation.report import GroupMetrics, PromptResult, ValidationReport

__all__ = ["validate_replay", "METHODS", "decode_subsample"]

METHODS = ("replay", "decode", "both")
#: activations computed in these precisions make replay and decoding two measurements (decoding gates)
REDUCED_PRECISIONS = ("bf16", "fp16", "fp8")
#: fields of GroupMetrics that the gating measurement's acceptance fills
ACCEPTANCE_FIELDS = ("num_prompts", "num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_position",
                     "drafted_per_position", "num_emitted_tokens", "acceptance_rate", "acceptance_rate_ci",
                     "mean_accepted_length", "per_position_acceptance", "conditional_per_position_acceptance",
                     "draft_tokens_per_step", "alpha_hat", "alpha_hat_ci", "per_token_acceptance",
                     "per_token_acceptance_ci", "num_skipped")


def decode_subsample(subset: HeldoutSet, fraction: float, seed: int) -> HeldoutSet:
    """The stratified subsample decoded next to the replay: ``ceil(fraction * n)`` prompts, at least
    2 per category (all of a category with fewer), chosen by :meth:`HeldoutSet.subset`.

    Raises:
        ValueError: ``fraction`` outside (0, 1].
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"decode_fraction must be in (0, 1], got {fraction}")
    n = max(math.ceil(fraction * len(subset)), 2 * len(subset.categories))
    return subset.subset(n, seed=seed)


def validate_replay(
    target: Any,
    drafters: list[Any],
    heldout: HeldoutSet,
    config: ValidationConfig | None = None,
    *,
    method: str = "both",
    decode_fraction: float = 0.25,
    kmax: int = 16,
    exact: bool = False,
    cache: ContinuationCache | None = None,
    tokenizer: Any = None,
    target_ref: str | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    calibration: Any = None,
) -> list[ValidationReport]:
    """Validate drafters of one target by replay, decoding, or both (module docstring).

    Args:
        target, drafters, heldout, config, tokenizer, target_ref: as :func:`validate_pairs`.
        method: ``"replay"``, ``"decode"`` (exactly :func:`validate_pairs`) or ``"both"``.
        decode_fraction: share of the prompts decoded with ``method="both"`` (:func:`decode_subsample`).
        kmax: largest k in the acceptance-by-k table (sampling: at most 8).
        exact: greedy: also run the draft after each rejected token, so ``num_draft_tokens`` is exact.
        cache: continuation cache (default ``$SPECDEC_HOME/continuations``).
        progress: ``progress(phase, done, total)`` with phase ``"replay"`` or ``"decode"``.
        calibration: pass costs to reuse (:func:`specdec.validation.timing.calibrate`); measured here
            (after a warm-up) when None and ``config.warmup``.
    Returns:
        one :class:`ValidationReport` per drafter, ``method`` and ``replay`` filled.
    Raises:
        ValueError: unknown method, bad fraction, no tokenizer; as :func:`validate_pairs`.
    """
    from specdec.validation.api import calibrate_on, drafter_parts, validate_pairs

    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; use one of {', '.join(METHODS)}")
    config = ValidationConfig() if config is None else config
    bare = isinstance(target, torch.nn.Module)
    model = target if bare else target.model
    tok = tokenizer if tokenizer is not None else (None if bare else getattr(target, "tokenizer", None))
    if tok is None:
        raise ValueError("validate_replay needs a tokenizer: pass a LoadedModel or tokenizer=")
    subset = heldout.subset(config.limit, seed=config.seed)
    if method == "decode":
        reports = validate_pairs(target, drafters, subset, replace_limit(config), tokenizer=tok, target_ref=target_ref,
                                 progress=None if progress is None else (lambda d, t, _r: progress("decode", d, t)),
                                 calibration=calibration)
        for r in reports:
            r.method = "decode"
        return reports
    parts = [drafter_parts(d) for d in drafters]
    k = config.num_speculative_tokens
    if not config.sampling.is_greedy:
        kmax = min(kmax, 8)
    kmax = max(kmax, k)
    cache = cache or ContinuationCache()
    weights = model_weights_hash(model, None if bare else getattr(target, "path", None), cache.weights_memo)
    eos = eos_token_ids(tok, model)
    was_training = model.training
    model.eval()
    if calibration is None and config.warmup and config.batch_size == 1:
        calibration = calibrate_on(model, [p[1] for p in parts], subset, tok, k, kmax)
    try:
        replayed = replay_prompts(
            subset, model, tok, [p[0] for p in parts], config, eos, context_limit(model, *[p[1] for p in parts]),
            cache=cache, target_weights=weights, kmax=kmax, exact=exact,
            progress=None if progress is None else (lambda d, t, _r: progress("replay", d, t)),
        )
    finally:
        model.train(was_training)
    decoded: list[ValidationReport | None] = [None] * len(drafters)
    blocks: dict[str, list[tuple]] = {}
    if method == "both":
        sub = decode_subsample(subset, decode_fraction, config.seed)
        wrapped = [_recording(d) for d in drafters] if config.batch_size == 1 else list(drafters)

        def tick(done: int, total: int, rows: list[PromptResult]) -> None:
            objs = [drafter_parts(w)[0] for w in wrapped]
            blocks[rows[0].prompt_id] = [(list(getattr(o, "blocks", [])), list(getattr(o, "contexts", []))) for o in objs]
            if progress is not None:
                progress("decode", done, total)

        decoded = validate_pairs(target, wrapped, sub, replace_limit(config), tokenizer=tok, target_ref=target_ref,
                                 progress=tick, calibration=calibration)
    reports = []
    for j, (obj, draft_model, kind, dref, recipe) in enumerate(parts):
        precision = precision_of(model, draft_model, recipe)
        reports.append(_report(j, replayed, decoded[j], blocks, config, kmax, precision, method, subset, kind, dref,
                               recipe, target_ref, model, exact or isinstance(obj, NgramDrafter), stop_token_ids(eos),
                               _costs(calibration, j, decoded[j]), replays_exactly(obj, config)))
    return reports


def replace_limit(config: ValidationConfig) -> ValidationConfig:
    """``config`` without a limit (the subset is already drawn)."""
    return ValidationConfig(config.speculative, seed=config.seed, limit=None,
                            bootstrap_resamples=config.bootstrap_resamples, warmup=config.warmup,
                            batch_size=config.batch_size)


def _recording(drafter: Any) -> Any:
    inner = getattr(drafter, "drafter", None)
    if inner is not None and hasattr(drafter, "kind"):  # a ResolvedDrafter
        return replace(drafter, drafter=recording(inner))
    return recording(drafter)


def _costs(calibration: Any, j: int, decoded: ValidationReport | None) -> tuple[float, Any]:
    """(c, v curve) for drafter ``j``'s predictions: the calibration's, else the decoded run's in-run c."""
    c = calibration.cost_ratios[j] if calibration is not None else math.nan
    if math.isnan(c) and decoded is not None:
        c = decoded.overall.cost_ratio
    return c, (calibration.verify_cost if calibration is not None else None)


def _replay_runs(replayed: list[ReplayedPrompt], j: int, k: int) -> list[PromptRun]:
    runs = []
    for rp in replayed:
        row = PromptResult(rp.prompt.id, rp.prompt.category, status=rp.status, skip_reason=rp.skip_reason,
                           prompt_tokens=len(rp.ids))
        run = PromptRun(row=row)
        if rp.status == "ok":
            s = rp.drafters[j].curve[k]
            run.stats = s
            row.new_tokens = row.target_only_tokens = len(rp.continuation)
            row.num_drafts, row.num_draft_tokens, row.num_accepted_tokens = s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens
            row.acceptance_rate, row.mean_accepted_length, row.alpha_hat = s.acceptance_rate, s.mean_accepted_length, s.alpha_hat
            row.per_token_acceptance = s.per_token_acceptance
        runs.append(run)
    return runs


def _agreement(j: int, replayed: list[ReplayedPrompt], decoded: ValidationReport, blocks: dict[str, list[tuple]],
               k: int, precision: str, stop: frozenset[int]) -> dict[str, Any]:
    """``replay_decode_agreement`` and the named disagreements of drafter ``j`` (greedy)."""
    by_id = {rp.prompt.id: rp for rp in replayed if rp.status == "ok"}
    compared, agreeing, disagreements = 0, 0, []
    for row in decoded.prompts:
        rp = by_id.get(row.prompt_id)
        if row.status != "ok" or rp is None:
            continue
        compared += 1
        s = rp.drafters[j].curve[k]
        dec = (row.num_drafts, row.num_draft_tokens, row.num_accepted_tokens)
        rep = (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens)
        recorded, contexts = (blocks.get(row.prompt_id) or [([], [])] * (j + 1))[j]
        target_flip = target_divergence(contexts, len(rp.ids), rp.continuation)
        if target_flip is not None:  # the decoded run's target left the replayed continuation first
            recorded = [b for b in recorded if b[0] - len(rp.ids) < target_flip]
        flip = first_flip(recorded, len(rp.ids), rp.drafters[j].trace, rp.continuation) if recorded else None
        if dec == rep and flip is None:
            agreeing += 1
            continue
        unseen_stop = dec[0] == rep[0] and dec[2] == rep[2] and decoded_stop_after_rejection(
            recorded, len(rp.ids), rp.continuation, stop)
        position, margin = flip if flip is not None else (None, None)
        side = "draft"
        if target_flip is not None and (flip is None or target_flip <= flip[0]):
            position, margin, side = target_flip, row.divergence_logit_margin, "target"
        disagreements.append({
            "prompt_id": row.prompt_id, "category": row.category, "position": position,
            "logit_margin": None if margin is None or math.isnan(margin) else margin,
            "decode": dict(zip(("num_drafts", "num_draft_tokens", "num_accepted_tokens"), dec)),
            "replay": dict(zip(("num_drafts", "num_draft_tokens", "num_accepted_tokens"), rep)),
            "exact_match": row.exact_match, "side": side,
            "class": classify(margin, precision, unseen_stop=unseen_stop, counters_equal=dec == rep),
        })
    return {"replay_decode_agreement": agreeing / compared if compared else math.nan, "num_compared": compared,
            "disagreements": disagreements,
            "beyond_numerics": sum(d["class"] == "beyond numerics" for d in disagreements)}


def _report(j, replayed, decoded, blocks, config, kmax, precision, method, subset, kind, dref, recipe, target_ref,
            model, exact, stop, costs, counted) -> ValidationReport:
    """Drafter ``j``'s report; ``counted``: its replay gives exact counters (:func:`replays_exactly`)."""
    k = config.num_speculative_tokens
    agg = dict(seed=config.seed, n_resamples=config.bootstrap_resamples)
    ok = [rp for rp in replayed if rp.status == "ok"]
    greedy = config.sampling.is_greedy
    section = _section(ok, greedy, counted, exact, precision)
    c, v = costs
    if counted:
        overall, cats, rows = _replayed_exact(section, j, replayed, ok, config, kmax, stop, costs, agg)
    else:
        overall, cats, rows = _replayed_expected(section, j, ok, config, kmax, agg)
    section.update(recommend_from_curve(section["acceptance_by_k"], c, v))
    reduced = precision in REDUCED_PRECISIONS  # int8/int4 copies quantize weights only: fp32 activations, one computation
    section["gate_method"] = "decode" if decoded is not None and (reduced or not counted) else "replay"
    if decoded is not None:
        report = _merge_decoded(section, greedy, j, replayed, decoded, blocks, k, precision, stop, overall, cats,
                                subset, agg)
    else:
        from specdec.validation.api import report_common

        report = ValidationReport(**report_common(subset, target_ref, config, model), drafter_kind=kind,
                                  drafter_ref=dref, drafter_recipe=recipe, overall=overall, categories=cats, prompts=rows)
        report.wall_seconds = section["seconds"]["continuation"] + section["seconds"]["replay"]
    if counted:  # per prompt at the configured k (prompts.csv holds the decoded rows when decoding gates)
        section["prompts"] = [{"prompt_id": rp.prompt.id, "category": rp.prompt.category, "produced_by": rp.produced_by,
                               **{n: getattr(rp.drafters[j].curve[k], n) for n in
                                  ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_emitted_tokens")}}
                              for rp in ok]
    g = report.overall  # the report's k comes from the replayed counters: the same k the replay section gives
    g.recommended_num_speculative_tokens = section["recommended_num_speculative_tokens"]
    g.predicted_speedup_at_recommended = section["predicted_speedup_at_recommended"]
    g.recommended_k_basis = REPLAY_BASIS if g.recommended_num_speculative_tokens is not None else g.recommended_k_basis
    report.method = method
    report.replay = section
    return report


def _section(ok: list, greedy: bool, counted: bool, exact: Any, precision: str) -> dict[str, Any]:
    """The replay section's header: what the numbers are, where the continuations came from, the seconds spent."""
    kind = ("exact counters (greedy replay)" if greedy else
            "exact counters (deterministic proposals along sampled target continuations)" if counted else
            "expected values (sampling: teacher-forced p, q)")
    return {
        "kind": kind,
        "num_draft_tokens_exact": bool(exact) if counted else False,
        "precision": precision, "num_prompts_replayed": len(ok),
        "continuations": {w: sum(rp.produced_by == w for rp in ok) for w in ("cache", "speculative", "ngram", "target-only")},
        "seconds": {"continuation": sum(rp.continuation_seconds for rp in ok),
                    "replay": sum(rp.replay_seconds for rp in ok)},
    }


def _replayed_exact(section, j, replayed, ok, config, kmax, stop, costs, agg):
    """Counted replay: exact counters for every k into ``section``; ``(overall, categories, rows)`` at the run's k."""
    k = config.num_speculative_tokens
    c, v = costs
    curves = [rp.drafters[j].curve for rp in ok]
    section["acceptance_by_k"] = acceptance_by_k(curves, range(1, kmax + 1), c, v, **agg)
    if config.sampling.is_greedy:  # the trace's confidences are the greedy ones (T = 1)
        section.update(best_k_tau([rp.drafters[j].trace for rp in ok], [rp.continuation for rp in ok],
                                  range(1, kmax + 1), c, v, max_new_tokens=config.max_new_tokens, stop_token_ids=stop))
    runs = _replay_runs(replayed, j, k)
    overall = aggregate(runs, k, **agg, verify_cost=v, cost_ratio=c)
    cats = {cat: aggregate([r for r in runs if r.row.category == cat], k, **agg, verify_cost=v, cost_ratio=c)
            for cat in sorted({r.row.category for r in runs})}
    return overall, cats, [r.row for r in runs]


def _replayed_expected(section, j, ok, config, kmax, agg):
    """Sampling replay: expected values from teacher-forced p, q into ``section``; ``(overall, {}, [])`` at the run's k."""
    k = config.num_speculative_tokens
    alphas = [rp.drafters[j].alphas for rp in ok]
    adopt = any(rp.drafters[j].adopts_prefix for rp in ok)
    curve = expected_curve(alphas, range(1, kmax + 1), max_new_tokens=config.max_new_tokens, adopts_prefix=adopt, **agg)
    section["acceptance_by_k"] = [{"k": kk, **vals} for kk, vals in curve.items()]
    overall = GroupMetrics(num_prompts=len(ok), num_speculative_tokens=k)
    e = curve[k]
    overall.acceptance_rate, overall.acceptance_rate_ci = e["expected_acceptance_rate"], e["expected_acceptance_rate_ci"]
    overall.mean_accepted_length = e["expected_mean_accepted_length"]
    return overall, {}, []


def _merge_decoded(section, greedy, j, replayed, decoded, blocks, k, precision, stop, overall, cats, subset, agg):
    """The decoded report with the replay beside it: counters of both, their agreement (greedy), and, when replay
    gates, the replayed acceptance fields in place of the decoded ones."""
    section["num_prompts_decoded"] = decoded.overall.num_prompts
    section["counters"] = {"decode": _counters(decoded.overall)}
    if greedy:
        section.update(_agreement(j, replayed, decoded, blocks, k, precision, stop))
        decoded.overall.replay_decode_agreement = section["replay_decode_agreement"]
        decoded.overall.replay_beyond_numerics = section["beyond_numerics"]
        ids = {r.prompt_id for r in decoded.prompts if r.status == "ok"}
        same = [r for r in _replay_runs(replayed, j, k) if r.row.prompt_id in ids]
        section["counters"]["replay_on_decoded"] = _counters(aggregate(same, k, **agg))
    section["counters"]["replay"] = _counters(overall)
    lo, hi = decoded.overall.acceptance_rate_ci
    section["replay_inside_decode_ci"] = bool(lo <= overall.acceptance_rate <= hi) if not math.isnan(lo) else None
    report = decoded
    if section["gate_method"] == "replay":
        for name in ACCEPTANCE_FIELDS:
            setattr(report.overall, name, getattr(overall, name))
        for cat, g in cats.items():
            base = report.categories.setdefault(cat, GroupMetrics(num_speculative_tokens=k))
            for name in ACCEPTANCE_FIELDS:
                setattr(base, name, getattr(g, name))
    report.heldout_version, report.heldout_source_version = subset.version, subset.source_version
    report.notes = findings(report)
    return report


def _counters(g: GroupMetrics) -> dict[str, Any]:
    return {"num_prompts": g.num_prompts, "num_drafts": g.num_drafts, "num_draft_tokens": g.num_draft_tokens,
            "num_accepted_tokens": g.num_accepted_tokens, "acceptance_rate": g.acceptance_rate,
            "acceptance_rate_ci": list(g.acceptance_rate_ci), "mean_accepted_length": g.mean_accepted_length}
