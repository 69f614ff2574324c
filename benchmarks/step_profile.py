"""Per-step profile of our speculative decoding on the real pair, at a short and a long context.

One speculative step = draft proposal (the draft model's passes, or the n-gram lookup) + target
verification pass + verification (greedy: argmax, compare) + rollback of both caches + Python
bookkeeping. This script splits the decode steps of a greedy generation (the prefill step left out)
into those regions and reports per step:

* counts that do not depend on the machine's load: operators, allocations and allocated bytes
  (``torch.profiler`` with ``profile_memory``), copies (``aten::copy_``/``cat``/``clone``) and host
  syncs (``aten::item``/``_local_scalar_dense``), per region;
* wall and process-CPU milliseconds per region (load dependent: the 1-minute load is recorded).

Regions are ``record_function`` ranges opened by forward hooks on the two models and by wrappers
around the loop's own functions (the target cache's ``score`` and ``crop_cache``, the verifier, the drafter's
``propose``/``accept``/``adopt_prefix``); an operator counts in its innermost region, the rest is
"bookkeeping" (the loop itself). Nothing in the core is changed for the profile.

    PYTHONPATH=/work/main ... python benchmarks/step_profile.py --label before   # the code on main
    PYTHONPATH=. SPECDEC_MODELS_DIR=... python benchmarks/step_profile.py --label after [--threads 1]
    python benchmarks/step_profile.py --markdown BEFORE.json AFTER.json OUT.md

Writes ``benchmarks/results/<date>-step-profile-<label>-cpu.json``; :func:`markdown` tabulates a
before/after pair.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
REGIONS = ("target_verify", "draft_forward", "draft_proposal_other", "verification", "target_crop",
           "draft_rollback", "adopt_prefix", "bookkeeping")
ALLOC = ("aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty", "aten::zeros", "aten::ones",
         "aten::full", "aten::new_full", "aten::tensor", "aten::lift_fresh")
COPIES = ("aten::copy_", "aten::cat", "aten::clone", "aten::contiguous", "aten::_to_copy")
SYNCS = ("aten::item", "aten::_local_scalar_dense")


class Regions:
    """Stack of named regions: exclusive wall/CPU seconds per region and a profiler range per entry."""

    def __init__(self) -> None:
        self.wall = {r: 0.0 for r in REGIONS}
        self.cpu = {r: 0.0 for r in REGIONS}
        self.stack: list[list] = []
        self.target_calls = 0

    def _charge(self, now_w: float, now_c: float) -> None:
        if self.stack:
            top = self.stack[-1]
            self.wall[top[0]] += now_w - top[1]
            self.cpu[top[0]] += now_c - top[2]

    def enter(self, name: str) -> None:
        w, c = time.perf_counter(), time.process_time()
        self._charge(w, c)
        rf = torch.autograd.profiler.record_function("##" + name)
        rf.__enter__()
        self.stack.append([name, w, c, rf])

    def exit(self) -> None:
        w, c = time.perf_counter(), time.process_time()
        self._charge(w, c)
        name, _, _, rf = self.stack.pop()
        rf.__exit__(None, None, None)
        if self.stack:
            self.stack[-1][1], self.stack[-1][2] = w, c

    @contextmanager
    def region(self, name: str):
        self.enter(name)
        try:
            yield
        finally:
            self.exit()


def _wrap(obj, attr: str, regions: Regions, name: str):
    orig = getattr(obj, attr)

    def wrapper(*a, **kw):
        with regions.region(name):
            return orig(*a, **kw)

    setattr(obj, attr, wrapper)
    return lambda: setattr(obj, attr, orig)


def _wrap_loop(regions: Regions) -> list:
    """Wrap the loop's verification and target crop: the one loop's (``specdec.core.loops._verify``,
    ``StaticTargetCache.score`` minus its forward, ``target_cache.crop_cache``), or, for code from before the
    loops were merged, ``specdec.core.decoding._verify`` and ``decoding.crop_cache``."""
    import specdec.core.decoding as dec

    if hasattr(dec, "_verify"):  # the code before issue 42's one loop
        return [_wrap(dec, "_verify", regions, "verification"), _wrap(dec, "crop_cache", regions, "target_crop")]
    import specdec.core.loops as loop
    import specdec.core.target_cache as tc

    return [_wrap(tc.StaticTargetCache, "score", regions, "verification"),
            _wrap(loop, "_verify", regions, "verification"), _wrap(tc, "crop_cache", regions, "target_crop")]


@contextmanager
def instrumented(target, drafter, regions: Regions):
    """Hooks on both models and wrappers around the loop's functions (undone on exit)."""
    undo = _wrap_loop(regions) + [_wrap(drafter, "propose", regions, "draft_proposal_other"),
                                  _wrap(drafter, "accept", regions, "draft_rollback")]
    if hasattr(drafter, "adopt_prefix"):
        undo.append(_wrap(drafter, "adopt_prefix", regions, "adopt_prefix"))
    handles = []

    def t_pre(*a):
        regions.enter("prefill" if regions.target_calls == 0 else "target_verify")
        regions.target_calls += 1

    handles += [target.register_forward_pre_hook(t_pre), target.register_forward_hook(lambda *a: regions.exit())]
    model = getattr(drafter, "model", None)
    if model is not None:
        handles += [model.register_forward_pre_hook(lambda *a: regions.enter("draft_forward")),
                    model.register_forward_hook(lambda *a: regions.exit())]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        for u in undo:
            u()


def _region_of(ev, memo: dict) -> str:
    chain, e, found = [], ev, "bookkeeping"
    while e is not None:
        if id(e) in memo:
            found = memo[id(e)]
            break
        chain.append(e)
        if e.name.startswith("##"):
            found = e.name[2:]
            break
        e = e.cpu_parent
    for c in chain:
        memo[id(c)] = found
    return found


def profile_case(target, drafter, ids: list[int], k: int, new_tokens: int) -> dict:
    """One warm greedy generation under the profiler; per-step counts and times by region."""
    from torch.profiler import ProfilerActivity, profile

    from specdec import SamplingConfig, speculative_generate

    x = torch.tensor([ids])

    def go():
        return speculative_generate(target, drafter, x, num_speculative_tokens=k, max_new_tokens=new_tokens,
                                    sampling=SamplingConfig(), eos_token_id=None)

    go()
    regions = Regions()
    regions.wall["prefill"] = regions.cpu["prefill"] = 0.0
    load = os.getloadavg()[0]
    with instrumented(target, drafter, regions), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        t0, c0 = time.perf_counter(), time.process_time()
        with regions.region("bookkeeping"):
            res = go()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    steps = res.stats.target_forward_passes - 1  # decode steps (the first is the prefill)
    memo: dict = {}
    counts = {r: {"ops": 0, "allocs": 0, "alloc_mb": 0.0, "copies": 0, "host_syncs": 0} for r in (*REGIONS, "prefill")}
    for ev in prof.events():
        if ev.name.startswith("##"):
            continue
        c = counts.setdefault(_region_of(ev, memo), {"ops": 0, "allocs": 0, "alloc_mb": 0.0, "copies": 0, "host_syncs": 0})
        c["ops"] += 1
        c["allocs"] += ev.name in ALLOC
        c["alloc_mb"] += max(0, getattr(ev, "cpu_memory_usage", 0) or 0) / 2**20
        c["copies"] += ev.name in COPIES
        c["host_syncs"] += ev.name in SYNCS
    per_step = {}
    for r in REGIONS:
        per_step[r] = {"wall_ms": round(regions.wall[r] * 1e3 / steps, 3), "cpu_ms": round(regions.cpu[r] * 1e3 / steps, 3),
                       **{kk: round(v / steps, 2) for kk, v in counts[r].items()}}
    models_ms = per_step["target_verify"]["wall_ms"] + per_step["draft_forward"]["wall_ms"]
    decode_wall = sum(regions.wall[r] for r in REGIONS) * 1e3 / steps
    return {"prompt_tokens": len(ids), "new_tokens": len(res.token_ids), "decode_steps": steps,
            "num_drafts": res.stats.num_drafts, "num_accepted_tokens": res.stats.num_accepted_tokens,
            "mean_accepted_length": res.stats.mean_accepted_length, "draft_forward_passes": res.stats.draft_forward_passes,
            "load_avg_1m": round(load, 2), "wall_s_profiled": round(wall, 3), "cpu_s_profiled": round(cpu, 3),
            "prefill_wall_ms": round(regions.wall["prefill"] * 1e3, 2),
            "per_step": per_step, "per_step_wall_ms": round(decode_wall, 3),
            "outside_forwards_wall_ms_per_step": round(decode_wall - models_ms, 3),
            "outside_forwards_share": round(1 - models_ms / decode_wall, 4) if decode_wall else None,
            "token_ids": list(res.token_ids)}


def main() -> int:
    sys.path.append(str(ROOT))  # PYTHONPATH wins: point it at another checkout to profile that one
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--label", help="before / after (goes into the file name)")
    ap.add_argument("--markdown", nargs=3, metavar=("BEFORE", "AFTER", "OUT"), type=Path,
                    help="only tabulate two result files into OUT (markdown)")
    ap.add_argument("--drafters", default="derived:bf16,ngram")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: least sensitive to co-tenants)")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    a = ap.parse_args()
    if a.markdown:
        before, after, dest = a.markdown
        dest.write_text(markdown(json.loads(before.read_text()), json.loads(after.read_text())))
        return 0
    if not a.label:
        ap.error("--label is required")
    torch.set_num_threads(a.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    import specdec
    from specdec.models import load_causal_lm
    from specdec.kinds import resolve_drafter
    from specdec.settings import model_store
    from specdec.validation.heldout import load_heldout, prompt_token_ids
    from specdec.validation.machine import cpu_model

    tgt = load_causal_lm("smollm2", dtype="float32", device="cpu", store=model_store())
    prompts = sorted((prompt_token_ids(p, tgt.tokenizer), p.id, p.category)
                     for p in load_heldout("spec_bench").subset(12, seed=0).prompts)
    prompts.sort(key=lambda t: len(t[0]))
    cases = {"short": prompts[0], "long": prompts[-1]}
    out = {"date": str(dt.date.today()), "label": a.label, "specdec_path": str(Path(specdec.__file__).parent),
           "cpu": cpu_model(), "logical_cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
           "torch": torch.__version__, "transformers": transformers.__version__, "k": a.k, "new_tokens": a.new_tokens,
           "load_avg_1m_start": os.getloadavg()[0], "regions": list(REGIONS), "cases": {}}
    for spec in a.drafters.split(","):
        r = resolve_drafter(spec, tgt, store=model_store())
        d = r.drafter if isinstance(r.drafter, specdec.NgramDrafter) else specdec.ModelDrafter(r.drafter.eval())
        for name, (ids, pid, cat) in cases.items():
            res = profile_case(tgt.model, d, ids, a.k, a.new_tokens)
            res.update(prompt_id=pid, category=cat)
            out["cases"][f"{spec}/{name}"] = res
            print(spec, name, len(ids), "step", res["per_step_wall_ms"], "ms, outside forwards",
                  res["outside_forwards_wall_ms_per_step"], "ms", flush=True)
    out["load_avg_1m_end"] = os.getloadavg()[0]
    a.out_dir.mkdir(parents=True, exist_ok=True)
    path = a.out_dir / f"{out['date']}-step-profile-{a.label}-cpu.json"
    path.write_text(json.dumps(out, indent=1))
    print("written", path)
    return 0


def markdown(before: dict, after: dict) -> str:
    """A before/after table per case: per-step counts (load-independent) and times by region."""
    lines = [f"# Per-step profile, before / after ({after['date']})", "",
             f"CPU {after['cpu']} ({after['logical_cpus']} logical CPUs, torch threads {after['torch_threads']}); "
             f"k = {after['k']}, {after['new_tokens']} new tokens, greedy, SmolLM2-135M-Instruct fp32 target. "
             f"1-minute load: before {before['load_avg_1m_start']:.2f}-{before['load_avg_1m_end']:.2f}, "
             f"after {after['load_avg_1m_start']:.2f}-{after['load_avg_1m_end']:.2f} (shared machine: times are "
             "load dependent; counts and allocated MB are not).", ""]
    for case, a in after["cases"].items():
        b = before["cases"].get(case)
        if b is None:
            continue
        same = "identical" if a["token_ids"] == b["token_ids"] else "DIFFERENT"
        lines += [f"## {case}: {a['prompt_tokens']}-token prompt ({a['category']}), {a['decode_steps']} decode steps, "
                  f"output tokens {same}", "",
                  "| region | ops/step | allocs/step | alloc MB/step | copies/step | host syncs/step | wall ms/step | cpu ms/step |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in REGIONS:
            x, y = b["per_step"][r], a["per_step"][r]
            lines.append(f"| {r} | {x['ops']} → {y['ops']} | {x['allocs']} → {y['allocs']} | {x['alloc_mb']:.1f} → "
                         f"{y['alloc_mb']:.1f} | {x['copies']} → {y['copies']} | {x['host_syncs']} → {y['host_syncs']} | "
                         f"{x['wall_ms']:.1f} → {y['wall_ms']:.1f} | {x['cpu_ms']:.1f} → {y['cpu_ms']:.1f} |")
        lines += ["", f"Step wall ms {b['per_step_wall_ms']:.1f} → {a['per_step_wall_ms']:.1f}; outside the two models' "
                      f"forwards {b['outside_forwards_wall_ms_per_step']:.1f} → {a['outside_forwards_wall_ms_per_step']:.1f} "
                      f"ms/step (load {b['load_avg_1m']} / {a['load_avg_1m']}).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
