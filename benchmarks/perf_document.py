"""The JSON document and the markdown page ``perf.py`` writes, from the summary of :mod:`perf_report`."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from perf_report import ALPHA_TF_TOLERANCE, DEFINITIONS, GOALS, TOP_LEVEL_RULES, atomic_write, clean, is_nan



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
        "warmup_seconds": raw.get("warmup"),
        "static_passes": raw.get("static_passes"),
        "runs": {"main": raw["main"], "teacher_forced": raw["tf"], "k_sweep": raw["k_sweep"], "p5": raw.get("p5"),
                 "calibration": raw.get("calibration"), "pooled_stats": raw["stats"], "step_outcomes": raw["steps"]},
    }
    doc["derived_verdict"] = derived_verdict(summary["drafters"], cfg.get("device", "cpu"))
    for k in ("p1", "p2", "p3", "p5"):
        v = doc[k]
        doc[k] = None if is_nan(v) else float(v)
        if doc[k] is None and f"{k}_reason" not in doc:
            doc[f"{k}_reason"] = "not measured (run incomplete)" if not complete else "not measured"
    return clean(doc)


def derived_verdict(drafters: dict, device: str) -> str | None:
    """One sentence: does a derived draft (a lower-precision copy of the target) pay here, and if
    not, why (its cost ratio c and the CPU's native bf16 support). None without derived drafters."""
    from specdec.validation.machine import native_bf16
    from specdec.validation.speed import PAYS_ABOVE

    derived = {s: d for s, d in drafters.items() if s.startswith("derived:")}
    if not derived:
        return None
    nb = native_bf16(device)
    paying = [s for s, d in derived.items() if (d.get("measured_speedup_ci") or [math.nan])[0] > PAYS_ABOVE]
    facts = "; ".join(f"{s}: c = {_f(d.get('c_hat'), 2)}, measured {_x(d.get('measured_speedup'))}"
                      f" [{', '.join(_f(v, 2) for v in (d.get('measured_speedup_ci') or []))}]"
                      for s, d in derived.items())
    bf16 = f"native bf16: {'yes' if nb.get('native') else 'no'} ({nb.get('detail', '')})"
    if paying:
        return f"a derived draft pays here ({', '.join(paying)}; CI above 1.0x): {facts}; {bf16}"
    dear = all(not (d.get("c_hat") is not None and d["c_hat"] < 0.9) for d in derived.values())
    why = ("none is cheaper than the target here (c >= 0.9)" if dear
           else "acceptance too low for the cost of the cheaper ones")
    return f"no derived draft pays here ({why}): {facts}; {bf16}"


def write_outputs(path: Path, doc: dict) -> None:
    """Atomically write ``path`` (JSON) and ``path.with_suffix('.md')`` (tables)."""
    atomic_write(path, json.dumps(doc, indent=2, allow_nan=False) + "\n")
    atomic_write(path.with_suffix(".md"), markdown(doc))


def _f(x, d=3) -> str:
    return "–" if is_nan(x) else f"{x:.{d}f}"


def _x(x) -> str:
    return "–" if is_nan(x) else f"{x:.2f}x"


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
    if doc.get("derived_verdict"):
        L += ["", f"Derived drafts: {doc['derived_verdict']}."]
    L += ["", f"Representative drafter (highest measured speedup): `{top.get('representative_drafter')}`. "
          f"P2 pools the identical-output pairs of all drafters ({top.get('p2_pairs')} pairs).", ""]
    L += _model_section(doc)
    L += ["## Per drafter (k = %d)" % cfg["k"], "",
          "| drafter | target-only tok/s | ours tok/s | HF tok/s | measured speedup | HF speedup | ours/HF (identical pairs) [95% CI] "
          "| α̂ | acceptance | c (short) | v(k) (short) | predicted (one model) | P1 | Leviathan closed form | α_tf | P3 "
          "| identical ours/HF vs target, ours=HF |",
          "|---|" + "---|" * 16]
    for s, d in doc["drafters"].items():
        t, i, oh = d["tok_s"], d["identical"], d.get("ours_over_hf") or {}
        ci = oh.get("ci") or [None, None]
        L.append(f"| `{s}` | {_f(t['target_only'], 1)} | {_f(t['ours'], 1)} | {_f(t['hf'], 1)} | {_x(d['measured_speedup'])} "
                 f"| {_x(d['hf_speedup'])} | {_f(oh.get('ratio'), 3)} [{_f(ci[0], 2)}, {_f(ci[1], 2)}] ({oh.get('pairs')}) "
                 f"| {_f(d['alpha_hat'])} | {_f(d['acceptance_rate'])} | {_f(d['c_hat'], 4)} | {_f(d['verify_cost_ratio'], 2)} "
                 f"| {_x(d['predicted_speedup'])} | {_f(d['p1'], 2)} | {_x(d.get('leviathan_closed_form'))} | {_f(d.get('alpha_tf'))} "
                 f"| {_f(d.get('p3'), 3)} | {i['ours_vs_target_only']}, {i['hf_vs_target_only']}, {i['ours_vs_hf']} |")
    L += ["", "Predicted = the product's one speed model (specdec.validation.speed.predicted_speedup; see 'Speed model' above). "
          "The Leviathan closed form (i.i.d. acceptance at α̂, v = 1) is its special case, for reference; no P1 uses it. "
          "Measured speedup is the pooled ratio of token rates.", ""]
    L += _speed_table(doc)
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
                  f"predicted best k on i.i.d. counters at α̂ = {b['best_k_predicted_iid']}", "",
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


def _model_section(doc: dict) -> list[str]:
    """Which counters and costs the predictions used (the calibration points) and P1 by context."""
    cal = (doc.get("runs") or {}).get("calibration") or {}
    L = ["## Speed model", "",
         "Every predicted figure is `specdec.validation.speed.predicted_speedup` (the product's one model): per prompt, "
         "counters = the steps our run took on it after the prefill step (`StepCounters.from_steps`, recorded by a "
         "delegating drafter and checked against `DecodingStats`); costs = c and v(n) from "
         "`specdec.validation.timing.calibrate` at the calibration point of the prompt's context; the prefill (left out "
         "by the model) is the target-only run's first pass on both sides; pooled over (prompt, repeat) as measured.", "",
         "| point | context tokens | prompts | target 1-token pass ms | v(1..) fitted | c per drafter | load |",
         "|---|---|---|---|---|---|---|"]
    for name, c in cal.items():
        v = ", ".join(_f(x, 2) for x in (c.get("verify_cost") or [])[1:])
        cs = ", ".join(f"{s}: {_f(x, 3)}" for s, x in c["c"].items())
        L.append(f"| {name} | {c['context_tokens']} | {len(c['prompts'])} | {_f(c['target_one_token_pass_s'] * 1e3, 2)} "
                 f"| {v} | {cs} | {c.get('load_avg_1m')} |")
    L += ["", "| drafter | context | measured | predicted | P1 |", "|---|---|---|---|---|"]
    for s, d in doc["drafters"].items():
        for b, x in (d.get("by_context") or {}).items():
            L.append(f"| `{s}` | {b} | {_x(x['measured_speedup'])} | {_x(x['predicted_speedup'])} | {_f(x['p1'], 2)} |")
    return L + [""]


def _speed_table(doc: dict) -> list[str]:
    """Per drafter and category: our measured speedup (HF's), ours / HF on identical pairs with its CI, P1."""
    cats = sorted({c for d in doc["drafters"].values() for c in d.get("per_category", {})})
    L = ["### Per category: measured speedup (HF's); ours/HF [95% CI]; P1", "",
         "| drafter | overall [95% CI] | identical | " + " | ".join(cats) + " |",
         "|---|---|---|" + "---|" * len(cats)]
    for s, d in doc["drafters"].items():
        ci = d.get("measured_speedup_ci") or [None, None]
        cells = []
        for c in cats:
            pc = d.get("per_category", {}).get(c)
            if pc is None:
                cells.append("-")
                continue
            oh = pc.get("ours_over_hf") or {}
            oci = oh.get("ci") or [None, None]
            cells.append(f"{_x(pc['ours']['measured_speedup'])} (HF {_x(pc['hf'])}); {_f(oh.get('ratio'), 2)} "
                         f"[{_f(oci[0], 2)}, {_f(oci[1], 2)}]; P1 {_f(pc.get('p1'), 2)}")
        L.append(f"| `{s}` | {_x(d['measured_speedup'])} [{_f(ci[0], 2)}, {_f(ci[1], 2)}] "
                 f"| {d.get('identical_outputs')}/{d.get('compared_outputs')} | " + " | ".join(cells) + " |")
    return L + [""]
