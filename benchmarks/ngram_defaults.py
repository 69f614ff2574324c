"""Choose the n-gram drafter's defaults by measurement, against transformers' prompt lookup.

For each Spec-Bench category (short prompts where a category has them), every prompt is decoded
greedily by target-only decoding, by our n-gram drafter under each candidate policy, and by
transformers' prompt lookup (``generate(prompt_lookup_num_tokens=k, max_matching_ngram_size=n)``),
in an order rotated from prompt to prompt (interleaved). Per category and overall: pooled speedup
vs target-only with a paired bootstrap CI (specdec.validation.speed), acceptance, and whether every
output equals target-only's.

Writes ``benchmarks/results/ngram_defaults.json`` and ``.md`` (atomic). Usage::

    .venv/bin/python benchmarks/ngram_defaults.py                   # 4 prompts/category, 64 tokens
    .venv/bin/python benchmarks/ngram_defaults.py --per-category 2 --max-new-tokens 32   # quicker
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
if str(ROOT) not in sys.path:
    sys.path.insert(1, str(ROOT))
for _k, _v in (("HF_HUB_OFFLINE", "1"), ("DO_NOT_TRACK", "true"), ("TOKENIZERS_PARALLELISM", "false")):
    os.environ.setdefault(_k, _v)

#: name -> (max_ngram, min_ngram, match_tokens, first_occurrence); match_tokens () = classic prompt
#: lookup (k tokens after any match); first_occurrence = continue the earliest match (as HF does)
POLICIES = {
    "classic n3": (3, 1, (), False),
    "classic n3 first": (3, 1, (), True),
    "weak1 n3": (3, 1, (1,), False),
    "weak1-2 n3": (3, 1, (1, 2), False),
    "min2 n3": (3, 2, (), False),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--per-category", type=int, default=4)
    ap.add_argument("--max-prompt-tokens", type=int, default=1000)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--policies", default=",".join(POLICIES), help="comma-separated names from POLICIES")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    a = ap.parse_args(argv)
    import torch
    import transformers

    torch.set_num_threads(a.threads)
    transformers.logging.set_verbosity_error()
    import perf_methods as pm
    from specdec.settings import model_store
    from specdec.validation.machine import cpu_model

    from specdec import NgramDrafter
    from specdec.models import load_causal_lm
    from specdec.validation.heldout import load_heldout, prompt_token_ids
    from specdec.validation.machine import load_average
    from specdec.validation.provenance import eos_token_ids
    from specdec.validation.short_prompts import short_prompts
    from specdec.validation.speed import bootstrap_speedup_ci, pooled_speedup

    t_start = time.perf_counter()
    tgt = load_causal_lm(a.target, dtype="float32", device="cpu", store=model_store())
    model, tok = tgt.model.eval(), tgt.tokenizer
    eos = eos_token_ids(tok, model)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    held = short_prompts(load_heldout("spec_bench"), tok, per_category=a.per_category,
                         max_prompt_tokens=a.max_prompt_tokens, seed=0)
    names = [n for n in a.policies.split(",") if n]
    methods = ["target_only"] + [f"ours {n}" for n in names] + [f"hf k={a.k} n=3", "hf k=10 n=2"]
    drafters = {f"ours {n}": NgramDrafter(*POLICIES[n][:2], match_tokens=POLICIES[n][2], first_occurrence=POLICIES[n][3])
                for n in names}
    x0 = torch.tensor([prompt_token_ids(held.prompts[0], tok)])
    pm.run_target_only(model, x0, 4, eos)  # warm-up
    rows = []
    loads = [load_average()]
    for i, p in enumerate(held.prompts):
        x = torch.tensor([prompt_token_ids(p, tok)])
        rot = i % len(methods)
        outs = {}
        for m in methods[rot:] + methods[:rot]:
            if m == "target_only":
                o = pm.run_target_only(model, x, a.max_new_tokens, eos)
            elif m.startswith("ours"):
                o = pm.Ours(drafters[m]).run(model, x, a.k, a.max_new_tokens, eos)
            else:
                k, n = (a.k, 3) if m == f"hf k={a.k} n=3" else (10, 2)
                o = pm.run_hf(model, NgramDrafter(max_ngram=n), x, k, a.max_new_tokens, eos, pad)
            outs[m] = o
        ref = outs["target_only"]
        for m, o in outs.items():
            st = o.stats
            rows.append({"prompt_id": p.id, "category": p.category, "method": m, "seconds": o.seconds,
                         "new_tokens": len(o.tokens), "identical": o.tokens == ref.tokens,
                         "num_draft_tokens": getattr(st, "num_draft_tokens", None) if m.startswith("ours") else None,
                         "num_accepted_tokens": getattr(st, "num_accepted_tokens", None) if m.startswith("ours") else None})
        loads.append(load_average())
        print(f"[{time.perf_counter() - t_start:6.0f}s] {i + 1}/{len(held)} {p.category} load {loads[-1]:.1f}", flush=True)

    def summary(sel):
        ref = {r["prompt_id"]: r for r in sel if r["method"] == "target_only"}
        out = {}
        for m in methods[1:]:
            rr = [r for r in sel if r["method"] == m and r["prompt_id"] in ref]
            cols = ([ref[r["prompt_id"]]["new_tokens"] for r in rr], [ref[r["prompt_id"]]["seconds"] for r in rr],
                    [r["new_tokens"] for r in rr], [r["seconds"] for r in rr])
            d = {"speedup": pooled_speedup(*cols), "speedup_ci": bootstrap_speedup_ci(*cols),
                 "identical": f"{sum(r['identical'] for r in rr)}/{len(rr)}"}
            if m.startswith("ours"):
                dr = sum(r["num_draft_tokens"] or 0 for r in rr)
                d["acceptance_rate"] = sum(r["num_accepted_tokens"] or 0 for r in rr) / dr if dr else None
                d["draft_tokens_per_prompt"] = dr / len(rr) if rr else None
            out[m] = d
        return out

    cats = sorted({r["category"] for r in rows})
    doc = {"created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "cpu": cpu_model(),
           "threads": a.threads, "k": a.k, "max_new_tokens": a.max_new_tokens, "per_category": a.per_category,
           "policies": {n: POLICIES[n] for n in names}, "load_avg_1m": loads,
           "overall": summary(rows), "categories": {c: summary([r for r in rows if r["category"] == c]) for c in cats},
           "rows": rows, "seconds": time.perf_counter() - t_start}
    a.out_dir.mkdir(parents=True, exist_ok=True)
    path = a.out_dir / "ngram_defaults.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str))
    tmp.replace(path)
    L = [f"# n-gram drafter defaults vs transformers' prompt lookup ({doc['created_at']})", "",
         f"SmolLM2-135M-Instruct fp32, {a.threads} threads, {doc['cpu']}; Spec-Bench {a.per_category} prompts per "
         f"category (shortest ≤ {a.max_prompt_tokens} tokens where available), {a.max_new_tokens} new tokens, greedy, "
         f"k = {a.k}; interleaved; load avg {min(loads):.1f}-{max(loads):.1f}. Pooled speedup vs target-only "
         "[paired bootstrap 95% CI]; acceptance for ours.", "",
         "| method | overall | " + " | ".join(cats) + " |", "|---|---|" + "---|" * len(cats)]
    for m in methods[1:]:
        cells = []
        for sel in [doc["overall"]] + [doc["categories"][c] for c in cats]:
            d = sel[m]
            acc = f", acc {d['acceptance_rate']:.2f}" if d.get("acceptance_rate") is not None else ""
            cells.append(f"{d['speedup']:.3f}x [{d['speedup_ci'][0]:.2f}, {d['speedup_ci'][1]:.2f}]{acc} ({d['identical']})")
        L.append(f"| {m} | " + " | ".join(cells) + " |")
    path.with_suffix(".md").write_text("\n".join(L) + "\n")
    print("\n".join(L))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
