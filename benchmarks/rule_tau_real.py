"""Issue 21 on the real pair: the argmax proposal rule and the greedy (k, tau) draft-length policy.

1. Argmax proposals (vLLM's rule) at temperature 0.7, top-p 0.9: for each seed,
   ``validate(ValidationRequest(method="both", decode_fraction=1))`` with ``draft_sampling="argmax"`` gives
   the REPLAYED acceptance (exact counters along the target's sampled continuation: accepted iff
   the sampled token is the draft's argmax, :mod:`specdec.validation.replay_run`) and the DECODED
   acceptance of :func:`specdec.speculative_generate`. Both are pooled per prompt over the seeds
   with the project's bootstrap CI over prompts (``bootstrap_ratio_ci``); the check holds when the
   pooled replayed acceptance lies inside the decoded CI. The sampled rule's expected acceptance
   (``sum min(p, q)``, replay only) is reported for contrast.
2. Greedy draft-length policy: ``replay_prompts`` + ``replay_grid`` / ``best_k_tau`` over k = 1..8
   and tau in {0.3, 0.5, 0.8} with the costs measured once (``calibrate_on``), then both the best
   fixed k and the best thresholded (k, tau) are MEASURED with ``validate`` (same
   calibration); the report's exactness audit must show every greedy output equal to target-only.

Writes ``benchmarks/results/<date>-rule-tau-cpu.json`` and ``.md``.

Usage::

    nice -n 19 env OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/rule_tau_real.py \
        --limit 8 --max-new-tokens 40 --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TAUS = (0.3, 0.5, 0.8)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def argmax_check(tgt, drafter, subset, args, cache, calibration) -> dict:
    """Check 1: replayed acceptance (argmax rule, exact counters along target samples) inside the decoded CI,
    seeds pooled per prompt; the sampled rule's expected acceptance for contrast."""
    from specdec.core.config import SamplingConfig, SpeculativeConfig
    from specdec.validation.config import ValidationConfig
    from specdec.validation.metrics import bootstrap_ratio_ci
    from specdec.validation.api import ValidationRequest, validate

    sampling = SamplingConfig(temperature=0.7, top_p=0.9)
    pooled = {"decoded": ({}, {}), "replayed": ({}, {})}  # per prompt: accepted, drafted
    sampled_rule = [0.0, 0.0]
    per_seed = []

    def add(which: str, pid: str, accepted: int, drafted: int) -> None:
        acc, dr = pooled[which]
        acc[pid], dr[pid] = acc.get(pid, 0) + accepted, dr.get(pid, 0) + drafted

    for seed in args.seeds:
        for rule in ("argmax", "sampled"):
            spec = SpeculativeConfig(args.k, sampling, args.max_new_tokens, draft_sampling=rule)
            config = ValidationConfig(spec, seed=seed, limit=None, bootstrap_resamples=args.resamples)
            t0 = time.perf_counter()
            [r] = validate(ValidationRequest(tgt, [drafter], subset, config,
                                             method="both" if rule == "argmax" else "replay", decode_fraction=1.0,
                                             kmax=args.k, cache=cache, target_ref=args.target, calibration=calibration))
            entry = {"seed": seed, "rule": rule, "kind": r.replay["kind"], "seconds": time.perf_counter() - t0}
            if rule == "argmax":
                entry.update(replayed=r.replay["counters"]["replay"], decoded=r.replay["counters"]["decode"],
                             replay_inside_decode_ci_this_seed=r.replay["replay_inside_decode_ci"])
                for p in r.replay["prompts"]:
                    add("replayed", p["prompt_id"], p["num_accepted_tokens"], p["num_draft_tokens"])
                for p in r.prompts:
                    if p.status == "ok":
                        add("decoded", p.prompt_id, p.num_accepted_tokens, p.num_draft_tokens)
                log(f"check 1 seed {seed} argmax: replayed {entry['replayed']['acceptance_rate']:.3f}, decoded "
                    f"{entry['decoded']['acceptance_rate']:.3f} {entry['decoded']['acceptance_rate_ci']}")
            else:
                row = next(x for x in r.replay["acceptance_by_k"] if x["k"] == args.k)
                sampled_rule[0] += row["expected_num_accepted_tokens"]
                sampled_rule[1] += row["expected_num_draft_tokens"]
                entry["expected_acceptance_rate"] = row["expected_acceptance_rate"]
            per_seed.append(entry)
    res = {"k": args.k, "temperature": 0.7, "top_p": 0.9, "seeds": args.seeds, "per_seed": per_seed,
           "expected_acceptance_rate_sampled_rule": sampled_rule[0] / sampled_rule[1] if sampled_rule[1] else math.nan}
    for which, (acc, dr) in pooled.items():
        ids = sorted(acc)
        res[f"{which}_num_prompts"] = len(ids)
        res[f"{which}_num_accepted_tokens"], res[f"{which}_num_draft_tokens"] = sum(acc.values()), sum(dr.values())
        res[f"{which}_acceptance_rate"] = sum(acc.values()) / sum(dr.values())
        res[f"{which}_acceptance_rate_ci"] = bootstrap_ratio_ci([acc[i] for i in ids], [dr[i] for i in ids],
                                                                n_resamples=args.resamples, seed=0)
    lo, hi = res["decoded_acceptance_rate_ci"]
    res["held"] = bool(lo <= res["replayed_acceptance_rate"] <= hi)
    return res


def greedy_grid(tgt, drafter, subset, args, cache, calibration) -> tuple[dict, list[dict]]:
    """Replayed (k, tau) grid on exact greedy counters: best_k_tau and every row's predicted speedup."""
    from specdec.core.config import SamplingConfig, SpeculativeConfig
    from specdec.core.inputs import stop_token_ids
    from specdec.validation.api import drafter_parts
    from specdec.validation.config import ValidationConfig
    from specdec.validation.continuation_cache import model_weights_hash
    from specdec.validation.prompt_run import context_limit
    from specdec.validation.provenance import eos_token_ids
    from specdec.validation.replay import replay_grid
    from specdec.validation.replay_curve import best_k_tau
    from specdec.validation.replay_run import replay_prompts
    from specdec.validation.speed import StepCounters, predicted_speedup

    model, tok = tgt.model, tgt.tokenizer
    obj, draft_model = drafter_parts(drafter)[:2]
    config = ValidationConfig(SpeculativeConfig(4, SamplingConfig(), args.max_new_tokens), limit=None)
    eos = eos_token_ids(tok, model)
    model.eval()
    replayed = replay_prompts(subset, model, tok, [obj], config, eos=eos, ctx_limit=context_limit(model, draft_model),
                              cache=cache,
                              target_weights=model_weights_hash(model, getattr(tgt, "path", None), cache.weights_memo),
                              kmax=8)
    ok = [rp for rp in replayed if rp.status == "ok"]
    traces, conts = [rp.drafters[0].trace for rp in ok], [rp.continuation for rp in ok]
    c, v = calibration.cost_ratios[0], calibration.verify_cost
    stop = stop_token_ids(eos)
    best = best_k_tau(traces, conts, range(1, 9), c, v, max_new_tokens=args.max_new_tokens, stop_token_ids=stop,
                      taus=TAUS)
    grid = replay_grid(traces, conts, range(1, 9), [None, *TAUS], max_new_tokens=args.max_new_tokens,
                       stop_token_ids=stop)
    rows = [{"k": k, "tau": tau, "acceptance_rate": s.acceptance_rate, "mean_accepted_length": s.mean_accepted_length,
             "predicted_speedup": predicted_speedup(StepCounters.from_stats(s), c, v)} for (k, tau), s in grid.items()]
    best["num_prompts_replayed"] = len(ok)
    return best, rows


def measure(tgt, drafter, subset, args, calibration, k: int, tau: float | None) -> dict:
    """validate at (k, tau), greedy: measured speedup with CI, predicted, exactness audit."""
    from specdec.core.config import SamplingConfig, SpeculativeConfig
    from specdec.validation.api import ValidationRequest, validate
    from specdec.validation.config import ValidationConfig

    spec = SpeculativeConfig(k, SamplingConfig(), args.max_new_tokens, assistant_confidence_threshold=tau)
    config = ValidationConfig(spec, seed=0, limit=None, bootstrap_resamples=args.resamples)
    t0 = time.perf_counter()
    [r] = validate(ValidationRequest(tgt, [drafter], subset, config, target_ref=args.target, calibration=calibration))
    g = r.overall
    out = {"k": k, "tau": tau, "speedup": g.speedup, "speedup_ci": list(g.speedup_ci),
           "predicted_speedup_from_decoded_counters": g.predicted_speedup, "acceptance_rate": g.acceptance_rate,
           "acceptance_rate_ci": list(g.acceptance_rate_ci), "mean_accepted_length": g.mean_accepted_length,
           "exactness_checked": g.exactness_checked, "exactness_mismatches": g.exactness_mismatches,
           "timing_suspect": getattr(g, "timing_suspect", None), "num_prompts": g.num_prompts,
           "seconds": time.perf_counter() - t0}
    log(f"check 2 measured k={k} tau={tau}: speedup {g.speedup:.3f} {out['speedup_ci']}, "
        f"exact {g.exactness_checked - g.exactness_mismatches}/{g.exactness_checked}")
    return out


def tau_check(tgt, drafter, subset, args, cache, calibration) -> dict:
    """Check 2: best fixed k vs best thresholded (k, tau), replayed then measured."""
    best, rows = greedy_grid(tgt, drafter, subset, args, cache, calibration)
    thresholded = max((r for r in rows if r["tau"] is not None), key=lambda r: r["predicted_speedup"])
    kf = best["best_fixed_k"]["num_speculative_tokens"]
    log(f"check 2 replayed: best fixed {best['best_fixed_k']}, best (k, tau) {best['best_k_tau']}, "
        f"best thresholded row k={thresholded['k']} tau={thresholded['tau']} {thresholded['predicted_speedup']:.3f}")
    fixed = measure(tgt, drafter, subset, args, calibration, kf, None)
    thr = measure(tgt, drafter, subset, args, calibration, thresholded["k"], thresholded["tau"])
    fixed["predicted_speedup_replayed"] = best["best_fixed_k"]["predicted_speedup"]
    thr["predicted_speedup_replayed"] = thresholded["predicted_speedup"]
    for m in (fixed, thr):
        m["measured_over_predicted"] = m["speedup"] / m["predicted_speedup_replayed"]
    return {"replayed": best, "grid": rows, "measured_fixed": fixed, "measured_k_tau": thr,
            "k_tau_beats_fixed_measured": thr["speedup"] > fixed["speedup"],
            "k_tau_beats_fixed_outside_ci": thr["speedup_ci"][0] > fixed["speedup_ci"][1],
            "all_greedy_outputs_exact": all(m["exactness_mismatches"] == 0 and m["exactness_checked"] > 0
                                            for m in (fixed, thr))}


def _ci(x) -> str:
    return f"[{x[0]:.3f}, {x[1]:.3f}]"


def render_md(out: dict) -> str:
    """A short markdown summary of the results dict :func:`main` writes."""
    cfg = out["config"]
    lines = [f"# Issue 21 on the real pair: argmax rule and (k, tau) ({out['created_at']})", "",
             f"Target `{cfg['target']}` (fp32), draft `{cfg['draft']}`, {len(out['prompt_ids'])} Spec-Bench prompts "
             f"(subset seed 0), {cfg['max_new_tokens']} new tokens, CPU `{out['cpu_model']}`, 1 torch thread under "
             f"`nice -n 19`, loadavg before {' '.join(out['loadavg_before'])}, after {' '.join(out['loadavg_after'])}. "
             f"Measured c = {out['cost_ratio']:.3f}. Wall {out['wall_seconds']:.0f} s.", ""]
    a = out.get("argmax_rule")
    if a:
        lines += [f"## 1. Argmax proposal rule, T = 0.7, top-p 0.9, k = {a['k']}, seeds {a['seeds']}", "",
                  f"- decoded acceptance (seeds pooled per prompt, bootstrap CI over {a['decoded_num_prompts']} prompts): "
                  f"{a['decoded_acceptance_rate']:.3f} {_ci(a['decoded_acceptance_rate_ci'])} "
                  f"({a['decoded_num_accepted_tokens']}/{a['decoded_num_draft_tokens']})",
                  f"- replayed acceptance (exact counters along target-only samples, same prompts and seeds): "
                  f"{a['replayed_acceptance_rate']:.3f} {_ci(a['replayed_acceptance_rate_ci'])} "
                  f"({a['replayed_num_accepted_tokens']}/{a['replayed_num_draft_tokens']})",
                  f"- sampled rule's expected acceptance (sum min(p, q)), contrast: "
                  f"{a['expected_acceptance_rate_sampled_rule']:.3f}",
                  f"- **replayed inside decoded CI: {a['held']}**", "", "| seed | replayed | decoded | decoded CI |",
                  "|---|---|---|---|"]
        for e in a["per_seed"]:
            if e["rule"] == "argmax":
                d = e["decoded"]
                lines.append(f"| {e['seed']} | {e['replayed']['acceptance_rate']:.3f} | {d['acceptance_rate']:.3f} | "
                             f"{_ci(d['acceptance_rate_ci'])} |")
        lines.append("")
    t = out.get("draft_length_policy")
    if t:
        r = t["replayed"]
        lines += ["## 2. Greedy draft-length policy, k = 1..8, tau in {0.3, 0.5, 0.8}", "",
                  f"- replayed best fixed k: {r['best_fixed_k']}", f"- replayed best (k, tau): {r['best_k_tau']}", "",
                  "| measured | k | tau | predicted (replay) | measured speedup | CI | measured/predicted | exact |",
                  "|---|---|---|---|---|---|---|---|"]
        for name in ("measured_fixed", "measured_k_tau"):
            m = t[name]
            lines.append(f"| {name.removeprefix('measured_')} | {m['k']} | {m['tau']} | {m['predicted_speedup_replayed']:.3f} "
                         f"| {m['speedup']:.3f} | {_ci(m['speedup_ci'])} | {m['measured_over_predicted']:.2f} "
                         f"| {m['exactness_checked'] - m['exactness_mismatches']}/{m['exactness_checked']} |")
        lines += ["", f"- (k, tau) beats best fixed k, measured: {t['k_tau_beats_fixed_measured']} "
                  f"(CIs separated: {t['k_tau_beats_fixed_outside_ci']})",
                  f"- every greedy output identical to target-only: {t['all_greedy_outputs_exact']}", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--draft", default="derived:bf16")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--k", type=int, default=4, help="k of the argmax check")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--resamples", type=int, default=2000)
    ap.add_argument("--checks", default="1,2")
    ap.add_argument("--render", type=Path, help="only re-write the .md of this results JSON")
    args = ap.parse_args()
    if args.render:
        args.render.with_suffix(".md").write_text(render_md(json.loads(args.render.read_text())))
        return
    args.seeds = [int(s) for s in args.seeds.split(",")]
    import torch

    from specdec.models import load_causal_lm
    from specdec.kinds import resolve_drafter
    from specdec.settings import model_store
    from specdec.validation.api import calibrate_on, drafter_parts
    from specdec.validation.continuation_cache import ContinuationCache
    from specdec.validation.heldout import load_heldout
    from specdec.validation.machine import cpu_model, load_average

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    tgt = load_causal_lm(args.target, dtype="float32", device="cpu", store=model_store())
    drafter = resolve_drafter(args.draft, tgt, store=model_store())
    subset = load_heldout("spec_bench").subset(args.limit, seed=0)
    log(f"loaded; {len(subset)} prompts; calibrating")
    calibration = calibrate_on(tgt.model, [drafter_parts(drafter)[1]], subset, tgt.tokenizer, 8, kmax=8)
    path = ROOT / "benchmarks" / "results" / f"{dt.date.today().isoformat()}-rule-tau-cpu.json"
    out = json.loads(path.read_text()) if path.exists() else {}  # a re-run of one check keeps the other's results
    out |= {"created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "config": vars(args),
           "cpu_model": cpu_model(), "torch_threads": 1, "loadavg_before": load_before,
           "prompt_ids": [p.id for p in subset.prompts],
           "cost_ratio": calibration.cost_ratios[0], "verify_cost_by_n": calibration.verify_cost.as_list()}
    checks = args.checks.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        cache = ContinuationCache(Path(tmp))
        for name, key, fn in (("1", "argmax_rule", argmax_check), ("2", "draft_length_policy", tau_check)):
            if name in checks:
                c0, l0 = time.perf_counter(), Path("/proc/loadavg").read_text().split()[:3]
                out[key] = fn(tgt, drafter, subset, args, cache, calibration)
                out[key] |= {"loadavg_before": l0, "loadavg_after": Path("/proc/loadavg").read_text().split()[:3],
                             "wall_seconds": time.perf_counter() - c0, "created_at": out["created_at"]}
                out["loadavg_after"] = Path("/proc/loadavg").read_text().split()[:3]
                out["load_average_1m_end"] = load_average()
                out["wall_seconds"] = time.perf_counter() - t0
                path.write_text(json.dumps(out, indent=2, default=str))  # partial results survive a cut run
                path.with_suffix(".md").write_text(render_md(out))
    log(f"wrote {path} in {out['wall_seconds']:.0f} s")


if __name__ == "__main__":
    main()
