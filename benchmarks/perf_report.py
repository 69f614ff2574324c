"""Summary, top-level P1/P2/P3/P5 and machine description of ``perf.py`` (outputs: :mod:`perf_document`).

Pure functions over the raw measurements collected by :mod:`perf_bench` (plain dicts), so the
summary can be rebuilt from a results file.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import subprocess
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from perf_speed import context_bucket, costs_for, pooled_speed, predicted_speed  # noqa: E402 (benchmarks/ is on sys.path)
from specdec.validation.machine import cpu_model

GOALS = {"p1": (">=", 0.9), "p2": (">=", 1.2), "p3": ("<=", 0.1), "p5": (">=", 3.0)}
ALPHA_TF_TOLERANCE = 0.03

DEFINITIONS = {
    "tok_s": "new tokens / wall seconds of one whole generation (prefill included; device synchronised before and after)",
    "medians": "over (prompt, repeat) runs; paired ratios are taken within one (prompt, repeat), whose runs are adjacent in time",
    "measured_speedup": "pooled ratio of token rates, (sum ours tokens / sum ours seconds) / (sum target-only tokens / "
                        "sum target-only seconds), over prompts and repeats (specdec.validation.speed.pooled_speedup, the "
                        "statistic validation and the nightly report)",
    "measured_speedup_ci": "95% percentile bootstrap over prompts (each prompt's runs summed over repeats, kept paired "
                           "with its target-only runs; specdec.validation.speed.bootstrap_speedup_ci, 2000 resamples, seed 0)",
    "measured_speedup_median_pair": "median over (prompt, repeat) of ours tok/s / target-only tok/s",
    "identical_outputs": "runs of ours whose token ids equal target-only's in the same (prompt, repeat), of compared_outputs",
    "per_category": "per Spec-Bench category: ours and HF pooled speedup vs target-only (+ ours CI)",
    "alpha_hat": "validation's alpha_hat (DecodingStats.alpha_hat): accepted / (accepted + steps that ended in a "
                 "rejection), the MLE of Leviathan's i.i.d. acceptance, each step censored at its proposal length (steps "
                 "fully accepted or ended by an accepted EOS contribute no rejection); cross-checked against per-step "
                 "(proposed, accepted) recorded by a delegating drafter wrapper",
    "alpha_pos0": "position-0 acceptance accepted_per_position[0] / num_drafts (validation's alpha_hat until 2026-11-29; "
                  "biased low when acceptances cluster)",
    "calibration": "the speed model's costs, measured as validation measures them (specdec.validation.timing.calibrate: "
                   "isolated passes with a warm KV cache, interleaved rounds, medians; v(n) fitted monotone) at two contexts: "
                   "the median prompt of the short (<= 400 tokens) and of the long prompts, plus half the new tokens",
    "c_hat": "c at the short-context calibration: draft one-token pass / target one-token pass (n-gram: one propose() call)",
    "verify_cost_ratio": "v(k) at the short-context calibration: target pass over k+1 tokens / one-token pass",
    "predicted_speedup": "the product's one speed model (specdec.validation.speed.predicted_speedup) per prompt: the counters "
                         "our run took on that prompt (StepCounters.from_steps over the steps after the prefill step) with c "
                         "and v(n) calibrated at that prompt's context (short/long); the prefill, which the model leaves out, "
                         "is the target-only run's first pass (forward hooks) on both sides; pooled over (prompt, repeat) as "
                         "measured_speedup is",
    "leviathan_closed_form": "Leviathan et al. 2022 Thm 3.8 at alpha_hat, c_hat and k: the special case of the one model with "
                             "i.i.d. counters and v = 1; reference only, not used by P1",
    "p1": "measured_speedup / predicted_speedup (overall, by_context and per_category)",
    "p2": "median of ours tok/s / HF tok/s over (prompt, repeat) pairs at the same k whose token ids are identical",
    "p3": "validation's teacher-forced time (specdec.validation.teacher_forcing: target_teacher_forcing + draft_agreement: the target's and the drafter's "
          "one forward pass over prompt + the target's continuation, and the agreement sums) / speculative-decoding "
          "time on the same prompts; per prompt the median over repeats, then sums over prompts. The continuation is "
          "the target-only output that validation generates anyway; p3_vs_decoding_validation also counts that "
          "target-only run in the denominator",
    "p5": "batch-B tok/s / batch-1 tok/s of our speculative decoding on the same B prompts (B = largest batch size), "
          "median over repeats",
}
TOP_LEVEL_RULES = {
    "representative_drafter": "the drafter with the highest measured speedup",
    "p1": "P1 of the representative drafter",
    "p2": "median over the identical-output pairs of all drafters pooled (an implementation comparison; per drafter in drafters.*.p2)",
    "p3": "P3 of the representative drafter (per drafter in drafters.*.p3)",
    "p5": "P5 of the representative drafter at the largest batch size",
}


# ------------------------------------------------------------------------------------------ utils
def is_nan(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def med(xs) -> float:
    xs = [x for x in xs if not is_nan(x)]
    return statistics.median(xs) if xs else math.nan


def ratio(a, b) -> float:
    return a / b if b and not is_nan(a) and not is_nan(b) else math.nan


def clean(o):
    """NaN/inf -> None, recursively (strict JSON)."""
    if isinstance(o, float):
        return None if math.isnan(o) or math.isinf(o) else o
    if isinstance(o, dict):
        return {str(k): clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [clean(v) for v in o]
    return o


def atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


# ------------------------------------------------------------------------------------------ machine
def machine(device: str) -> dict:
    """Platform, CPU model, cores, memory, library versions, torch threads, GPU (if any), load average."""
    import torch
    import transformers

    cpu = cpu_model()
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    try:
        from importlib.metadata import version

        torchao = version("torchao")
    except Exception:  # noqa: BLE001
        torchao = None
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=5).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--", "specdec"], cwd=Path(__file__).parent,
                                    capture_output=True, text=True, timeout=5).stdout.strip())
    except Exception:  # noqa: BLE001
        sha, dirty = None, None
    m = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "cpus_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_gib": mem,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torchao": torchao,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "device": device,
        "git_commit": sha,
        "specdec_dirty": dirty,
        "loadavg_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
    if torch.cuda.is_available():
        m["gpu"] = torch.cuda.get_device_name(0)
        m["cuda"] = torch.version.cuda
    return m


# ------------------------------------------------------------------------------------------ summary
def _alpha(stats: dict | None, steps: dict | None) -> dict:
    out = {"alpha_hat": math.nan, "alpha_pos0": math.nan, "acceptance_rate": math.nan, "mean_accepted_length": math.nan,
           "draft_tokens_per_step": math.nan, "num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}
    if not stats:
        return out
    nd = stats["num_drafts"]
    out.update(num_drafts=nd, num_draft_tokens=stats["num_draft_tokens"], num_accepted_tokens=stats["num_accepted_tokens"],
               accepted_per_position=stats["accepted_per_position"], drafted_per_position=stats["drafted_per_position"])
    if nd:
        out["alpha_pos0"] = stats["accepted_per_position"][0] / nd
        out["mean_accepted_length"] = 1 + stats["num_accepted_tokens"] / nd
        out["draft_tokens_per_step"] = stats["num_draft_tokens"] / nd
    out["acceptance_rate"] = ratio(stats["num_accepted_tokens"], stats["num_draft_tokens"])
    if "num_rejected_steps" in stats:
        acc, rej = stats["num_accepted_tokens"], stats["num_rejected_steps"]
        out["alpha_hat"] = ratio(acc, acc + rej)
        out["steps_with_rejection"] = rej
    if steps and steps.get("recorded") and steps["steps"]:
        acc, rej = steps["accepted"], steps["rejections"]
        if "num_rejected_steps" in stats:
            out["alpha_hat_cross_check"] = "ok" if (acc, rej) == (stats["num_accepted_tokens"], stats["num_rejected_steps"]) \
                else f"MISMATCH: wrapper {acc}/{rej}, DecodingStats {stats['num_accepted_tokens']}/{stats['num_rejected_steps']}"
        else:
            out["alpha_hat"] = ratio(acc, acc + rej)
            out["steps_with_rejection"] = rej
    return out


def leviathan_closed_form(alpha: float, c: float, k: int) -> float:
    """Leviathan et al. 2022 Thm 3.8, ``(1 - a^(k+1)) / ((1 - a)(c k + 1))``: a documented special case of the one
    speed model (specdec.validation.speed.predicted_speedup on ``StepCounters.iid(a, k)`` with ``VerifyCost.unit()``:
    i.i.d. acceptance, free verification). Reported for reference only; no P1 uses it."""
    from specdec.validation.speed import StepCounters, VerifyCost, predicted_speedup

    if is_nan(alpha) or is_nan(c):
        return math.nan
    return predicted_speedup(StepCounters.iid(alpha, k), c, VerifyCost.unit())


def recommend_num_speculative_tokens(alpha: float, calibration: dict, spec: str) -> tuple[int | None, float]:
    """Best k by the one speed model with the short-context calibrated c and v(n), on i.i.d. counters at
    alpha_hat for k = 1..v's largest measured n (the basis validation labels ``IID_BASIS``)."""
    from specdec.validation.speed import StepCounters, best_k

    c, v = costs_for(calibration, "short", spec)
    if v is None or is_nan(alpha) or is_nan(c):
        return None, math.nan
    return best_k({k: StepCounters.iid(alpha, k) for k in range(1, v.n_max + 1)}, c, v)


def _prediction(d: dict, target_rows: list[dict], ours_rows: list[dict], calibration: dict, spec: str, k: int) -> None:
    """Fill the predicted speedup (the product's one speed model, :func:`perf_speed.predicted_speed`), P1 overall,
    per context and per category, the calibrated costs and the reference closed form."""
    pr = predicted_speed(target_rows, ours_rows, calibration, spec)
    d["predicted_speedup"], d["predicted_by_prompt"] = pr["predicted_speedup"], pr["predicted_by_prompt"]
    d["p1"] = ratio(d["measured_speedup"], d["predicted_speedup"])
    d["by_context"] = {}
    for bucket in ("short", "long"):
        rows = [r for r in ours_rows if context_bucket(r["prompt_tokens"]) == bucket]
        if rows:
            m = pooled_speed(target_rows, rows)["measured_speedup"]
            p = predicted_speed(target_rows, rows, calibration, spec)["predicted_speedup"]
            c, v = costs_for(calibration, bucket, spec)
            d["by_context"][bucket] = {"measured_speedup": m, "predicted_speedup": p, "p1": ratio(m, p), "c": c,
                                       "verify_cost": v.as_list() if v else None, "runs": len(rows)}
    for cat, pc in d["per_category"].items():
        rows = [r for r in ours_rows if r.get("category") == cat]
        pc["predicted_speedup"] = predicted_speed(target_rows, rows, calibration, spec)["predicted_speedup"]
        pc["p1"] = ratio(pc["ours"]["measured_speedup"], pc["predicted_speedup"])
    c, v = costs_for(calibration, "short", spec)
    d["c_hat"], d["verify_cost_ratio"] = c, (v(k) if v is not None else math.nan)
    d["leviathan_closed_form"] = leviathan_closed_form(d["alpha_hat"], c, k)
    d["recommended_k_predicted"], d["predicted_speedup_at_recommended_k"] = recommend_num_speculative_tokens(
        d["alpha_hat"], calibration, spec)


def _ours_over_hf(ours_rows: list[dict], hf_rows: list[dict]) -> dict:
    """Ours / HF assisted generation over the (prompt, repeat) pairs whose outputs are identical: the pooled ratio
    of token rates with the paired bootstrap CI over prompts (:func:`perf_speed.pooled_speed`, HF as the reference)."""
    same = [h for h in hf_rows if h.get("identical_to_ours")]
    keys = {(h["prompt_id"], h["repeat"]) for h in same}
    out = pooled_speed(same, [o for o in ours_rows if (o["prompt_id"], o["repeat"]) in keys])
    return {"ratio": out["measured_speedup"], "ci": out["measured_speedup_ci"], "prompts": out["prompts"],
            "pairs": len(same)}


def summarise(raw: dict, args, kinds: dict) -> dict:
    """Per-drafter tables, best k, P5 and the top-level numbers (see :data:`DEFINITIONS`)."""

    k = args.k
    groups: dict[tuple, dict] = defaultdict(dict)
    for row in raw["main"]:
        groups[(row["prompt_id"], row["repeat"])][(row["method"], row["drafter"])] = row
    target_rows = [g[("target_only", None)] for g in groups.values() if ("target_only", None) in g]
    drafters: dict[str, dict] = {}
    pooled_p2: list[float] = []
    for s in raw.get("drafters", {}):
        ours_rows, hf_rows, sp, hf_sp, p2r = [], [], [], [], []
        for g in groups.values():
            t, o, h = g.get(("target_only", None)), g.get(("ours", s)), g.get(("hf", s))
            if o:
                ours_rows.append(o)
                if t:
                    sp.append(ratio(o["tok_s"], t["tok_s"]))
            if h:
                hf_rows.append(h)
                if t:
                    hf_sp.append(ratio(h["tok_s"], t["tok_s"]))
                if o and h.get("identical_to_ours"):
                    p2r.append(ratio(o["tok_s"], h["tok_s"]))
        pooled_p2 += p2r
        d: dict[str, Any] = {"kind": kinds.get(s, raw["drafters"][s].get("kind")), "k": k, "runs": len(ours_rows)}
        d["tok_s"] = {"target_only": med(r["tok_s"] for r in target_rows), "ours": med(r["tok_s"] for r in ours_rows),
                      "hf": med(r["tok_s"] for r in hf_rows)}
        d["measured_speedup_median_pair"] = med(sp)
        d.update(pooled_speed(target_rows, ours_rows))
        d["measured_speedup_ratio_of_medians"] = ratio(d["tok_s"]["ours"], d["tok_s"]["target_only"])
        d["hf_speedup"] = pooled_speed(target_rows, hf_rows)["measured_speedup"] if hf_rows else math.nan
        d["hf_speedup_median_pair"] = med(hf_sp)
        d["identical_outputs"] = sum(bool(r["identical_to_target_only"]) for r in ours_rows)
        d["compared_outputs"] = len(ours_rows)
        d["per_category"] = {
            cat: {"ours": pooled_speed(target_rows, [r for r in ours_rows if r.get("category") == cat]),
                  "hf": (pooled_speed(target_rows, [r for r in hf_rows if r.get("category") == cat])["measured_speedup"]
                         if hf_rows else math.nan)}
            for cat in sorted({r.get("category") for r in ours_rows if r.get("category")})}
        d["identical"] = {
            "ours_vs_target_only": f"{sum(r['identical_to_target_only'] for r in ours_rows)}/{len(ours_rows)}",
            "hf_vs_target_only": f"{sum(r['identical_to_target_only'] for r in hf_rows)}/{len(hf_rows)}",
            "ours_vs_hf": f"{sum(bool(r.get('identical_to_ours')) for r in hf_rows)}/{len(hf_rows)}",
        }
        d["ours_over_hf"] = _ours_over_hf(ours_rows, hf_rows)
        for cat, pc in d["per_category"].items():
            pc["ours_over_hf"] = _ours_over_hf([r for r in ours_rows if r.get("category") == cat],
                                               [r for r in hf_rows if r.get("category") == cat])
        d["p2"] = med(p2r)
        d["p2_pairs"] = len(p2r)
        d["p2_ratio_all_pairs"] = med(ratio(g[("ours", s)]["tok_s"], g[("hf", s)]["tok_s"]) for g in groups.values()
                                      if ("ours", s) in g and ("hf", s) in g)
        d.update(_alpha(raw["stats"].get(s), raw["steps"].get(s)))
        _prediction(d, target_rows, ours_rows, raw.get("calibration") or {}, s, k)
        # P3
        tf = [r for r in raw["tf"] if r["drafter"] == s]
        if tf:
            by_p: dict[str, list] = defaultdict(list)
            for r in tf:
                by_p[r["prompt_id"]].append(r["target_tf_s"] + r["draft_tf_s"])
            spec_s = defaultdict(list)
            ref_s = defaultdict(list)
            for r in ours_rows:
                spec_s[r["prompt_id"]].append(r["seconds"])
            for r in target_rows:
                ref_s[r["prompt_id"]].append(r["seconds"])
            pids = [p for p in by_p if p in spec_s]
            tf_sum = sum(med(by_p[p]) for p in pids)
            spec_sum = sum(med(spec_s[p]) for p in pids)
            ref_sum = sum(med(ref_s[p]) for p in pids if p in ref_s)
            d["tf_seconds"], d["speculative_seconds"], d["target_only_seconds"] = tf_sum, spec_sum, ref_sum
            d["p3"] = ratio(tf_sum, spec_sum)
            d["p3_vs_decoding_validation"] = ratio(tf_sum, spec_sum + ref_sum)
            d["tf_target_share"] = ratio(sum(med([r["target_tf_s"] for r in tf if r["prompt_id"] == p]) for p in pids), tf_sum)
        ag = raw["agree"].get(s)
        if ag and ag["positions"]:
            d["alpha_tf"] = ag["alpha"] / ag["positions"]
            d["top1_agreement"] = ag["top1"] / ag["positions"]
            d["tf_coverage"] = ratio(ag["positions"], ag.get("continuation_tokens"))
            d["abs_alpha_tf_minus_alpha_hat"] = abs(d["alpha_tf"] - d["alpha_hat"]) if not is_nan(d["alpha_hat"]) else math.nan
            d["abs_alpha_tf_minus_alpha_pos0"] = abs(d["alpha_tf"] - d["alpha_pos0"]) if not is_nan(d["alpha_pos0"]) else math.nan
        d["hf_audit"] = raw["hf_audit"].get(s)
        drafters[s] = d

    best = [(s, d["measured_speedup"]) for s, d in drafters.items() if not is_nan(d["measured_speedup"])]
    rep_s = max(best, key=lambda x: x[1])[0] if best else None
    top: dict[str, Any] = {"representative_drafter": rep_s}
    if rep_s is None:
        for key in ("p1", "p3"):
            top[key], top[f"{key}_reason"] = None, "no drafter has a measured speedup"
    else:
        d = drafters[rep_s]
        top["p1"] = d["p1"]
        if is_nan(d["p1"]):
            top["p1_reason"] = "predicted speedup unavailable (alpha_hat or c_hat missing)"
        top["p3"] = d.get("p3", math.nan)
        if is_nan(top["p3"]):
            top["p3_reason"] = "teacher-forced timing not run (--no-tf) or no prompt"
        top["p3_abs_alpha_tf_minus_alpha_hat"] = d.get("abs_alpha_tf_minus_alpha_hat", math.nan)
        top["p3_abs_alpha_tf_minus_alpha_pos0"] = d.get("abs_alpha_tf_minus_alpha_pos0", math.nan)
    top["p2"] = med(pooled_p2)
    top["p2_pairs"] = len(pooled_p2)
    if is_nan(top["p2"]):
        top["p2_reason"] = ("HF assisted generation was skipped (--no-hf)" if args.no_hf
                            else "no (prompt, repeat) pair where our output and HF's are identical")

    p5 = _p5(raw.get("p5") or {})
    top["p5"] = math.nan
    if rep_s and rep_s in p5 and not is_nan(p5[rep_s].get("p5")):
        top["p5"] = p5[rep_s]["p5"]
    else:
        vals = [v for v in p5.values() if isinstance(v, dict) and not is_nan(v.get("p5"))]
        if vals:
            top["p5"] = vals[0]["p5"]
            top["p5_note"] = "representative drafter not measured; value from " + next(s for s, v in p5.items() if v is vals[0])
        else:
            errs = [v.get("error") for v in p5.values() if isinstance(v, dict) and v.get("error")]
            top["p5_reason"] = errs[0] if errs else (raw.get("p5", {}).get("error") or "P5 not measured")
    goals = {}
    for key, (op, thr) in GOALS.items():
        v = top.get(key)
        goals[key] = None if is_nan(v) else (v >= thr if op == ">=" else v <= thr)
    if goals.get("p3") is not None:
        dd = top.get("p3_abs_alpha_tf_minus_alpha_hat")
        goals["p3"] = bool(goals["p3"] and not is_nan(dd) and dd <= ALPHA_TF_TOLERANCE)
    top["goals_met"] = goals
    return {"top": top, "drafters": drafters, "best_k": _best_k(raw, drafters, args), "p5": p5,
            "per_prompt": _per_prompt(raw)}


def _p5(raw_p5: dict) -> dict:
    out = {}
    for s, per_b in raw_p5.items():
        if s == "error" or not isinstance(per_b, dict):
            continue
        res: dict[str, Any] = {"by_batch_size": {}}
        for b, v in per_b.items():
            if "error" in v:
                res["by_batch_size"][b] = {"error": v["error"]}
                res.setdefault("error", v["error"])
                continue
            reps = v["repeats"]
            res["by_batch_size"][b] = {
                "batch_tok_s": med(r["batch_tok_s"] for r in reps), "batch1_tok_s": med(r["single_tok_s"] for r in reps),
                "ratio": med(ratio(r["batch_tok_s"], r["single_tok_s"]) for r in reps),
                "rows_identical_to_batch1": f"{sum(r['rows_identical_to_batch1'] or 0 for r in reps)}/{sum(r['rows'] for r in reps)}",
            }
        ok = [int(b) for b, v in res["by_batch_size"].items() if "ratio" in v]
        if ok:
            res["p5_batch_size"] = max(ok)
            res["p5"] = res["by_batch_size"][str(max(ok))]["ratio"]
        out[s] = res
    return out


def _best_k(raw: dict, drafters: dict, args) -> dict:
    rows = raw.get("k_sweep") or []
    if not rows:
        return {}
    ref = {(r["prompt_id"], r["repeat"]): r for r in rows if r["method"] == "target_only"}
    out = {}
    for s, d in drafters.items():
        per_k = {}
        for k in args.k_values:
            rr = [r for r in rows if r["drafter"] == s and r["k"] == k]
            if not rr:
                continue
            a = _alpha(raw["stats"].get(f"{s}@k={k}"), raw["steps"].get(f"{s}@k={k}"))
            per_k[str(k)] = {
                "tok_s": med(r["tok_s"] for r in rr),
                "measured_speedup": med(ratio(r["tok_s"], ref[(r["prompt_id"], r["repeat"])]["tok_s"]) for r in rr
                                        if (r["prompt_id"], r["repeat"]) in ref),
                "alpha_hat": a["alpha_hat"], "alpha_pos0": a["alpha_pos0"], "mean_accepted_length": a["mean_accepted_length"],
                "predicted_speedup": predicted_speed([r for r in ref.values()], [r for r in rr], raw.get("calibration") or {},
                                                     s)["predicted_speedup"],
                "identical_to_target_only": f"{sum(r['identical_to_target_only'] for r in rr)}/{len(rr)}",
            }
        if not per_k:
            continue
        best_meas = max(per_k, key=lambda kk: -math.inf if is_nan(per_k[kk]["tok_s"]) else per_k[kk]["tok_s"])
        finite = [kk for kk in per_k if not is_nan(per_k[kk]["predicted_speedup"])]
        out[s] = {
            "target_only_tok_s": med(r["tok_s"] for r in ref.values()),
            "by_k": per_k,
            "best_k_measured": int(best_meas),
            "best_k_predicted_in_sweep": int(max(finite, key=lambda kk: per_k[kk]["predicted_speedup"])) if finite else None,
            "best_k_predicted_iid": d.get("recommended_k_predicted"),
            "prompts": len({r["prompt_id"] for r in rows}),
        }
    return out


def _per_prompt(raw: dict) -> list[dict]:
    """Per prompt and drafter: tok/s medians and whether the outputs were identical in every repeat."""
    by: dict[str, dict] = {}
    for r in raw["main"]:
        p = by.setdefault(r["prompt_id"], {"prompt_id": r["prompt_id"], "category": r["category"],
                                          "prompt_tokens": r["prompt_tokens"], "_t": [], "drafters": {}})
        if r["method"] == "target_only":
            p["_t"].append(r)
            continue
        d = p["drafters"].setdefault(r["drafter"], {"_o": [], "_h": []})
        d["_o" if r["method"] == "ours" else "_h"].append(r)
    out = []
    for p in by.values():
        t = p.pop("_t")
        p["target_only_tok_s"] = med(r["tok_s"] for r in t)
        p["target_only_new_tokens"] = t[0]["new_tokens"] if t else None
        p["target_only_finish"] = t[0]["finish"] if t else None
        for s, d in p["drafters"].items():
            o, h = d.pop("_o"), d.pop("_h")
            d["ours_tok_s"] = med(r["tok_s"] for r in o)
            d["hf_tok_s"] = med(r["tok_s"] for r in h) if h else None
            d["ours_identical_to_target_only"] = all(r["identical_to_target_only"] for r in o) if o else None
            d["hf_identical_to_target_only"] = all(r["identical_to_target_only"] for r in h) if h else None
            d["ours_identical_to_hf"] = all(r.get("identical_to_ours") for r in h) if h else None
            div = [r["first_divergence_vs_ours"] for r in h if r.get("first_divergence_vs_ours") is not None]
            d["first_divergence_ours_vs_hf"] = div[0] if div else None
            div = [r["first_divergence_vs_target_only"] for r in o + h if r.get("first_divergence_vs_target_only") is not None]
            d["first_divergence_vs_target_only"] = div[0] if div else None
            if o:
                d["acceptance_rate"] = ratio(o[0].get("num_accepted_tokens", 0), o[0].get("num_draft_tokens", 0))
        out.append(p)
    return out




