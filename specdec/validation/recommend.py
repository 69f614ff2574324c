"""Which draft pays on this machine: measure candidate drafters against the target, here and now.

:func:`recommend_draft` runs four phases on a small stratified set of prompts (every category):

1. **cost** (isolated passes with a warm KV cache, repetitions interleaved across models): the
   target's one-token pass, its (k+1)-token verification pass for every k (``v(k)`` = ratio to the
   one-token pass, fitted as ``a + b k`` against timing noise) and each draft model's
   one-token pass (``c`` = ratio to the target's);
2. **acceptance** (teacher forcing on a few prompts): greedy top-1 agreement of each draft with
   the target's own continuation, the per-token α of Leviathan's model;
3. **best k** per model drafter from α, c and v(k) (:func:`specdec.validation.speed.best_k`); the n-gram
   drafter uses ``ngram_k``;
4. **speed** (interleaved): for each prompt, target-only and every candidate at its k, in an order
   rotated from prompt to prompt; measured speedup is the pooled ratio of token rates, with a
   paired per-prompt bootstrap 95% CI (:mod:`specdec.validation.speed`), and every greedy output is compared
   with target-only's.

The best candidate is, among those whose outputs were all identical and whose measured speedup
is above 1, the one with the highest CI lower bound (the gain it credibly gives); when none is,
the recommendation says so and why (e.g. no derived draft is cheaper than the target: ``c`` near or above 1, no native bf16). Candidates that cannot run here
(``derived:fp8`` off a float8 GPU) are listed with the reason.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from specdec.core.kv import timed
from specdec.validation.report import nan_to_none
from specdec.validation.speed import best_k, bootstrap_speedup_ci, pooled_speedup, predicted_speedup_with_verify

__all__ = ["CandidateResult", "Recommendation", "recommend_draft", "default_candidates", "smooth_verify_cost"]

CPU_CANDIDATES = ("derived:bf16", "derived:int8", "derived:int4", "ngram")
CUDA_CANDIDATES = ("derived:fp8", "derived:int8", "ngram")
PAYS_ABOVE = 1.0


def default_candidates(device: str | torch.device) -> tuple[str, ...]:
    """The candidates measured when none are given: bf16/int8/int4 copies and n-gram on a CPU;
    fp8/int8 copies and n-gram on CUDA (a bf16 target's bf16 copy would be the target itself)."""
    return CUDA_CANDIDATES if torch.device(device).type == "cuda" else CPU_CANDIDATES


@dataclass
class CandidateResult:
    """One candidate drafter, measured.

    Attributes:
        spec: the drafter spec (``derived:bf16``, ``ngram``, ...). kind: resolved kind.
        available: False when it cannot run here (``reason`` says why) or failed to build.
        cost_ratio: c, draft pass / target one-token pass (NaN for n-gram: no model).
        alpha: teacher-forced greedy top-1 agreement with the target (NaN for n-gram).
        k: num_speculative_tokens used for the speed phase.
        verify_cost: v(k) at that k. predicted_speedup: E[tokens/step](α, k) / (c k + v(k)).
        measured_speedup / speedup_ci: pooled ratio of token rates vs target-only and its 95% CI.
        alpha_hat / acceptance_rate: from the decoding counters of the speed phase.
        identical_outputs / compared_outputs: greedy outputs equal to target-only's.
        reason: why it is unavailable, or a one-line finding.
    """

    spec: str
    kind: str = ""
    available: bool = True
    cost_ratio: float = math.nan
    alpha: float = math.nan
    k: int | None = None
    verify_cost: float = math.nan
    predicted_speedup: float = math.nan
    measured_speedup: float = math.nan
    speedup_ci: list[float] = field(default_factory=lambda: [math.nan, math.nan])
    alpha_hat: float = math.nan
    acceptance_rate: float = math.nan
    identical_outputs: int = 0
    compared_outputs: int = 0
    reason: str | None = None

    @property
    def speedup_ci_low(self) -> float:
        """Lower end of the measured speedup's 95% CI (NaN when none was computed)."""
        return self.speedup_ci[0] if self.speedup_ci else math.nan

    @property
    def pays(self) -> bool:
        """Credibly faster than target-only with every compared output identical: the measured
        speedup and the lower end of its 95% CI (when one was computed) are above 1.0."""
        lo = self.speedup_ci_low
        return (self.available and not math.isnan(self.measured_speedup) and self.measured_speedup > PAYS_ABOVE
                and (math.isnan(lo) or lo > PAYS_ABOVE) and self.identical_outputs == self.compared_outputs)


@dataclass
class Recommendation:
    """What :func:`recommend_draft` found. ``best`` is the spec to use, or ``None`` when no
    candidate pays here (``summary`` says why); ``fallback`` is the fastest measured candidate."""

    target_ref: str
    device: str
    dtype: str
    native_bf16: dict[str, Any]
    candidates: list[CandidateResult]
    best: str | None
    fallback: str | None
    summary: str
    num_prompts: int
    categories: list[str]
    max_new_tokens: int
    target_step_ms: float
    verify_cost_by_k: dict[int, float]
    load_avg_1m: list[float]
    num_cpus: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (NaN -> None)."""
        d = asdict(self)
        d["candidates"] = [{**asdict(c), "pays": c.pays} for c in self.candidates]
        return nan_to_none(d)


# --------------------------------------------------------------------------- phase 1: costs
@torch.inference_mode()
def _pass_costs(models: dict[str, tuple[Any, list[int]]], prompt: list[int], reps: int) -> dict[str, dict[int, float]]:
    """Median seconds of one forward pass per (model, width), warm KV cache, interleaved reps.

    ``models``: name -> (model, widths). Each pass appends ``width`` tokens to the cached prompt and
    keeps ``width`` logits (as verification does), then the cache is cropped back.
    """
    from specdec.core.kv import crop_cache, model_device, model_kwargs, new_cache, sync

    state = {}
    for name, (model, _) in models.items():
        cache = new_cache(model)
        dev = model_device(model)
        model(input_ids=torch.tensor([prompt], device=dev), **model_kwargs(model, cache, 1))
        state[name] = (cache, dev)
    times: dict[str, dict[int, list[float]]] = {n: {w: [] for w in ws} for n, (_, ws) in models.items()}
    filler = prompt[-1]
    for _ in range(reps + 1):  # the first round warms up and is dropped
        for name, (model, widths) in models.items():
            cache, dev = state[name]
            for w in widths:
                ids = torch.full((1, w), filler, dtype=torch.long, device=dev)
                sync(dev)
                t0 = time.perf_counter()
                model(input_ids=ids, **model_kwargs(model, cache, w))
                sync(dev)
                times[name][w].append(time.perf_counter() - t0)
                crop_cache(cache, len(prompt))
    return {n: {w: statistics.median(v[1:]) for w, v in ws.items()} for n, ws in times.items()}


# --------------------------------------------------------------------------- phase 2: acceptance
@torch.inference_mode()
def _top1_agreement(draft, prompt: list[int], continuation: list[int]) -> tuple[int, int]:
    """(positions where the draft's argmax equals the target's greedy token, positions)."""
    from specdec.core.kv import model_device

    if not continuation:
        return 0, 0
    n = len(continuation)
    x = torch.tensor([prompt + continuation[:-1]], device=model_device(draft))
    logits = draft(input_ids=x, use_cache=False, logits_to_keep=n).logits[0, -n:]
    v = logits.shape[-1]
    pred = logits.argmax(-1).tolist()
    return sum(int(p == t) for p, t in zip(pred, continuation) if t < v), n


def smooth_verify_cost(measured: dict[int, float]) -> dict[int, float]:
    """v(k) fitted as ``a + b k`` (ordinary least squares over the measured k), so the choice of
    k does not follow the noise of single timings. The intercept absorbs the jump from a 1-token
    pass (the unit) to any wider one; values never go below 1.

    Args:
        measured: ``{k: (k+1)-token target pass / 1-token pass}`` for k >= 1.
    Returns:
        ``{k: max(1, a + b k)}`` for the same k (``b >= 0``); the input itself with fewer than 2 points.
    """
    if len(measured) < 2:
        return {k: max(1.0, v) for k, v in measured.items()}
    n = len(measured)
    mk = sum(measured) / n
    mv = sum(measured.values()) / n
    b = sum((k - mk) * (v - mv) for k, v in measured.items()) / sum((k - mk) ** 2 for k in measured)
    b = max(b, 0.0)
    a = mv - b * mk
    return {k: max(1.0, a + b * k) for k in measured}


def recommend_draft(
    target: Any,
    heldout: Any,
    *,
    candidates: Sequence[str] | None = None,
    max_new_tokens: int = 32,
    k_values: Sequence[int] = tuple(range(1, 9)),
    ngram_k: int = 4,
    repeats: int = 1,
    cost_reps: int = 15,
    calibration_prompts: int = 3,
    bootstrap_resamples: int = 2000,
    seed: int = 0,
    target_ref: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> Recommendation:
    """Measure ``candidates`` against ``target`` on ``heldout`` and name the draft that pays here.

    Args:
        target: a :class:`specdec.models.LoadedModel` (model + tokenizer).
        heldout: the prompts to measure on (use a small stratified set, e.g.
            :func:`specdec.validation.short_prompts.short_prompts`).
        candidates: drafter specs (default :func:`default_candidates` for the target's device).
        max_new_tokens: new tokens per generation.
        k_values: k values whose verification cost is measured (the best k is chosen among them).
        ngram_k: k of the n-gram drafter.
        repeats: interleaved repeats per prompt in the speed phase.
        cost_reps: timed passes per (model, width) in the cost phase (median).
        calibration_prompts: prompts whose target continuation gives the teacher-forced α.
        bootstrap_resamples, seed: for the speedup CI.
        target_ref: name shown in the result.
        progress: called with one line per step.
    Returns:
        :class:`Recommendation`.
    Raises:
        ValueError: no prompts, bad ``k_values``/``repeats``, or a malformed drafter spec.
    """
    from specdec import SamplingConfig, autoregressive_generate, speculative_generate
    from specdec.models.derived import UnsupportedRecipeError
    from specdec.models.drafter_spec import DrafterSpecError, resolve_drafter
    from specdec.validation.heldout import prompt_token_ids
    from specdec.validation.machine import LoadSampler, native_bf16, usable_cpus
    from specdec.validation.provenance import eos_token_ids

    t_start = time.perf_counter()
    say = progress or (lambda _msg: None)
    if repeats < 1 or not k_values or min(k_values) < 1 or ngram_k < 1:
        raise ValueError("repeats, k_values and ngram_k must be >= 1")
    model, tok = target.model.eval(), target.tokenizer
    device = next(model.parameters()).device
    ctx = getattr(model.config, "max_position_embeddings", None) or 10**9
    prompts = [(p, prompt_token_ids(p, tok)) for p in heldout.prompts if not p.is_empty]
    prompts = [(p, ids) for p, ids in prompts if ids and len(ids) + max_new_tokens + max(k_values) + 1 <= ctx]
    if not prompts:
        raise ValueError("no usable prompt (all empty or longer than the context)")
    eos = eos_token_ids(tok, model)
    greedy = SamplingConfig()
    load = LoadSampler()
    load.sample()

    # build the candidates ---------------------------------------------------------------------
    results: list[CandidateResult] = []
    drafters: dict[str, Any] = {}
    for spec in candidates or default_candidates(device):
        say(f"preparing {spec}")
        try:
            r = resolve_drafter(spec, target)
        except (UnsupportedRecipeError, DrafterSpecError) as e:
            results.append(CandidateResult(spec=spec, available=False, reason=str(e)))
            continue
        res = CandidateResult(spec=spec, kind=r.kind)
        if r.kind == "derived:bf16" and next(model.parameters()).dtype == torch.bfloat16:
            res.available, res.reason = False, "the target already runs in bf16: its bf16 copy is the target"
        else:
            drafters[spec] = r.drafter.eval() if isinstance(r.drafter, torch.nn.Module) else r.drafter
        results.append(res)
    by_spec = {c.spec: c for c in results}
    model_specs = [s for s in drafters if isinstance(drafters[s], torch.nn.Module)]

    # phase 1: costs ---------------------------------------------------------------------------
    say("phase 1/4: pass costs (c, v(k))")
    ks = sorted(set(int(k) for k in k_values))
    cal_prompt = min((ids for _, ids in prompts), key=len)
    costs = _pass_costs({"target": (model, [1] + [k + 1 for k in ks]),
                         **{s: (drafters[s], [1]) for s in model_specs}}, cal_prompt, cost_reps)
    t1 = costs["target"][1]
    verify = smooth_verify_cost({k: costs["target"][k + 1] / t1 for k in ks})
    for s in model_specs:
        by_spec[s].cost_ratio = costs[s][1] / t1
    load.sample()

    # phase 2 + 3: acceptance and best k -------------------------------------------------------
    say("phase 2/4: teacher-forced acceptance")
    cal = sorted(prompts, key=lambda pi: len(pi[1]))[:calibration_prompts]
    conts = [(ids, autoregressive_generate(model, torch.tensor([ids], device=device), max_new_tokens=max_new_tokens,
                                           sampling=greedy, eos_token_id=eos).token_ids) for _, ids in cal]
    for s in model_specs:
        hit = tot = 0
        for ids, cont in conts:
            h, n = _top1_agreement(drafters[s], ids, cont)
            hit, tot = hit + h, tot + n
        c = by_spec[s]
        c.alpha = hit / tot if tot else math.nan
        c.k, c.predicted_speedup = best_k(c.alpha, c.cost_ratio, verify)
        c.k = c.k or min(ks)
        c.verify_cost = verify.get(c.k, math.nan)
    for s, d in drafters.items():
        if s not in model_specs:
            by_spec[s].k = ngram_k
            by_spec[s].verify_cost = verify.get(ngram_k, math.nan)
    say("phase 3/4: best k " + ", ".join(f"{s} k={by_spec[s].k}" for s in drafters))

    # phase 4: interleaved speed ---------------------------------------------------------------
    say(f"phase 4/4: interleaved timing on {len(prompts)} prompts x {repeats}")
    x0 = torch.tensor([cal_prompt], device=device)
    autoregressive_generate(model, x0, max_new_tokens=4, sampling=greedy, eos_token_id=eos)
    for s, d in drafters.items():  # warm-up, untimed
        speculative_generate(model, d, x0, num_speculative_tokens=by_spec[s].k, max_new_tokens=4, sampling=greedy,
                             eos_token_id=eos)
    order = ["target"] + list(drafters)
    per: dict[str, list[list[float]]] = {s: [] for s in order}  # per prompt: [tokens, seconds]
    stats: dict[str, Any] = {}
    for i, (p, ids) in enumerate(prompts):
        x = torch.tensor([ids], device=device)
        acc = {s: [0.0, 0.0] for s in order}
        for r in range(repeats):
            rot = (i + r) % len(order)
            outs: dict[str, list[int]] = {}
            for s in order[rot:] + order[:rot]:
                if s == "target":
                    out, sec = timed(lambda: autoregressive_generate(model, x, max_new_tokens=max_new_tokens,
                                                                      sampling=greedy, eos_token_id=eos), device)
                else:
                    out, sec = timed(lambda: speculative_generate(
                        model, drafters[s], x, num_speculative_tokens=by_spec[s].k, max_new_tokens=max_new_tokens,
                        sampling=greedy, eos_token_id=eos), device)
                    stats[s] = out.stats if s not in stats else stats[s].merge(out.stats)
                outs[s] = out.token_ids
                acc[s][0] += len(out.token_ids)
                acc[s][1] += sec
            for s in drafters:
                by_spec[s].compared_outputs += 1
                by_spec[s].identical_outputs += int(outs[s] == outs["target"])
        for s in order:
            per[s].append(acc[s])
        load.sample()
        say(f"  prompt {i + 1}/{len(prompts)} ({p.category})")

    ref_tok = [a[0] for a in per["target"]]
    ref_s = [a[1] for a in per["target"]]
    for s in drafters:
        c = by_spec[s]
        st = [a[0] for a in per[s]]
        ss = [a[1] for a in per[s]]
        c.measured_speedup = pooled_speedup(ref_tok, ref_s, st, ss)
        c.speedup_ci = bootstrap_speedup_ci(ref_tok, ref_s, st, ss, n_resamples=bootstrap_resamples, seed=seed)
        c.alpha_hat, c.acceptance_rate = stats[s].alpha_hat, stats[s].acceptance_rate
        if s in model_specs and c.k is not None:
            c.predicted_speedup = predicted_speedup_with_verify(c.alpha, c.cost_ratio, c.k, c.verify_cost)
        c.reason = _finding(c)

    measured = [c for c in results if c.available and not math.isnan(c.measured_speedup)]
    paying = sorted((c for c in measured if c.pays), key=_rank, reverse=True)
    fastest = max(measured, key=_rank, default=None)
    nb = native_bf16(str(device))
    best = paying[0].spec if paying else None
    summary = _summary(best, paying, measured, nb, str(device))
    return Recommendation(
        target_ref=target_ref or str((getattr(target, "source", None) or {}).get("ref") or "target"),
        device=str(device), dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
        native_bf16=nb, candidates=results, best=best, fallback=fastest.spec if fastest else None,
        summary=summary, num_prompts=len(prompts), categories=sorted({p.category for p, _ in prompts}),
        max_new_tokens=max_new_tokens, target_step_ms=t1 * 1e3, verify_cost_by_k=verify,
        load_avg_1m=list(load.samples), num_cpus=usable_cpus(), seconds=time.perf_counter() - t_start,
    )


def _rank(c: CandidateResult) -> tuple[float, float]:
    """Rank by the lower end of the speedup CI (the gain it credibly gives), then the point value:
    a steady 1.10x [1.05, 1.15] beats a prompt-dependent 1.12x [0.85, 1.40]."""
    lo = c.speedup_ci_low
    return (c.measured_speedup if math.isnan(lo) else lo, c.measured_speedup)


def _finding(c: CandidateResult) -> str | None:
    if c.identical_outputs != c.compared_outputs:
        return f"{c.compared_outputs - c.identical_outputs} greedy output(s) differ from target-only (numeric near-ties?)"
    if not math.isnan(c.cost_ratio) and c.cost_ratio >= 0.9:
        return f"not cheaper than the target here (c = {c.cost_ratio:.2f} of a target pass)"
    lo = c.speedup_ci_low
    if not math.isnan(c.measured_speedup) and c.measured_speedup > PAYS_ABOVE and not math.isnan(lo) and lo <= PAYS_ABOVE:
        return f"faster on average but not credibly (95% CI {lo:.2f}-{c.speedup_ci[1]:.2f}x includes 1.0x)"
    if not math.isnan(c.measured_speedup) and c.measured_speedup <= PAYS_ABOVE:
        if c.kind == "ngram":
            return "too few of its lookups hit on these prompts to pay for the wider verification passes"
        return f"acceptance too low for its cost (alpha {c.alpha:.2f}, c {c.cost_ratio:.2f})"
    return None


def _summary(best: str | None, paying: list[CandidateResult], measured: list[CandidateResult],
             nb: dict[str, Any], device: str) -> str:
    if best is not None:
        c = paying[0]
        return (f"use {best} with k={c.k}: measured {c.measured_speedup:.2f}x "
                f"(95% CI {c.speedup_ci[0]:.2f}-{c.speedup_ci[1]:.2f}x) over target-only, "
                f"{c.identical_outputs}/{c.compared_outputs} greedy outputs identical")
    why = []
    derived = [c for c in measured if c.kind.startswith("derived:")]
    if derived and all(c.cost_ratio >= 0.9 for c in derived if not math.isnan(c.cost_ratio)):
        why.append("no derived draft is cheaper than the target on this " + ("GPU" if "cuda" in device else "CPU"))
    if "cuda" not in device and not nb.get("native"):
        why.append(nb.get("detail", "no native bf16"))
    if not measured:
        why.append("no candidate could run here")
    return "no candidate is faster than target-only here" + (": " + "; ".join(why) if why else "") + \
        ". Serve target-only, or measure a trained draft model (model:<ref>)."
