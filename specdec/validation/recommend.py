"""Which draft pays on this machine: validation of the candidate drafts through the one driver.

:func:`recommend_draft`: (1) c of each draft model and the target's v(n), measured once
(:func:`specdec.validation.timing.calibrate`); (2) one greedy replay of every candidate, exact counters
at every k (:func:`specdec.validation.validate`, ``method="replay"``); (3) each candidate's k, the one
speed model's best over its replayed counters (:func:`specdec.validation.replay_curve.recommend_from_curve`);
(4) the speed check, :func:`specdec.validation.validate` at that k (the nightly's protocol:
warm, interleaved per prompt, paired median with a bootstrap CI, loaded rounds re-timed, exactness).
Ranked by the lower end of the speedup CI; a "timing suspect" candidate (measured/predicted outside
:data:`specdec.validation.speed.TIMING_BAND`) never pays.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from specdec import stopping
from specdec.models.store import ModelStore
from specdec.validation.candidates import (CandidateResult, Recommendation, default_candidates,
                                           resolve_candidates)
from specdec.validation.findings import recommendation_summary

__all__ = ["CandidateResult", "Recommendation", "recommend_draft", "default_candidates"]


def recommend_draft(target: Any, heldout: Any, *, candidates: Sequence[str] | None = None, max_new_tokens: int = 32,
                    k_values: Sequence[int] = tuple(range(1, 9)), cost_reps: int = 7, bootstrap_resamples: int = 2000,
                    seed: int = 0, target_ref: str | None = None, speed_heldout: Any = None,
                    progress: Callable[[str], None] | None = None, cache: Any, store: ModelStore) -> Recommendation:
    """Validate ``candidates`` (default :func:`default_candidates`) against ``target`` (a LoadedModel) on
    ``heldout`` (a small stratified set, :func:`specdec.validation.short_prompts.short_prompts`) at the k in
    ``k_values``; ``progress`` gets one line per phase; ``cache``: the replay's continuation cache (the entry
    point's, :meth:`specdec.validation.continuation_cache.ContinuationCache.in_home`); ``store``: the model caches a
    candidate's draft reference is fetched into (the entry point's).

    ``speed_heldout``: the prompts of the speed check (phase 4), default ``heldout``. Pass the set the
    nightly will validate on: the speed CI is a bootstrap over prompts, so the same prompt set size
    gives recommend's figure the width night 1's has, and each lies in the other's CI; on a smaller set
    the CI is wider (about sqrt(nightly / recommend prompts) times) and the figure is a different
    prompts' median. Raises ValueError: no usable prompt, bad ``k_values``."""
    from specdec.validation.api import ValidationRequest, calibrate_on, drafter_parts, validate
    from specdec.validation.config import ValidationConfig
    from specdec.validation.machine import LoadSampler

    if not k_values or min(k_values) < 1:
        raise ValueError("k_values must be >= 1")
    t0, say, load = time.perf_counter(), progress or (lambda _m: None), LoadSampler()
    ks, model = sorted({int(k) for k in k_values}), target.model.eval()
    device = next(model.parameters()).device
    results, drafters = resolve_candidates(target, candidates or default_candidates(device), store=store)
    by_spec, specs = {c.spec: c for c in results}, list(drafters)
    cfg = ValidationConfig(num_speculative_tokens=ks[0], max_new_tokens=max_new_tokens, seed=seed,
                           bootstrap_resamples=bootstrap_resamples)
    load.sample()
    speed_set = heldout if speed_heldout is None else speed_heldout
    say(f"phase 1/4: pass costs (c, v(n)) of {len(specs)} candidate(s): {', '.join(specs) or '-'}")
    cal = calibrate_on(model, [drafter_parts(drafters[s])[1] for s in specs], heldout, target.tokenizer, ks[-1],
                       kmax=ks[-1], reps=cost_reps)
    if cal is None:
        raise ValueError("no usable prompt (all empty)")
    say(expected_time(cal, len(heldout.prompts), len(speed_set.prompts), max_new_tokens))
    say(f"phase 2/4: acceptance at every k (replay of {len(heldout.prompts)} prompts, every candidate at once)")
    replays = validate(ValidationRequest(target, [drafters[s] for s in specs], heldout, cfg, method="replay",
                                         kmax=ks[-1], calibration=cal, target_ref=target_ref, cache=cache,
                                         progress=_per_prompt(say, "phase 2/4"))) if specs else []
    say("phase 3/4: best k")
    for j, (s, rep) in enumerate(zip(specs, replays)):
        _choose_k(by_spec[s], rep, cal.cost_ratios[j], cal.verify_cost, ks)
    for j, s in enumerate(specs):
        c = by_spec[s]
        if stopping.requested():  # Ctrl-C: the candidates measured so far are the recommendation
            c.reason = "not measured: stopped (Ctrl-C)"
            continue
        say(f"phase 4/4: speed check {j + 1}/{len(specs)}: {s} at k={c.k} on {len(speed_set.prompts)} prompts")
        kcfg = replace(cfg, speculative=replace(cfg.speculative, num_speculative_tokens=c.k))
        one = replace(cal, cost_ratios=[cal.cost_ratios[j]], draft_prefill=cal.draft_prefill[j:j + 1])
        try:
            [rep] = validate(ValidationRequest(target, [drafters[s]], speed_set, kcfg, target_ref=target_ref,
                                               calibration=one, progress=_per_prompt(say, f"phase 4/4: {s}")))
        except stopping.Terminated:  # stopped at a prompt of this candidate: not measured, the others are kept
            c.reason = "not measured: stopped (Ctrl-C)"
            continue
        _fill(c, rep)
        load.sample()
    return _recommendation(target, target_ref, results, _Measured(speed_set, max_new_tokens, cal, ks, load, t0))


def _per_prompt(say: Callable[[str], None], what: str) -> Callable[[Any], None]:
    """A validation progress callback saying ``<what>: <phase> i/N`` after each prompt of each phase; after a
    Ctrl-C it stops the validation there (:func:`specdec.stopping.check`)."""
    def progress(p: Any) -> None:
        say(f"{what}: {p.phase} {p.done}/{p.total}")
        stopping.check()

    return progress


def expected_time(cal: Any, replay_prompts: int, speed_prompts: int, max_new_tokens: int) -> str:
    """The line stating how long phases 2-4 should take, from the target's measured one-token pass: the
    replay is one target generation per prompt plus each draft's passes (c per token), each speed check a
    target-only and a speculative decode of every prompt (about two generations)."""
    step, n = cal.target_step_s, len(cal.cost_ratios)
    draft = sum(c for c in cal.cost_ratios if not math.isnan(c))
    seconds = step * max_new_tokens * (replay_prompts * (1 + draft) + 2 * n * speed_prompts)
    return (f"expected time: about {max(1, round(seconds / 60))} min for {n} candidate(s) "
            f"({step * 1e3:.0f} ms per target pass here; longer on a loaded machine)")


def _choose_k(c: CandidateResult, replay: Any, cost_ratio: float, verify_cost: Any, ks: list[int]) -> None:
    """The candidate's k: the one speed model's best over the replayed rows for the k considered
    (an n-gram drafter's c is measured in the decoding check, so its rows use c = 0: a lookup is
    ~1e-4 of a target pass)."""
    from specdec.validation.replay_curve import recommend_from_curve

    rows = [r for r in replay.replay["acceptance_by_k"] if r["k"] in ks]
    c.cost_ratio = cost_ratio
    c_used = 0.0 if math.isnan(cost_ratio) else cost_ratio
    c.k = recommend_from_curve(rows, c_used, verify_cost)["recommended_num_speculative_tokens"] or ks[0]
    c.alpha = next(r["acceptance_rate"] for r in rows if r["k"] == c.k)
    c.acceptance_by_k = {int(r["k"]): float(r["acceptance_rate"]) for r in rows}
    c.verify_cost = verify_cost(c.k)
    c.best_k_tau = replay.replay.get("best_k_tau")


def _fill(c: CandidateResult, rep: Any) -> None:
    from specdec.validation.findings import candidate_finding, timing_suspect_note

    g = rep.overall
    c.predicted_speedup, c.measured_speedup, c.speedup_ci = g.predicted_speedup, g.speedup, list(g.speedup_ci)
    c.alpha_hat, c.acceptance_rate = g.alpha_hat, g.acceptance_rate
    c.identical_outputs, c.compared_outputs = g.exactness_checked - g.exactness_mismatches, g.exactness_checked
    c.measured_over_predicted, c.timing_suspect = g.measured_over_predicted, g.timing_suspect
    if math.isnan(c.cost_ratio):
        c.cost_ratio = g.predicted_cost_ratio
    c.reason = timing_suspect_note(g) or candidate_finding(c)


def _rank(c: CandidateResult) -> tuple[bool, float, float]:
    """Trusted timings, then the CI's lower end, then the point value (1.10x [1.05, 1.15] > 1.12x [0.85, 1.40])."""
    lo = c.speedup_ci_low
    return (not c.timing_suspect, c.measured_speedup if math.isnan(lo) else lo, c.measured_speedup)


@dataclass(frozen=True)
class _Measured:
    """What the recommendation records next to its candidates: the speed check's prompts, the budget, the
    calibration, the k considered, the load samples and when the measurement started (perf_counter)."""

    heldout: Any
    max_new_tokens: int
    cal: Any
    ks: list[int]
    load: Any
    t0: float


def _recommendation(target: Any, target_ref: str | None, results: list[CandidateResult], m: _Measured) -> Recommendation:
    from specdec.validation.machine import native_bf16, usable_cpus

    measured = [c for c in results if c.available and not math.isnan(c.measured_speedup)]
    paying = sorted((c for c in measured if c.pays), key=_rank, reverse=True)
    fastest = max(measured, key=_rank, default=None)
    best = paying[0].spec if paying else None
    device = str(next(target.model.parameters()).device)
    nb = native_bf16(device)
    return Recommendation(
        target_ref=target_ref or str((getattr(target, "source", None) or {}).get("ref") or "target"),
        device=device, dtype=str(next(target.model.parameters()).dtype).removeprefix("torch."), native_bf16=nb,
        candidates=results, best=best, fallback=fastest.spec if fastest else None,
        summary=recommendation_summary(best, paying, measured, nb, device), num_prompts=len(m.heldout.prompts),
        categories=sorted({p.category for p in m.heldout.prompts}), max_new_tokens=m.max_new_tokens,
        target_step_ms=m.cal.target_step_s * 1e3, verify_cost_by_k={k: m.cal.verify_cost(k) for k in m.ks},
        load_avg_1m=list(m.load.samples), num_cpus=usable_cpus(), seconds=time.perf_counter() - m.t0)
