"""The replay measurement (``method = replay | both``, entered through :func:`specdec.validation.validate`).

:func:`measure_replay` replays every prompt (:mod:`specdec.validation.replay_run`); :func:`replay_result`
gives one drafter's part of the report: the ``replay`` section (acceptance by k, the k recommended from the
replayed curve with the measured c and v; next to a decoded subsample, both counters and
``replay_decode_agreement`` with each disagreement classified) and, where the replay gates, the acceptance.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

from specdec.core.drafters import NgramDrafter
from specdec.core.head_drafter import Eagle3Drafter
from specdec.core.inputs import stop_token_ids
from specdec.validation.aggregate import REPLAY_BASIS, aggregate, groups
from specdec.validation.request import ValidationRun, calibrate_on, gate_method, precision_of
from specdec.models.hashes import adapted_weights_sha256
from specdec.validation.continuation_cache import ContinuationCache, model_weights_hash
from specdec.validation.prompt_run import PromptRun, record_counters
from specdec.validation.replay import first_flip, target_divergence
from specdec.validation.replay_curve import (acceptance_by_k, best_k_tau, classify, decoded_stop_after_rejection,
                                             recommend_from_curve)
from specdec.validation.replay_expected import expected_curve
from specdec.validation.replay_run import ReplayedPrompt, replay_prompts, replays_exactly
from specdec.validation.report import GroupMetrics, PromptResult
from specdec.validation.served_target import is_served

__all__ = ["ReplayMeasurement", "ReplayResult", "measure_replay", "replay_result", "replay_kmax"]

_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


@dataclass
class ReplayMeasurement:
    """Every prompt replayed for every drafter, the largest k replayed, the run's calibration (or None)."""

    prompts: list[ReplayedPrompt]
    kmax: int
    calibration: Any  # specdec.validation.timing.Calibration | None


def measure_replay(run: ValidationRun, *, calibrate: bool = True) -> ReplayMeasurement:
    """Replay the subset of ``run`` (a :class:`specdec.validation.request.ValidationRun`), or return the
    request's ``replayed`` measurement; the pass costs are measured first when the request has none,
    ``calibrate``, ``config.warmup``, B = 1 and the target's weights are here (v(n) up to ``kmax``)."""
    req, config = run.request, run.config
    if req.replayed is not None:
        if [rp.prompt.id for rp in req.replayed.prompts] != [p.id for p in run.subset.prompts]:
            raise ValueError("the replayed prompts are not this run's held-out subset (another limit, seed or set)")
        return req.replayed
    kmax = replay_kmax(run)
    cache = run.continuation_cache()
    calibration = req.calibration
    if calibration is None and calibrate and config.warmup and config.batch_size == 1 and not is_served(run.model):
        calibration = calibrate_on(run.model, [d.model for d in run.drafters], run.subset, run.tokenizer,
                                   config.num_speculative_tokens, kmax=kmax)
    prompts = replay_prompts(run.subset, run.model, run.tokenizer, [d.obj for d in run.drafters], config,
                             eos=run.eos, ctx_limit=run.ctx_limit, cache=cache, target_weights=continuation_target_weights(run, cache),
                             kmax=kmax, exact=req.exact, engine=req.engine,
                             progress=lambda done, total, _rp: run.progress("replay", done, total))
    return ReplayMeasurement(prompts, kmax, calibration)


def replay_kmax(run: ValidationRun) -> int:
    """The largest k replayed: the request's ``kmax`` (sampling: at most 8), at least the run's k."""
    req, config = run.request, run.config
    return max(req.kmax if config.sampling.is_greedy else min(req.kmax, 8), config.num_speculative_tokens)


def continuation_target_weights(run: ValidationRun, cache: ContinuationCache) -> str:
    """The continuation key's ``target_weights``: the request's (registered) sha256, a served target's config
    hash, else the weights' hash (a LoadedModel with a LoRA adapter merged: its base checkpoint's hash combined with
    the adapter's, :func:`specdec.models.hashes.adapted_weights_sha256`)."""
    if run.request.target_weights:
        return run.request.target_weights
    if is_served(run.model):
        return "config:" + hashlib.sha256(run.model.config.to_json_string(use_diff=False).encode()).hexdigest()
    path = None if run.model is run.request.target else getattr(run.request.target, "path", None)
    adapter = getattr(run.request.target, "adapter", None)
    if adapter is not None and path is not None:  # the base checkpoint's hash, then the adapter's on top
        return adapted_weights_sha256(model_weights_hash(run.model, path, cache.weights_memo), adapter.weights_hash)
    return model_weights_hash(run.model, path, cache.weights_memo)


def _target_note(run: ValidationRun, d: Any) -> dict[str, Any]:
    """Where the target was for a night whose continuations came from an engine (the report's ``target``)."""
    engine = run.request.engine
    note: dict[str, Any] = {"continuations_from": engine.name, "engine": engine.fingerprint,
                            "loaded": not is_served(run.model)}
    if not note["loaded"]:
        note["served_dtype"] = str(engine.fingerprint.get("model_ftype", "served"))
    elif isinstance(d.obj, Eagle3Drafter):
        note["why_loaded"] = "an EAGLE-3 head drafts from the target's hidden states: the target was loaded for them"
    else:
        note["why_loaded"] = "the caller loaded the target (a derived draft is derived from it once)"
    return note


@dataclass
class ReplayResult:
    """One drafter's replay in report form: its section, which measurement gates, the replayed runs at the run's
    k (empty for expected values) and their pooled groups."""

    section: dict[str, Any]
    gate: str
    runs: list[PromptRun]
    overall: GroupMetrics
    categories: dict[str, GroupMetrics]

    @property
    def seconds(self) -> float:  # wall seconds: continuations produced plus teacher-forced passes
        return self.section["seconds"]["continuation"] + self.section["seconds"]["replay"]

    def describe(self, g: GroupMetrics) -> None:
        """The report's overall ``g`` carries the replay's health and the k from the replayed curve."""
        if "replay_decode_agreement" in self.section:
            g.replay_decode_agreement = self.section["replay_decode_agreement"]
            g.replay_beyond_numerics = self.section["beyond_numerics"]
        g.recommended_num_speculative_tokens = self.section["recommended_num_speculative_tokens"]
        g.predicted_speedup_at_recommended = self.section["predicted_speedup_at_recommended"]
        g.recommended_k_basis = REPLAY_BASIS if g.recommended_num_speculative_tokens is not None else g.recommended_k_basis


def replay_result(run: ValidationRun, j: int, measured: ReplayMeasurement, decoded: Any = None) -> ReplayResult:
    """Drafter ``j``'s :class:`ReplayResult`, compared with ``decoded`` (its ``DecodedDrafter``) when given."""
    d, config = run.drafters[j], run.config
    precision, counted = precision_of(run.model, d.model, d.recipe), replays_exactly(d.obj, config)
    cal = measured.calibration
    c, v = (cal.cost_ratios[j], cal.verify_cost) if cal is not None else (math.nan, None)
    c = decoded.overall.cost_ratio if math.isnan(c) and decoded is not None else c
    ok = [rp for rp in measured.prompts if rp.status == "ok"]
    section = _section(ok, config.sampling.is_greedy, counted, run.request.exact or isinstance(d.obj, NgramDrafter),
                       precision)
    if run.request.engine is not None:
        section["target"] = _target_note(run, d)
    ks, k, agg = range(1, measured.kmax + 1), config.num_speculative_tokens, dict(seed=config.seed,
                                                                                  n_resamples=config.bootstrap_resamples)
    if counted:
        section["acceptance_by_k"] = acceptance_by_k([rp.drafters[j].curve for rp in ok], ks, **agg)
        if config.sampling.is_greedy:  # the trace's confidences are the greedy ones (T = 1)
            section.update(best_k_tau([rp.drafters[j].trace for rp in ok], [rp.continuation for rp in ok], ks, c, v,
                                      max_new_tokens=config.max_new_tokens, stop_token_ids=stop_token_ids(run.eos)))
        runs = _replay_runs(measured.prompts, j, k)
        overall, categories = groups(runs, k, **agg, verify_cost=v, cost_ratio=c)
    else:
        runs, categories, overall = [], {}, _expected(section, [rp.drafters[j] for rp in ok], config, ks, agg)
    section.update(recommend_from_curve(section["acceptance_by_k"], c, v))
    rep = ReplayResult(section, gate_method(run.request.method, precision, counted), runs, overall, categories)
    section["gate_method"] = rep.gate
    if decoded is not None:
        _compare(rep, measured, j, decoded, run)
    if counted:  # per prompt at the configured k (prompts.csv holds the decoded rows when decoding ran)
        section["prompts"] = [{"prompt_id": rp.prompt.id, "category": rp.prompt.category, "produced_by": rp.produced_by,
                               **{n: getattr(rp.drafters[j].curve[k], n) for n in (*_COUNTERS, "num_emitted_tokens")}}
                              for rp in ok]
    return rep


def _section(ok: list, greedy: bool, counted: bool, exact: bool, precision: str) -> dict[str, Any]:
    """The section's header: what the numbers are, where the continuations came from, the seconds spent."""
    kind = ("exact counters (greedy replay)" if greedy else
            "exact counters (deterministic proposals along sampled target continuations)" if counted else
            "expected values (sampling: teacher-forced p, q)")
    return {
        "kind": kind, "num_draft_tokens_exact": bool(exact) if counted else False,
        "precision": precision, "num_prompts_replayed": len(ok),
        "continuations": {w: sum(rp.produced_by == w for rp in ok) for w in ("cache", "speculative", "ngram", "target-only")}
        | ({"engine": n} if (n := sum(rp.produced_by == "engine" for rp in ok)) else {}),
        "seconds": {"continuation": sum(rp.continuation_seconds for rp in ok),
                    "replay": sum(rp.replay_seconds for rp in ok)},
    }


def _expected(section: dict[str, Any], replays: list, config: Any, ks: range, agg: dict) -> GroupMetrics:
    """Sampled rule: the expected acceptance-by-k table into ``section``; the group at the run's k."""
    k = config.num_speculative_tokens
    curve = expected_curve([r.alphas for r in replays], ks, max_new_tokens=config.max_new_tokens,
                           adopts_prefix=any(r.adopts_prefix for r in replays), **agg)
    section["acceptance_by_k"] = [{"k": kk, **vals} for kk, vals in curve.items()]
    e = curve[k]
    return GroupMetrics(num_prompts=len(replays), num_speculative_tokens=k, acceptance_rate=e["expected_acceptance_rate"],
                        acceptance_rate_ci=e["expected_acceptance_rate_ci"],
                        mean_accepted_length=e["expected_mean_accepted_length"])


def _replay_runs(replayed: list[ReplayedPrompt], j: int, k: int) -> list[PromptRun]:
    """One :class:`PromptRun` per prompt with drafter ``j``'s replayed counters at k."""
    runs = []
    for rp in replayed:
        run = PromptRun(row=PromptResult(rp.prompt.id, rp.prompt.category, status=rp.status,
                                         skip_reason=rp.skip_reason, prompt_tokens=len(rp.ids)))
        if rp.status == "ok":
            run.stats = rp.drafters[j].curve[k]
            run.row.new_tokens = run.row.target_only_tokens = len(rp.continuation)
            record_counters(run.row, run.stats)
        runs.append(run)
    return runs


def _compare(rep: ReplayResult, measured: ReplayMeasurement, j: int, decoded: Any, run: ValidationRun) -> None:
    """The decoded subsample next to the replay: both counters and (greedy) the agreement."""
    section, k, agg = rep.section, run.config.num_speculative_tokens, decoded.agg
    section["num_prompts_decoded"] = decoded.overall.num_prompts
    section["counters"] = {"decode": _counters(decoded.overall)}
    if run.config.sampling.is_greedy:
        section.update(_agreement(measured.prompts, j, decoded, k, (section["precision"], stop_token_ids(run.eos))))
        ids = {r.row.prompt_id for r in decoded.runs if r.ok}
        same = [r for r in rep.runs if r.row.prompt_id in ids]
        section["counters"]["replay_on_decoded"] = _counters(aggregate(same, k, seed=agg["seed"],
                                                                       n_resamples=agg["n_resamples"]))
    section["counters"]["replay"] = _counters(rep.overall)
    lo, hi = decoded.overall.acceptance_rate_ci
    section["replay_inside_decode_ci"] = bool(lo <= rep.overall.acceptance_rate <= hi) if not math.isnan(lo) else None


def _agreement(replayed: list[ReplayedPrompt], j: int, decoded: Any, k: int,
               pair: tuple[str, frozenset[int]]) -> dict[str, Any]:
    """``replay_decode_agreement`` and the disagreements of drafter ``j``; ``pair``: (precision, stop ids)."""
    precision, stop = pair
    by_id = {rp.prompt.id: rp for rp in replayed if rp.status == "ok"}
    compared, agreeing, disagreements = 0, 0, []
    for row in (r.row for r in decoded.runs):
        rp = by_id.get(row.prompt_id)
        if row.status != "ok" or rp is None:
            continue
        compared += 1
        s = rp.drafters[j].curve[k]
        dec, rep = tuple(getattr(row, n) for n in _COUNTERS), tuple(getattr(s, n) for n in _COUNTERS)
        recorded, contexts = decoded.proposals.get(row.prompt_id, ([], []))
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
            "decode": dict(zip(_COUNTERS, dec)), "replay": dict(zip(_COUNTERS, rep)),
            "exact_match": row.exact_match, "side": side,
            "class": classify(margin, precision, unseen_stop=unseen_stop, counters_equal=dec == rep),
        })
    return {"replay_decode_agreement": agreeing / compared if compared else math.nan, "num_compared": compared,
            "disagreements": disagreements,
            "beyond_numerics": sum(d["class"] == "beyond numerics" for d in disagreements)}


def _counters(g: GroupMetrics) -> dict[str, Any]:
    return {"num_prompts": g.num_prompts, **{n: getattr(g, n) for n in _COUNTERS}, "acceptance_rate": g.acceptance_rate,
            "acceptance_rate_ci": list(g.acceptance_rate_ci), "mean_accepted_length": g.mean_accepted_length}
