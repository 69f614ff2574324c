"""Which per-token acceptance estimate stays put when k changes? (issue 30)

Replays the real SmolLM2 pairs (greedy, exact replay: every counter equals decoding's) on the demo's
held-out prompts for every k in ``--ks`` and computes, per k, each candidate estimator of
Leviathan's per-token acceptance alpha from the pooled counters (``specdec.core.stats.ESTIMATORS``)
next to vLLM's accepted/drafted rate and the teacher-forced top-1 agreement. The candidate whose
value moves least from k = 2 to k = 8 is the floor's metric (docs/metrics.md).

Pairs: ``derived:bf16`` of the fp32 target (healthy, ~0.95), ``ngram`` (~0.5), and the demo's stale
pair: the target after ``flows.finetune.DEMO_RECIPE`` with the bf16 draft of the *original* target
(pass ``--finetuned DIR``; made with ``finetune_target`` when absent). Writes
``benchmarks/results/<date>-alpha-k-invariance-cpu.json`` with the machine load.

Usage::

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/alpha_k_invariance.py --finetuned /tmp/ft --per-category 2
    .venv/bin/python benchmarks/alpha_k_invariance.py --recompute benchmarks/results/<file>.json

``--recompute`` recomputes every estimator from the counters stored in a results file (no models):
the counters are exact, so a renamed or added estimator is measured on the same replays.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _pairs(args):
    from specdec.models import load_causal_lm
    from specdec.kinds import resolve_drafter
    from specdec.settings import model_store

    base = load_causal_lm(args.target, dtype="float32", device="cpu", store=model_store())
    bf16 = resolve_drafter("derived:bf16", base, store=model_store())
    pairs = [("derived:bf16", base, bf16), ("ngram", base, resolve_drafter("ngram", base, store=model_store()))]
    if args.finetuned:
        ft = load_causal_lm(args.finetuned, dtype="float32", device="cpu", store=model_store())
        pairs.append(("stale derived:bf16 (fine-tuned target, old draft)", ft, bf16))
    return base, pairs


def _replay(target, drafter, held, args, cache):
    from specdec.core.config import SamplingConfig, SpeculativeConfig
    from specdec.validation.api import drafter_parts
    from specdec.validation.prompt_run import context_limit
    from specdec.validation.provenance import eos_token_ids
    from specdec.validation.replay_run import replay_prompts
    from specdec.validation.config import ValidationConfig

    obj, dmodel, *_ = drafter_parts(drafter)
    config = ValidationConfig(SpeculativeConfig(max(args.ks), SamplingConfig(), args.max_new_tokens))
    eos = eos_token_ids(target.tokenizer, target.model)
    return replay_prompts(held, target.model.eval(), target.tokenizer, [obj], config, eos=eos,
                          ctx_limit=context_limit(target.model, dmodel), cache=cache, target_weights=str(id(target)),
                          kmax=max(args.ks), exact=True)


def _row(name, replayed, ks, seconds):
    from specdec.core.stats import DecodingStats, ESTIMATORS, estimate

    ok = [r for r in replayed if r.status != "skipped"]
    agree = n = 0
    for r in ok:
        tr = r.drafters[0].trace
        if getattr(tr, "argmax", None):  # a model draft's teacher-forced argmax; an n-gram trace has none
            agree += sum(int(a == b) for a, b in zip(tr.argmax, r.continuation))
            n += len(r.continuation)
    by_k = {}
    for k in ks:
        st = DecodingStats(num_speculative_tokens=k)
        for r in ok:
            st = st.merge(r.drafters[0].curve[k])
        by_k[k] = {"counters": {f: getattr(st, f) for f in ("num_drafts", "num_draft_tokens", "num_accepted_tokens",
                                                             "num_rejected_steps", "accepted_per_position",
                                                             "drafted_per_position")},
                   **{e: estimate(st, e) for e in ESTIMATORS}}
    spread = {e: max(v[e] for v in by_k.values()) - min(v[e] for v in by_k.values()) for e in ESTIMATORS}
    return {"pair": name, "prompts": len(ok), "top1_agreement_tf": agree / n if n else None,
            "replay_seconds": seconds, "by_k": by_k, "spread_k2_k8": spread}


def _summary(rows: list[dict]) -> dict:
    from specdec.core.stats import ESTIMATORS

    worst = {e: max(r["spread_k2_k8"][e] for r in rows) for e in ESTIMATORS}
    return {"worst_spread_k2_k8": worst, "chosen": min(worst, key=worst.get)}


def recompute(path: Path) -> None:
    """Recompute the estimators of a results file from its stored counters, in place."""
    from specdec.core.stats import DecodingStats, ESTIMATORS, estimate

    doc = json.loads(path.read_text())
    for row in doc["rows"]:
        for k, v in row["by_k"].items():
            st = DecodingStats(num_speculative_tokens=int(k), **v["counters"])
            row["by_k"][k] = {"counters": v["counters"], **{e: estimate(st, e) for e in ESTIMATORS}}
        vals = row["by_k"].values()
        row["spread_k2_k8"] = {e: max(x[e] for x in vals) - min(x[e] for x in vals) for e in ESTIMATORS}
    doc.update(_summary(doc["rows"]), recomputed_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    path.write_text(json.dumps(doc, indent=1, default=str))
    print(path, doc["worst_spread_k2_k8"], "chosen:", doc["chosen"], file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recompute", type=Path, default=None, help="recompute a results file from its counters")
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--finetuned", default=None, help="checkpoint of the demo's fine-tuned target (stale pair)")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--ks", default="2,3,4,5,6,7,8")
    args = ap.parse_args()
    if args.recompute is not None:
        return recompute(args.recompute)
    args.ks = [int(x) for x in args.ks.split(",")]
    import torch

    from flows.demo import DEMO_MAX_PROMPT_TOKENS
    from specdec.validation.continuation_cache import ContinuationCache
    from specdec.validation.heldout import load_heldout
    from specdec.validation.short_prompts import short_prompts

    torch.set_num_threads(os.cpu_count() or 1)
    base, pairs = _pairs(args)
    held = short_prompts(load_heldout("spec_bench"), base.tokenizer, per_category=args.per_category,
                         max_prompt_tokens=DEMO_MAX_PROMPT_TOKENS, seed=0)
    rows, load0 = [], os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        cache = ContinuationCache(Path(tmp))
        for name, target, drafter in pairs:
            t0 = time.perf_counter()
            replayed = _replay(target, drafter, held, args, cache)
            rows.append(_row(name, replayed, args.ks, time.perf_counter() - t0))
            print(name, {e: round(v, 4) for e, v in rows[-1]["spread_k2_k8"].items()}, file=sys.stderr, flush=True)
    out = ROOT / "benchmarks" / "results" / f"{dt.date.today().isoformat()}-alpha-k-invariance-cpu.json"
    out.write_text(json.dumps({
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "config": {**vars(args), "prompts": len(held.prompts), "heldout": "demo (short Spec-Bench, all categories)"},
        "machine": {"cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                    "load_avg_1m_start": load0, "load_avg_1m_end": os.getloadavg()[0]},
        **_summary(rows), "rows": rows}, indent=1, default=str))
    print(out, _summary(rows), file=sys.stderr)


if __name__ == "__main__":
    main()
