"""Summary, top-level P1/P2/P3/P5, machine description and the JSON + markdown outputs of ``perf.py``.

Pure functions over the raw measurements collected by :mod:`perf_bench` (plain dicts), so the
summary can be rebuilt from a results file.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

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
    "c_hat": "median wall time of one draft pass (1 token, warm KV cache; for ngram one propose() call) / median wall "
             "time of one 1-token target pass (warm KV cache), measured in isolation on the same device",
    "verify_cost_ratio": "median (k+1)-token target pass / median 1-token target pass",
    "predicted_speedup": "Leviathan et al. 2022 Thm 3.8: (1 - a^(k+1)) / ((1 - a)(c k + 1)) with a = alpha_hat, c = c_hat "
                         "(specdec.validation.metrics.predicted_speedup)",
    "p1": "measured_speedup / predicted_speedup(alpha_hat)",
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
def _nan(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def med(xs) -> float:
    xs = [x for x in xs if not _nan(x)]
    return statistics.median(xs) if xs else math.nan


def ratio(a, b) -> float:
    return a / b if b and not _nan(a) and not _nan(b) else math.nan


def clean(o):
    """NaN/inf -> None, recursively (strict JSON)."""
    if isinstance(o, float):
        return None if math.isnan(o) or math.isinf(o) else o
    if isinstance(o, dict):
        return {str(k): clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [clean(v) for v in o]
    return o


def _atomic_write(path: Path, text: str) -> None:
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
def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (``platform.processor()`` where that is unreadable)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


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


def _predict(alpha: float, c: float, k: int, v: float = math.nan) -> dict:
    from specdec.validation.metrics import expected_tokens_per_step, predicted_speedup

    if _nan(alpha) or _nan(c):
        return {"predicted_speedup": math.nan, "predicted_speedup_with_v": math.nan}
    e = expected_tokens_per_step(alpha, k)
    return {"predicted_speedup": predicted_speedup(alpha, c, k),
            "predicted_speedup_with_v": e / (c * k + v) if not _nan(v) else math.nan,
            "expected_tokens_per_step": e}


def summarise(raw: dict, args, kinds: dict) -> dict:
    """Per-drafter tables, best k, P5 and the top-level numbers (see :data:`DEFINITIONS`)."""
    from specdec.validation.metrics import recommend_num_speculative_tokens

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
        d.update(_pooled_speed(target_rows, ours_rows))
        d["measured_speedup_ratio_of_medians"] = ratio(d["tok_s"]["ours"], d["tok_s"]["target_only"])
        d["hf_speedup"] = _pooled_speed(target_rows, hf_rows)["measured_speedup"] if hf_rows else math.nan
        d["hf_speedup_median_pair"] = med(hf_sp)
        d["identical_outputs"] = sum(bool(r["identical_to_target_only"]) for r in ours_rows)
        d["compared_outputs"] = len(ours_rows)
        d["per_category"] = {
            cat: {"ours": _pooled_speed(target_rows, [r for r in ours_rows if r.get("category") == cat]),
                  "hf": (_pooled_speed(target_rows, [r for r in hf_rows if r.get("category") == cat])["measured_speedup"]
                         if hf_rows else math.nan)}
            for cat in sorted({r.get("category") for r in ours_rows if r.get("category")})}
        d["identical"] = {
            "ours_vs_target_only": f"{sum(r['identical_to_target_only'] for r in ours_rows)}/{len(ours_rows)}",
            "hf_vs_target_only": f"{sum(r['identical_to_target_only'] for r in hf_rows)}/{len(hf_rows)}",
            "ours_vs_hf": f"{sum(bool(r.get('identical_to_ours')) for r in hf_rows)}/{len(hf_rows)}",
        }
        d["p2"] = med(p2r)
        d["p2_pairs"] = len(p2r)
        d["p2_ratio_all_pairs"] = med(ratio(g[("ours", s)]["tok_s"], g[("hf", s)]["tok_s"]) for g in groups.values()
                                      if ("ours", s) in g and ("hf", s) in g)
        d.update(_alpha(raw["stats"].get(s), raw["steps"].get(s)))
        cost = raw["costs"].get(s) or {}
        d["c_hat"], d["verify_cost_ratio"] = cost.get("c_hat", math.nan), cost.get("verify_cost_ratio", math.nan)
        pr = _predict(d["alpha_hat"], d["c_hat"], k, d["verify_cost_ratio"])
        d.update(pr)
        d["predicted_speedup_alpha_pos0"] = _predict(d["alpha_pos0"], d["c_hat"], k)["predicted_speedup"]
        d["p1"] = ratio(d["measured_speedup"], d["predicted_speedup"])
        d["p1_alpha_pos0"] = ratio(d["measured_speedup"], d["predicted_speedup_alpha_pos0"])
        d["p1_with_v"] = ratio(d["measured_speedup"], d["predicted_speedup_with_v"])
        d["recommended_k_predicted"], d["predicted_speedup_at_recommended_k"] = (
            recommend_num_speculative_tokens(d["alpha_hat"], d["c_hat"]) if not (_nan(d["alpha_hat"]) or _nan(d["c_hat"])) else (None, math.nan))
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
            d["abs_alpha_tf_minus_alpha_hat"] = abs(d["alpha_tf"] - d["alpha_hat"]) if not _nan(d["alpha_hat"]) else math.nan
            d["abs_alpha_tf_minus_alpha_pos0"] = abs(d["alpha_tf"] - d["alpha_pos0"]) if not _nan(d["alpha_pos0"]) else math.nan
        d["hf_audit"] = raw["hf_audit"].get(s)
        drafters[s] = d

    best = [(s, d["measured_speedup"]) for s, d in drafters.items() if not _nan(d["measured_speedup"])]
    rep_s = max(best, key=lambda x: x[1])[0] if best else None
    top: dict[str, Any] = {"representative_drafter": rep_s}
    if rep_s is None:
        for key in ("p1", "p3"):
            top[key], top[f"{key}_reason"] = None, "no drafter has a measured speedup"
    else:
        d = drafters[rep_s]
        top["p1"] = d["p1"]
        if _nan(d["p1"]):
            top["p1_reason"] = "predicted speedup unavailable (alpha_hat or c_hat missing)"
        top["p3"] = d.get("p3", math.nan)
        if _nan(top["p3"]):
            top["p3_reason"] = "teacher-forced timing not run (--no-tf) or no prompt"
        top["p3_abs_alpha_tf_minus_alpha_hat"] = d.get("abs_alpha_tf_minus_alpha_hat", math.nan)
        top["p3_abs_alpha_tf_minus_alpha_pos0"] = d.get("abs_alpha_tf_minus_alpha_pos0", math.nan)
    top["p2"] = med(pooled_p2)
    top["p2_pairs"] = len(pooled_p2)
    if _nan(top["p2"]):
        top["p2_reason"] = ("HF assisted generation was skipped (--no-hf)" if args.no_hf
                            else "no (prompt, repeat) pair where our output and HF's are identical")

    p5 = _p5(raw.get("p5") or {})
    top["p5"] = math.nan
    if rep_s and rep_s in p5 and not _nan(p5[rep_s].get("p5")):
        top["p5"] = p5[rep_s]["p5"]
    else:
        vals = [v for v in p5.values() if isinstance(v, dict) and not _nan(v.get("p5"))]
        if vals:
            top["p5"] = vals[0]["p5"]
            top["p5_note"] = "representative drafter not measured; value from " + next(s for s, v in p5.items() if v is vals[0])
        else:
            errs = [v.get("error") for v in p5.values() if isinstance(v, dict) and v.get("error")]
            top["p5_reason"] = errs[0] if errs else (raw.get("p5", {}).get("error") or "P5 not measured")
    goals = {}
    for key, (op, thr) in GOALS.items():
        v = top.get(key)
        goals[key] = None if _nan(v) else (v >= thr if op == ">=" else v <= thr)
    if goals.get("p3") is not None:
        dd = top.get("p3_abs_alpha_tf_minus_alpha_hat")
        goals["p3"] = bool(goals["p3"] and not _nan(dd) and dd <= ALPHA_TF_TOLERANCE)
    top["goals_met"] = goals
    return {"top": top, "drafters": drafters, "best_k": _best_k(raw, drafters, args), "p5": p5,
            "per_prompt": _per_prompt(raw)}


def _pooled_speed(target_rows: list[dict], rows: list[dict]) -> dict:
    """Pooled speedup of ``rows`` over the target-only runs of the same (prompt, repeat), with the
    paired bootstrap CI over prompts (runs of one prompt summed over repeats)."""
    from specdec.validation.speed import bootstrap_speedup_ci, pooled_speedup

    ref = {(r["prompt_id"], r["repeat"]): r for r in target_rows}
    per: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for r in rows:
        t = ref.get((r["prompt_id"], r["repeat"]))
        if t is None:
            continue
        acc = per[r["prompt_id"]]
        acc[0] += t["new_tokens"]
        acc[1] += t["seconds"]
        acc[2] += r["new_tokens"]
        acc[3] += r["seconds"]
    cols = list(zip(*per.values())) if per else [[], [], [], []]
    return {"measured_speedup": pooled_speedup(*cols), "measured_speedup_ci": bootstrap_speedup_ci(*cols),
            "prompts": len(per)}


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
                "predicted_speedup": _predict(a["alpha_hat"], d.get("c_hat", math.nan), k)["predicted_speedup"],
                "identical_to_target_only": f"{sum(r['identical_to_target_only'] for r in rr)}/{len(rr)}",
            }
        if not per_k:
            continue
        best_meas = max(per_k, key=lambda kk: -math.inf if _nan(per_k[kk]["tok_s"]) else per_k[kk]["tok_s"])
        finite = [kk for kk in per_k if not _nan(per_k[kk]["predicted_speedup"])]
        out[s] = {
            "target_only_tok_s": med(r["tok_s"] for r in ref.values()),
            "by_k": per_k,
            "best_k_measured": int(best_meas),
            "best_k_predicted_in_sweep": int(max(finite, key=lambda kk: per_k[kk]["predicted_speedup"])) if finite else None,
            "best_k_predicted_1_to_16": d.get("recommended_k_predicted"),
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


# ------------------------------------------------------------------------------------------ document + markdown
def document(args, machine_desc: dict, raw: dict, summary: dict, started_at, complete: bool, wall: float, note) -> dict:
    from perf_methods import HF_NEUTRAL

    top = summary["top"]
    cfg = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    doc = {
        "schema": "specdec-perf/1",
        "p1": top.get("p1"), "p2": top.get("p2"), "p3": top.get("p3"), "p5": top.get("p5"),
        **{f"{k}_reason": top[f"{k}_reason"] for k in ("p1", "p2", "p3", "p5") if top.get(f"{k}_reason")},
        "complete": complete,
        "note": note,
        "created_at": started_at.isoformat(timespec="seconds"),
        "wall_seconds": wall,
        "machine": {**machine_desc, "loadavg_at_write": os.getloadavg() if hasattr(os, "getloadavg") else None},
        "config": cfg,
        "goals": {k: f"{op} {thr}" for k, (op, thr) in GOALS.items()} | {"p3_alpha_tf_tolerance": ALPHA_TF_TOLERANCE},
        "top_level_rules": TOP_LEVEL_RULES,
        "summary": top,
        "definitions": DEFINITIONS,
        "hf_settings": {
            "call": "target.generate(input_ids, attention_mask, assistant_model=draft, max_new_tokens, do_sample=False, "
                    "num_assistant_tokens=k, num_assistant_tokens_schedule='constant', eos_token_id, pad_token_id, **neutral); "
                    "n-gram: prompt_lookup_num_tokens=k, max_matching_ngram_size=max_ngram",
            "neutral_kwargs": HF_NEUTRAL,
            "assistant_generation_config": "num_assistant_tokens=k, num_assistant_tokens_schedule='constant', "
                                           "assistant_confidence_threshold=0.0 set on draft.generation_config",
            "confidence_threshold_disabled_how": (
                "draft.generation_config.assistant_confidence_threshold = 0.0. None does not work: AssistedCandidateGenerator "
                "runs assistant_generation_config.update(**global_defaults, defaults_only=True), which refills None with the "
                "default 0.4; ConfidenceCriteria is only added when the threshold is > 0 and the sklearn ROC re-tuning only "
                "runs when it is truthy (transformers/generation/candidate_generator.py, utils.py)"),
            "num_assistant_tokens_note": (
                "transformers 5.24 reads num_assistant_tokens / num_assistant_tokens_schedule from the assistant's "
                "generation_config (candidate_generator.py: self.num_assistant_tokens = "
                "self.assistant_generation_config.num_assistant_tokens); the generate() kwargs alone leave the assistant "
                "at its default of 20 tokens per step, so the benchmark sets both"),
            "ngram_differences": (
                "HF PromptLookupCandidateGenerator takes the FIRST (leftmost) earlier occurrence of the longest matching "
                "suffix (n from max_matching_ngram_size down to 1); our NgramDrafter takes the MOST RECENT one (same n range "
                "with min_ngram=1). Both copy at most k tokens that lie inside the context and cut the proposal at EOS. "
                "Different matches give different acceptance, not different outputs (greedy verification)"),
            "eos": "the target's EOS for every method" if not args.ignore_eos else "EOS stopping disabled for every method (eos_token_id=None)",
        },
        "drafters": summary["drafters"],
        "best_k": summary["best_k"],
        "p5_detail": summary["p5"],
        "profile": raw.get("profile"),
        "per_prompt": summary["per_prompt"],
        "skipped_prompts": raw.get("skipped"),
        "heldout": raw.get("heldout"),
        "target_source": raw.get("target_source"),
        "drafter_specs": raw.get("drafters"),
        "phase_seconds": raw.get("phase_seconds"),
        "loadavg_by_phase": raw.get("loadavg_by_phase"),
        "errors": raw.get("errors"),
        "runs": {"main": raw["main"], "teacher_forced": raw["tf"], "k_sweep": raw["k_sweep"], "p5": raw.get("p5"),
                 "costs": raw["costs"], "pooled_stats": raw["stats"], "step_outcomes": raw["steps"]},
    }
    for k in ("p1", "p2", "p3", "p5"):
        v = doc[k]
        doc[k] = None if _nan(v) else float(v)
        if doc[k] is None and f"{k}_reason" not in doc:
            doc[f"{k}_reason"] = "not measured (run incomplete)" if not complete else "not measured"
    return clean(doc)


def write_outputs(path: Path, doc: dict) -> None:
    """Atomically write ``path`` (JSON) and ``path.with_suffix('.md')`` (tables)."""
    _atomic_write(path, json.dumps(doc, indent=2, allow_nan=False) + "\n")
    _atomic_write(path.with_suffix(".md"), markdown(doc))


def _f(x, d=3) -> str:
    return "–" if _nan(x) else f"{x:.{d}f}"


def _x(x) -> str:
    return "–" if _nan(x) else f"{x:.2f}x"


def markdown(doc: dict) -> str:
    m, cfg, top = doc["machine"], doc["config"], doc["summary"]
    L = [f"# Speculative decoding speed benchmark ({cfg['device']}, {cfg['dtype']})", "",
         f"Generated by `benchmarks/perf.py` at {doc['created_at']}" + ("" if doc["complete"] else " — **INCOMPLETE run**")
         + f"; wall time {doc['wall_seconds']:.0f} s.", "",
         "## Machine", "",
         f"- {m.get('cpu')}; {m.get('cpus_available')} of {m.get('logical_cpus')} logical CPUs available; {m.get('memory_gib')} GiB RAM"
         + (f"; GPU {m['gpu']} (CUDA {m.get('cuda')})" if m.get("gpu") else ""),
         f"- {m.get('platform')}; Python {m.get('python')}; torch {m.get('torch')} ({m.get('torch_threads')} threads), "
         f"transformers {m.get('transformers')}, torchao {m.get('torchao')}",
         f"- load average (1/5/15 min) at each phase start: {doc.get('loadavg_by_phase')}; {m.get('cpus_available')} CPUs. "
         "This process itself adds about its thread count; more means other jobs shared the cores and the timings are skewed.",
         f"- git {m.get('git_commit')}" + (" (specdec/ has uncommitted changes)" if m.get("specdec_dirty") else ""), "",
         "## Setup", "",
         f"Target `{cfg['target']}`; drafters {', '.join('`' + s + '`' for s in cfg['drafter_specs'])}; held-out "
         f"`{cfg['heldout']}` stratified subset of {cfg['limit']} (seed {cfg['seed']}); greedy; {cfg['max_new_tokens']} new tokens; "
         f"k = {cfg['k']}; {cfg['repeats']} interleaved repeats; EOS: {doc['hf_settings']['eos']}.", "",
         "## Headline", "",
         "| metric | value | goal | met |", "|---|---|---|---|"]
    for k in ("p1", "p2", "p3", "p5"):
        met = top["goals_met"].get(k)
        L.append(f"| {k.upper()} | {_f(doc[k])}{'' if doc[k] is not None else ' (' + doc.get(k + '_reason', '') + ')'} "
                 f"| {doc['goals'][k]}{' and abs(α_tf − α̂) ≤ 0.03' if k == 'p3' else ''} | {'–' if met is None else ('yes' if met else 'no')} |")
    L += ["", f"Representative drafter (highest measured speedup): `{top.get('representative_drafter')}`. "
          f"P2 pools the identical-output pairs of all drafters ({top.get('p2_pairs')} pairs).", ""]
    L += ["## Per drafter (k = %d)" % cfg["k"], "",
          "| drafter | target-only tok/s | ours tok/s | HF tok/s | measured speedup | HF speedup | P2 (pairs) | α̂ | α pos0 | "
          "acceptance | ĉ | v | predicted (α̂) | P1 | P1 (α pos0) | α_tf | abs(α_tf−α̂) | abs(α_tf−α pos0) | P3 | identical ours/HF vs target, ours=HF |",
          "|---|" + "---|" * 19]
    for s, d in doc["drafters"].items():
        t = d["tok_s"]
        i = d["identical"]
        L.append(f"| `{s}` | {_f(t['target_only'], 1)} | {_f(t['ours'], 1)} | {_f(t['hf'], 1)} | {_x(d['measured_speedup'])} "
                 f"| {_x(d['hf_speedup'])} | {_f(d['p2'], 2)} ({d['p2_pairs']}) | {_f(d['alpha_hat'])} | {_f(d['alpha_pos0'])} "
                 f"| {_f(d['acceptance_rate'])} | {_f(d['c_hat'], 4)} | {_f(d['verify_cost_ratio'], 2)} | {_x(d['predicted_speedup'])} "
                 f"| {_f(d['p1'], 2)} | {_f(d['p1_alpha_pos0'], 2)} | {_f(d.get('alpha_tf'))} | {_f(d.get('abs_alpha_tf_minus_alpha_hat'))} "
                 f"| {_f(d.get('abs_alpha_tf_minus_alpha_pos0'))} | {_f(d.get('p3'), 3)} | {i['ours_vs_target_only']}, "
                 f"{i['hf_vs_target_only']}, {i['ours_vs_hf']} |")
    L += ["", "P1 uses α̂ (validation's estimator, the i.i.d. MLE); `P1 (α pos0)` uses position-0 acceptance. v = (k+1)-token verify pass / 1-token "
          "target pass (Leviathan's formula assumes v = 1). Measured speedup is the pooled ratio of token rates.", ""]
    L += ["### Measured speedup with its paired bootstrap CI, per category", "",
          "| drafter | overall [95% CI] | identical | " + " | ".join(
              sorted({c for d in doc["drafters"].values() for c in d.get("per_category", {})})) + " |"]
    cats = sorted({c for d in doc["drafters"].values() for c in d.get("per_category", {})})
    L.append("|---|---|---|" + "---|" * len(cats))
    for s, d in doc["drafters"].items():
        ci = d.get("measured_speedup_ci") or [None, None]
        cells = []
        for c in cats:
            pc = d.get("per_category", {}).get(c)
            cells.append("-" if pc is None else f"{_x(pc['ours']['measured_speedup'])} (HF {_x(pc['hf'])})")
        L.append(f"| `{s}` | {_x(d['measured_speedup'])} [{_f(ci[0], 2)}, {_f(ci[1], 2)}] "
                 f"| {d.get('identical_outputs')}/{d.get('compared_outputs')} | " + " | ".join(cells) + " |")
    L.append("")
    audits = {s: d.get("hf_audit") for s, d in doc["drafters"].items() if d.get("hf_audit")}
    if audits:
        L += ["### HF audit (one untimed run per drafter)", "", "| drafter | target passes | tokens/target pass | draft passes/target pass "
              "| logits processors | stopping criteria |", "|---|---|---|---|---|---|"]
        for s, a in audits.items():
            if "error" in a or "audit_error" in a:
                L.append(f"| `{s}` | error: {a.get('error') or a.get('audit_error')} | | | | |")
                continue
            L.append(f"| `{s}` | {a['target_forward_passes']} | {_f(a['tokens_per_target_pass'], 2)} "
                     f"| {_f(a.get('draft_passes_per_target_pass'), 2)} | {', '.join(a['logits_processors'] or []) or 'none'} "
                     f"| {', '.join(a['stopping_criteria'] or [])} |")
        L += ["", f"Confidence threshold: {doc['hf_settings']['confidence_threshold_disabled_how']}.", "",
              f"n-gram: {doc['hf_settings']['ngram_differences']}.", ""]
    if doc["best_k"]:
        L += ["## Best k (ours, k sweep)", ""]
        for s, b in doc["best_k"].items():
            L += [f"`{s}` on {b['prompts']} prompt(s), target-only {_f(b['target_only_tok_s'], 1)} tok/s: best measured k = "
                  f"**{b['best_k_measured']}**, best predicted k in the sweep = {b['best_k_predicted_in_sweep']}, "
                  f"predicted argmax over 1..16 = {b['best_k_predicted_1_to_16']}", "",
                  "| k | tok/s | measured speedup | α̂ | α pos0 | mean accepted length | predicted speedup | identical |",
                  "|---|---|---|---|---|---|---|---|"]
            for k, v in b["by_k"].items():
                L.append(f"| {k} | {_f(v['tok_s'], 1)} | {_x(v['measured_speedup'])} | {_f(v['alpha_hat'])} | {_f(v['alpha_pos0'])} "
                         f"| {_f(v['mean_accepted_length'], 2)} | {_x(v['predicted_speedup'])} | {v['identical_to_target_only']} |")
            L.append("")
    L += ["## P5 (batching)", ""]
    if doc["p5_detail"]:
        L += ["| drafter | batch size | batch tok/s | batch-1 tok/s | ratio | rows identical to batch-1 |", "|---|---|---|---|---|---|"]
        for s, v in doc["p5_detail"].items():
            for b, r in v["by_batch_size"].items():
                if "error" in r:
                    L.append(f"| `{s}` | {b} | error: {r['error']} | | | |")
                else:
                    L.append(f"| `{s}` | {b} | {_f(r['batch_tok_s'], 1)} | {_f(r['batch1_tok_s'], 1)} | {_f(r['ratio'], 2)} "
                             f"| {r['rows_identical_to_batch1']} |")
    else:
        L.append(f"Not measured: {doc.get('p5_reason', '')}")
    L += ["", "## Per prompt", "", "| prompt | category | prompt tokens | target-only tok/s (new tokens, finish) | drafter | ours tok/s "
          "| HF tok/s | acceptance | ours = target | HF = target | ours = HF |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    yn = {True: "yes", False: "**no**", None: "–"}
    for p in doc["per_prompt"]:
        for s, d in p["drafters"].items():
            div = f" (first diff @{d['first_divergence_ours_vs_hf']})" if d.get("first_divergence_ours_vs_hf") is not None else ""
            L.append(f"| {p['prompt_id']} | {p['category']} | {p['prompt_tokens']} | {_f(p['target_only_tok_s'], 1)} "
                     f"({p['target_only_new_tokens']}, {p['target_only_finish']}) | `{s}` | {_f(d['ours_tok_s'], 1)} | {_f(d['hf_tok_s'], 1)} "
                     f"| {_f(d.get('acceptance_rate'), 2)} | {yn[d['ours_identical_to_target_only']]} | {yn[d['hf_identical_to_target_only']]} "
                     f"| {yn[d['ours_identical_to_hf']]}{div} |")
    prof = doc.get("profile")
    if prof:
        L += ["", f"## Profile of our step loop (prompt {prof['prompt_id']}, {prof['prompt_tokens']} tokens, k = {prof['k']})", ""]
        for s, pr in prof["by_drafter"].items():
            L += [f"### `{s}`: {pr['new_tokens']} tokens, {pr['steps']} target passes, {pr['draft_forward_passes']} draft passes; "
                  f"model matmuls {pr['model_matmul_self_cpu_share']:.0%} of profiled self CPU time", ""]
            rows = [("ours", pr.get("wall_split"))] + ([("HF", pr["hf_wall_split"])] if pr.get("hf_wall_split") else [])
            L += ["| run | wall ms | target forwards ms (calls) | draft forwards ms (calls) | outside the forwards ms (share, per step) |",
                  "|---|---|---|---|---|"]
            for name, w in rows:
                if not w:
                    continue
                L.append(f"| {name} | {w['wall_ms']:.1f} | {w['target_forward_ms']:.1f} ({w['target_forward_calls']}) "
                         f"| {_f(w.get('draft_forward_ms'), 1)} ({w.get('draft_forward_calls', 0)}) "
                         f"| {w['loop_overhead_ms']:.1f} ({w['loop_overhead_share']:.1%}, {w['loop_overhead_ms_per_step']:.2f}) |")
            loop = (pr.get("ops_by_region") or {}).get("loop")
            if loop:
                L += ["", f"Operators outside the model forwards (our loop): {loop['self_cpu_ms']:.1f} ms self CPU "
                      f"({loop['self_cpu_share']:.1%}): " + ", ".join(
                          f"`{o['op']}` {o['calls_per_step']}/step {o['self_cpu_ms']:.1f} ms" for o in loop["top_ops"][:8]), ""]
            L += [
                  "| overhead | calls/step | self CPU ms | share | calls/step (ms) in loop / target fwd / draft fwd |",
                  "|---|---|---|---|---|"]
            for name, w in pr["watch"].items():
                calls = sum(v["calls_per_step"] for v in w["ops"].values())
                br = w.get("by_region") or {}
                reg = " / ".join(f"{br[r]['calls_per_step']} ({br[r]['self_cpu_ms']:.1f})" if r in br else "–"
                                 for r in ("loop", "target", "draft"))
                L.append(f"| {name} ({', '.join(w['ops']) or '–'}) | {calls:.1f} | {w['self_cpu_ms']:.1f} | {w['self_cpu_share']:.1%} | {reg} |")
            L += ["", "| top op | calls | calls/step | self CPU ms | share |", "|---|---|---|---|---|"]
            for o in pr["top_ops"][:12]:
                L.append(f"| `{o['op']}` | {o['calls']} | {o['calls_per_step']} | {o['self_cpu_ms']:.1f} | {o['self_cpu_share']:.1%} |")
            L += ["", "| Python function (cProfile, by own time) | calls | own ms | cumulative ms |", "|---|---|---|---|"]
            for o in pr["python_top_by_own_time"][:10]:
                L.append(f"| `{o['function']}` | {o['calls']} | {o['own_ms']:.1f} | {o['cumulative_ms']:.1f} |")
            L.append("")
    if doc.get("errors"):
        L += ["", "## Errors", ""] + [f"- {e}" for e in doc["errors"]]
    L += ["", "## Definitions", ""] + [f"- **{k}**: {v}" for k, v in doc["definitions"].items()]
    L += ["", "Top-level rules: " + "; ".join(f"{k}: {v}" for k, v in doc["top_level_rules"].items()), ""]
    return "\n".join(L)
