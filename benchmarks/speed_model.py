"""The one speed model against measurement, per drafter, on SmolLM2 (fp32 target on the CPU).

For ngram, derived:bf16 and derived:int8 on one short Spec-Bench prompt per category:

1. one calibration (c per draft model, the target's v(n) for n = 1..8; specdec.validation.timing.calibrate);
2. one greedy replay for every k in 1..8 -> the predicted speedup at every k from the replayed counters
   (specdec.validation.speed.predicted_speedup) and the best fixed k;
3. decoding through the validation driver (specdec.validation.validate, method "decode": warm-up, target-only and
   speculative runs back to back per prompt, alternating order, paired per-prompt ratios, median, bootstrap CI,
   groups under load re-timed) at the best k (and ``--also-k``) -> measured speedup, the prediction from the decoded
   counters, their ratio P1 = measured / predicted, exactness (every greedy output identical);
4. the evidence for the bias of the old recommend timing: the ratio of pooled rates next to the paired
   median, the first prompt's target-only seconds per token against the others', and target-only wall
   seconds per token against the isolated one-token pass (the model's unit).

The machine is shared: the 1-minute load average is recorded before, during and after, with the CPU model.

    PYTHONPATH=. HF_HUB_OFFLINE=1 SPECDEC_MODELS_DIR=... python benchmarks/speed_model.py [--out PATH]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path
from specdec.settings import get_settings
from specdec.validation.continuation_cache import ContinuationCache
from specdec.validation.machine import cpu_model

DRAFTERS = ("ngram", "derived:bf16", "derived:int8")
KS = tuple(range(1, 9))


def _load() -> float:
    return os.getloadavg()[0]


def _decode(target, drafter, held, k: int, cal, j: int, max_new: int) -> dict:
    from specdec.validation.api import ValidationRequest, validate
    from specdec.validation.config import ValidationConfig

    t0 = time.perf_counter()
    cfg = ValidationConfig(num_speculative_tokens=k, max_new_tokens=max_new, seed=0, bootstrap_resamples=2000)
    rep = validate(ValidationRequest(target, [drafter], held, cfg,
                                     calibration=replace(cal, cost_ratios=[cal.cost_ratios[j]])))[0]
    g = rep.overall
    ok = [p for p in rep.prompts if p.status == "ok"]
    per_tok = [p.target_only_seconds / p.target_only_tokens for p in ok if p.target_only_tokens]
    return {
        "k": k, "measured_speedup": g.speedup, "measured_speedup_ci": g.speedup_ci,
        "measured_speedup_pooled_ratio_of_sums": g.speedup_pooled, "predicted_speedup": g.predicted_speedup,
        "p1_measured_over_predicted": g.measured_over_predicted, "timing_suspect": g.timing_suspect,
        "cost_ratio_used": g.predicted_cost_ratio, "cost_ratio_in_run": g.cost_ratio,
        "acceptance_rate": g.acceptance_rate, "mean_accepted_length": g.mean_accepted_length,
        "identical_outputs": g.exactness_checked - g.exactness_mismatches, "compared_outputs": g.exactness_checked,
        "num_remeasured": g.num_remeasured, "load_avg_1m": g.load_avg_1m, "load_avg_1m_max": g.load_avg_1m_max,
        "per_prompt": [{"id": p.prompt_id, "target_only_s": p.target_only_seconds, "speculative_s": p.speculative_seconds,
                        "tokens": p.target_only_tokens, "load_avg_1m": p.load_avg_1m} for p in ok],
        "target_only_s_per_token_first_prompt": per_tok[0] if per_tok else math.nan,
        "target_only_s_per_token_median_others": statistics.median(per_tok[1:]) if len(per_tok) > 1 else math.nan,
        "target_only_s_per_token_median": statistics.median(per_tok) if per_tok else math.nan,
        "seconds": time.perf_counter() - t0,
    }


def main() -> int:
    import torch

    from specdec.models import load_causal_lm
    from specdec.kinds import resolve_drafter
    from specdec.settings import model_store
    from specdec.validation.api import ValidationRequest, calibrate_on, drafter_parts, validate
    from specdec.validation.config import ValidationConfig
    from specdec.validation.heldout import load_heldout
    from specdec.validation.replay_curve import recommend_from_curve
    from specdec.validation.report import nan_to_none
    from specdec.validation.short_prompts import short_prompts

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path(f"benchmarks/results/{dt.date.today()}-speed-cpu.json"))
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: all CPUs; 1 on a crowded machine)")
    ap.add_argument("--also-k", type=int, nargs="*", default=[], help="decode at these k too (besides the best k)")
    args = ap.parse_args()
    t_start, loads = time.perf_counter(), [_load()]
    torch.set_num_threads(args.threads or max(1, os.cpu_count() or 1))
    target = load_causal_lm("smollm2", dtype="float32", device="cpu", store=model_store())
    held = short_prompts(load_heldout("spec_bench"), target.tokenizer, per_category=args.per_category,
                         max_prompt_tokens=192, seed=0)
    drafters = [resolve_drafter(s, target, store=model_store()) for s in DRAFTERS]
    cal = calibrate_on(target.model, [drafter_parts(d)[1] for d in drafters], held, target.tokenizer, max(KS), kmax=max(KS))
    loads.append(_load())
    cfg = ValidationConfig(num_speculative_tokens=4, max_new_tokens=args.max_new_tokens, seed=0)
    replays = validate(ValidationRequest(target, drafters, held, cfg, method="replay", kmax=max(KS), calibration=cal,
                                         cache=ContinuationCache.in_home(get_settings().home)))
    loads.append(_load())
    out = {"cpu": cpu_model(), "num_cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
           "prompts": [p.id for p in held.prompts], "max_new_tokens": args.max_new_tokens,
           "target_one_token_pass_ms": cal.target_step_s * 1e3, "verify_cost_measured": cal.raw_verify,
           "verify_cost_fitted": cal.verify_cost.as_list(), "drafters": {}}
    for j, (spec, d, rep) in enumerate(zip(DRAFTERS, drafters, replays)):
        c = cal.cost_ratios[j]
        rows = rep.replay["acceptance_by_k"]
        best = recommend_from_curve(rows, 0.0 if math.isnan(c) else c, cal.verify_cost)
        k_best = best["recommended_num_speculative_tokens"]
        entry = {"cost_ratio_calibrated": c, "best_fixed_k_predicted": k_best,
                 "predicted_speedup_at_best_k_replay": best["predicted_speedup_at_recommended"],
                 "replay_by_k": [{"k": r["k"], "acceptance_rate": r["acceptance_rate"],
                                  "predicted_speedup": r["predicted_speedup"]} for r in rows], "decoded": []}
        for k in dict.fromkeys([k_best, *args.also_k]):
            entry["decoded"].append(_decode(target, d, held, k, cal, j, args.max_new_tokens))
            loads.append(_load())
            print(spec, k, {x: entry["decoded"][-1][x] for x in ("measured_speedup", "predicted_speedup",
                                                                  "p1_measured_over_predicted", "identical_outputs")},
                  flush=True)
        out["drafters"][spec] = entry
    out["load_avg_1m_samples"] = loads
    out["load_note"] = ("shared 2-core machine: other helpers' jobs ran at the same time; target-only and speculative "
                        "runs are interleaved per prompt, so the paired ratios are somewhat robust to that load")
    out["seconds"] = time.perf_counter() - t_start
    out["date"] = str(dt.date.today())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(nan_to_none(out), indent=2, default=str))
    print("written", args.out, f"{out['seconds']:.0f}s", "loads", loads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
