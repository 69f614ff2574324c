"""Profile our speculative-decoding step loop (``benchmarks/perf.py --profile``).

Two views of the same short generation:

* ``torch.profiler`` (CPU, plus CUDA when the model is on a GPU): the top operators by self time,
  and the counts that reveal loop overheads: host syncs (``aten::item`` /
  ``aten::_local_scalar_dense``), KV-cache copies (``aten::cat`` / ``aten::copy_``), small
  tensors built from Python lists (``aten::lift_fresh`` / ``aten::to``), vocabulary-sized work
  (``aten::one_hot``, ``aten::softmax``), and how much of the time is the models' matmuls.
* ``cProfile``: the Python functions of the loop by own time (the drafter lookup, verification,
  bookkeeping), which ``torch.profiler`` does not attribute.

py-spy (optional, not a dependency) gives the same Python view without instrumentation:
``py-spy record -o loop.svg -- python benchmarks/perf.py --quick ...``.
"""

from __future__ import annotations

import cProfile
import io
import pstats
from typing import Any

import torch

from perf_methods import GREEDY, NgramDrafter, device_of, make_our_drafter, run_hf, sync, timed
from specdec import speculative_generate

_MATMUL = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear",
           "aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu",
           "aten::_weight_int8pack_mm", "aten::_weight_int4pack_mm", "aten::_weight_int4pack_mm_for_cpu")
_WATCH = {
    "host_syncs": ("aten::item", "aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaDeviceSynchronize",
                   "cudaMemcpyAsync"),
    "cache_copies": ("aten::cat", "aten::copy_", "aten::clone", "aten::slice_scatter"),
    "python_list_to_tensor": ("aten::lift_fresh", "aten::lift_fresh_copy", "aten::tensor"),
    "vocab_sized": ("aten::one_hot", "aten::softmax", "aten::_softmax", "aten::argmax", "aten::zeros", "aten::index_put_"),
}


def _ms(us: float) -> float:
    return round(us / 1000.0, 3)


class _ForwardRanges:
    """Forward pre/post hooks on the models: wall time inside each model's forward (device synced)
    and, under ``torch.profiler``, a ``record_function`` range per call so every op can be
    attributed to 'target forward', 'draft forward' or the decoding loop itself."""

    def __init__(self, models: dict, device, label: bool) -> None:
        self.models, self.device, self.label = models, device, label
        self.seconds = {name: 0.0 for name in models}
        self.calls = {name: 0 for name in models}
        self.handles: list = []
        self._open: dict = {}

    def __enter__(self):
        import time

        for name, m in self.models.items():
            def pre(mod, args, name=name):
                sync(self.device)
                rf = None
                if self.label:
                    rf = torch.autograd.profiler.record_function(f"##{name}_forward")
                    rf.__enter__()
                self._open[name] = (time.perf_counter(), rf)

            def post(mod, args, out, name=name):
                sync(self.device)
                t0, rf = self._open.pop(name)
                if rf is not None:
                    rf.__exit__(None, None, None)
                self.seconds[name] += time.perf_counter() - t0
                self.calls[name] += 1

            self.handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
        return self

    def __exit__(self, *exc) -> None:
        for h in self.handles:
            h.remove()


def _where(ev, memo: dict) -> str:
    """'target' / 'draft' if ``ev`` runs inside that model's forward range, else 'loop'."""
    chain = []
    e, found = ev, "loop"
    while e is not None:
        if id(e) in memo:
            found = memo[id(e)]
            break
        chain.append(e)
        if e.name.startswith("##") and e.name.endswith("_forward"):
            found = e.name[2:-8]
            break
        e = e.cpu_parent
    for c in chain:
        memo[id(c)] = found
    return found


def profile_ours(target, draft_obj, ids: torch.Tensor, k: int, max_new_tokens: int, eos, top: int = 20) -> dict:
    """Run our speculative decoding twice under the profilers; return a JSON-ready summary.

    Args:
        target: causal LM; draft_obj: draft model or NgramDrafter; ids: LongTensor ``[1, L]``.
        k, max_new_tokens, eos: as in the benchmark.
    Returns:
        ``{"steps", "new_tokens", "wall_s", "top_ops": [...], "watch": {...}, "model_matmul_share",
        "python_top": [...]}``; times in milliseconds.
    """
    from torch.profiler import ProfilerActivity, profile

    dev = device_of(target)
    drafter = make_our_drafter(draft_obj)

    def go():
        return speculative_generate(target, drafter, ids, num_speculative_tokens=k, max_new_tokens=max_new_tokens,
                                    sampling=GREEDY, eos_token_id=eos)

    go()  # warm
    models = {"target": target}
    if getattr(drafter, "model", None) is not None:  # ModelDrafter (the n-gram drafter has no model)
        models["draft"] = drafter.model
    # 1) wall time split: inside the target's forwards, inside the draft's, and the rest (our loop)
    with _ForwardRanges(models, dev, label=False) as fr:
        res0, wall0 = timed(go, dev)
    split = {"wall_ms": round(wall0 * 1e3, 3)}
    for name in models:
        split[f"{name}_forward_ms"] = round(fr.seconds[name] * 1e3, 3)
        split[f"{name}_forward_calls"] = fr.calls[name]
    loop_s = wall0 - sum(fr.seconds.values())
    split["loop_overhead_ms"] = round(loop_s * 1e3, 3)
    split["loop_overhead_share"] = round(loop_s / wall0, 4) if wall0 else None
    split["loop_overhead_ms_per_step"] = round(loop_s * 1e3 / max(1, res0.stats.target_forward_passes), 3)
    # 2) operators, attributed to target forward / draft forward / loop
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with _ForwardRanges(models, dev, label=True), profile(activities=acts, record_shapes=False) as prof:
        res, wall = timed(go, dev)
    sync(dev)
    st = res.stats
    steps = max(1, st.target_forward_passes)
    avgs = [e for e in prof.key_averages() if not e.key.startswith("##")]  # our labelling ranges
    total_self = sum(e.self_cpu_time_total for e in avgs) or 1.0
    rows = sorted(avgs, key=lambda e: e.self_cpu_time_total, reverse=True)
    top_ops = []
    for e in rows[:top]:
        row = {"op": e.key, "calls": e.count, "self_cpu_ms": _ms(e.self_cpu_time_total),
               "self_cpu_share": round(e.self_cpu_time_total / total_self, 4), "calls_per_step": round(e.count / steps, 2)}
        dev_t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", None)
        if dev.type == "cuda" and dev_t is not None:
            row["self_device_ms"] = _ms(dev_t)
        top_ops.append(row)
    by_key = {e.key: e for e in avgs}
    watch: dict[str, Any] = {}
    for name, keys in _WATCH.items():
        hit = [by_key[kk] for kk in keys if kk in by_key]
        watch[name] = {
            "ops": {e.key: {"calls": e.count, "calls_per_step": round(e.count / steps, 2), "self_cpu_ms": _ms(e.self_cpu_time_total)} for e in hit},
            "self_cpu_ms": _ms(sum(e.self_cpu_time_total for e in hit)),
            "self_cpu_share": round(sum(e.self_cpu_time_total for e in hit) / total_self, 4),
        }
    mm = sum(by_key[kk].self_cpu_time_total for kk in _MATMUL if kk in by_key)
    memo: dict = {}
    where: dict[str, dict[str, list]] = {}
    for ev in prof.events():
        if ev.name.startswith("##") or "CPU" not in str(getattr(ev, "device_type", "CPU")):
            continue  # our labels; GPU kernels (their time is device time, attributed by their CPU launches)
        w = _where(ev, memo)
        agg = where.setdefault(w, {}).setdefault(ev.name, [0, 0.0])
        agg[0] += 1
        agg[1] += ev.self_cpu_time_total
    for name, keys in _WATCH.items():
        watch[name]["by_region"] = {
            w: {"calls_per_step": round(sum(ops.get(kk, [0, 0.0])[0] for kk in keys) / steps, 2),
                "self_cpu_ms": _ms(sum(ops.get(kk, [0, 0.0])[1] for kk in keys))}
            for w, ops in where.items()
        }
    attributed = {}
    for w, ops in where.items():
        tot = sum(v[1] for v in ops.values())
        top_w = sorted(ops.items(), key=lambda kv: kv[1][1], reverse=True)[:top]
        attributed[w] = {
            "self_cpu_ms": _ms(tot),
            "self_cpu_share": round(tot / total_self, 4),
            "top_ops": [{"op": n, "calls": c, "calls_per_step": round(c / steps, 2), "self_cpu_ms": _ms(t)} for n, (c, t) in top_w],
        }

    pr = cProfile.Profile()
    pr.enable()
    res2, wall2 = timed(go, dev)
    pr.disable()
    s = io.StringIO()
    ps = pstats.Stats(pr, stream=s)
    py_rows = []
    for (fname, line, func), (cc, nc, tt, ct, _) in sorted(ps.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]:
        short = fname.split("site-packages/")[-1].split("/work/main/")[-1]
        py_rows.append({"function": f"{short}:{line}({func})", "calls": nc, "calls_per_step": round(nc / steps, 2),
                        "own_ms": round(tt * 1e3, 3), "cumulative_ms": round(ct * 1e3, 3)})
    spec_funcs = {}
    for (fname, line, func), (cc, nc, tt, ct, _) in ps.stats.items():
        if "/specdec/" in fname and func in ("propose", "lookup", "verify_block", "logits_to_probs", "sample",
                                             "forward_tokens", "crop_cache", "speculative_generate", "accept"):
            key = f"{fname.split('/specdec/')[-1]}:{func}"
            spec_funcs[key] = {"calls": nc, "own_ms": round(tt * 1e3, 3), "cumulative_ms": round(ct * 1e3, 3)}
    return {
        "new_tokens": len(res.token_ids),
        "target_forward_passes": st.target_forward_passes,
        "draft_forward_passes": st.draft_forward_passes,
        "steps": steps,
        "wall_s_under_torch_profiler": round(wall, 4),
        "wall_s_under_cprofile": round(wall2, 4),
        "profiled_self_cpu_ms": _ms(total_self),
        "model_matmul_self_cpu_share": round(mm / total_self, 4),
        "wall_split": split,
        "ops_by_region": attributed,
        "top_ops": top_ops,
        "watch": watch,
        "python_top_by_own_time": py_rows,
        "specdec_functions": spec_funcs,
    }


def wall_split_hf(target, draft_obj, ids: torch.Tensor, k: int, max_new_tokens: int, eos, pad_id) -> dict:
    """The same wall split (target forwards / draft forwards / the rest) for HF assisted generation,
    to compare its per-step overhead with ours."""
    dev = device_of(target)
    models = {"target": target}
    if not isinstance(draft_obj, NgramDrafter):
        models["draft"] = draft_obj
    run_hf(target, draft_obj, ids, k, max_new_tokens, eos, pad_id)  # warm
    with _ForwardRanges(models, dev, label=False) as fr:
        r = run_hf(target, draft_obj, ids, k, max_new_tokens, eos, pad_id)
    out = {"wall_ms": round(r.seconds * 1e3, 3), "new_tokens": len(r.tokens)}
    for name in models:
        out[f"{name}_forward_ms"] = round(fr.seconds[name] * 1e3, 3)
        out[f"{name}_forward_calls"] = fr.calls[name]
    rest = r.seconds - sum(fr.seconds.values())
    out["loop_overhead_ms"] = round(rest * 1e3, 3)
    out["loop_overhead_share"] = round(rest / r.seconds, 4) if r.seconds else None
    out["loop_overhead_ms_per_step"] = round(rest * 1e3 / max(1, fr.calls["target"]), 3)
    return out
