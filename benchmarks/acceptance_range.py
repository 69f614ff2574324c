"""The one speed model across the acceptance range: a stale pair (~0.3 at k), n-gram (~0.5) and the bf16 copy (~0.95).

Each pair is validated through the one validation entry (:func:`specdec.validation.validate`, ``method="decode"``:
warm-up, pass costs c and v(n), per prompt target-only and speculative runs back to back, paired ratios, bootstrap
CI, the speed model's prediction from the run's own counters and costs). Pairs, SmolLM2-135M-Instruct fp32 on the
CPU, greedy, the demo's held-out prompts (the shortest ``--per-category`` of each Spec-Bench category):

- ``stale``: the demo's fine-tuned target (``flows.finetune.DEMO_RECIPE``; ``make demo`` leaves it under
  ``.specdec/demo/checkpoints/smollm2-shakespeare``) with the bf16 copy of the *original* target (night 2);
- ``ngram``: the original target with the n-gram drafter;
- ``bf16``: the original target with its own bf16 copy (night 1).

The output records, per pair: the acceptance rate at k and the per-token acceptance, measured speedup with its CI,
predicted speedup, measured / predicted (goal 0.9-1.1), greedy outputs identical, and the machine's load.

    PYTHONPATH=. HF_HUB_OFFLINE=1 python benchmarks/acceptance_range.py [--finetuned DIR] [--out PATH]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_FINETUNED = REPO / ".specdec" / "demo" / "checkpoints" / "smollm2-shakespeare"


def _row(name: str, report, seconds: float) -> dict:
    g = report.overall
    return {"pair": name, "drafter_kind": report.drafter_kind, "k": g.num_speculative_tokens,
            "acceptance_rate": g.acceptance_rate, "per_token_acceptance": g.per_token_acceptance,
            "mean_accepted_length": g.mean_accepted_length, "measured_speedup": g.speedup,
            "measured_speedup_ci": list(g.speedup_ci), "predicted_speedup": g.predicted_speedup,
            "measured_over_predicted": g.measured_over_predicted, "timing_suspect": g.timing_suspect,
            "num_remeasured": g.num_remeasured, "speedup_pooled": g.speedup_pooled,
            "cost_ratio_used": g.predicted_cost_ratio, "cost_ratio_in_run": g.cost_ratio,
            "cost_ratio_in_run_with_prefill": g.cost_ratio_with_prefill, "verify_cost_in_run": g.verify_cost_ratio,
            "verify_cost_by_n_used": g.verify_cost_by_n, "target_step_seconds": g.target_step_seconds,
            "draft_pass_seconds": g.draft_pass_seconds, "identical_outputs": g.exactness_checked - g.exactness_mismatches,
            "compared_outputs": g.exactness_checked, "load_avg_1m": g.load_avg_1m, "num_cpus": g.num_cpus,
            "seconds": seconds}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--finetuned", type=Path, default=DEFAULT_FINETUNED, help="the demo's fine-tuned target")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--pairs", default="stale,ngram,bf16", help="comma-separated subset of stale, ngram, bf16")
    ap.add_argument("--out", type=Path, default=REPO / f"benchmarks/results/{dt.date.today()}-acceptance-range-cpu.json")
    args = ap.parse_args()
    wanted = args.pairs.split(",")
    if "stale" in wanted and not (args.finetuned / "config.json").exists():
        raise SystemExit(f"no fine-tuned target at {args.finetuned}: run `make demo` first, or pass --finetuned DIR")

    from specdec.models import load_causal_lm
    from specdec.kinds import resolve_drafter
    from specdec.settings import model_store
    from specdec.validation import ValidationRequest, validate
    from specdec.validation.config import ValidationConfig
    from specdec.validation.heldout import load_heldout
    from specdec.validation.machine import cpu_model
    from specdec.validation.report import nan_to_none
    from specdec.validation.short_prompts import short_prompts

    original = load_causal_lm("smollm2", dtype="float32", device="cpu", store=model_store())
    stale_target = load_causal_lm(str(args.finetuned), dtype="float32", device="cpu",
                                  store=model_store()) if "stale" in wanted else None
    held = short_prompts(load_heldout("spec_bench"), original.tokenizer, per_category=args.per_category,
                         max_prompt_tokens=192, seed=0)
    config = ValidationConfig(num_speculative_tokens=args.k, max_new_tokens=args.max_new_tokens, seed=0)
    pairs = {"stale": (stale_target, "derived:bf16"), "ngram": (original, "ngram"), "bf16": (original, "derived:bf16")}
    rows = []
    for name in [p for p in pairs if p in wanted]:
        target, spec = pairs[name]
        drafter = resolve_drafter(spec, original,
                                  store=model_store())  # the stale pair's draft is the original target's copy
        t0 = time.perf_counter()
        [report] = validate(ValidationRequest(target=target, drafters=[drafter], heldout=held, config=config,
                                              target_ref=name))
        rows.append(_row(name, report, time.perf_counter() - t0))
        print({k: rows[-1][k] for k in ("pair", "per_token_acceptance", "acceptance_rate", "measured_speedup",
                                        "predicted_speedup", "measured_over_predicted", "identical_outputs")},
              flush=True)
    out = {"created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "cpu": cpu_model(),
           "num_cpus": os.cpu_count(), "prompts": [p.id for p in held.prompts], "k": args.k,
           "max_new_tokens": args.max_new_tokens, "finetuned": str(args.finetuned), "pairs": rows}
    args.out.write_text(json.dumps(nan_to_none(out), indent=1, default=str))
    print("written", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
