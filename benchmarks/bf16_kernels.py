"""Which CPU kernel a bf16 draft's one-token pass should use: oneDNN (PyTorch's default) or ATen's GEMV.

Measures, with a warm KV cache, the median wall time of one decode pass (1 query token) of the fp32
SmolLM2 target and of its bf16 copy, with oneDNN enabled and disabled (``torch.backends.mkldnn``),
plus the target's (k+1)-token verification pass, and single ``F.linear`` calls of the model's shapes
for 1..512 rows. Rounds alternate so a slow moment of the machine hits both settings.

Writes ``benchmarks/results/bf16_kernels.json`` and ``.md`` (the numbers behind
``specdec/models/cpu_kernels.py``). Usage::

    .venv/bin/python benchmarks/bf16_kernels.py [--rounds 3] [--steps 40] [--threads 2]
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def _median_ms(fn, n: int) -> float:
    ts = []
    for _ in range(n):
        s = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - s)
    return statistics.median(ts) * 1e3


def decode_pass_ms(model, width: int, steps: int, context: int = 100, mkldnn: bool = True) -> float:
    """Median ms of a ``width``-token pass after a ``context``-token prefill (KV cache grows)."""
    from transformers.cache_utils import DynamicCache

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 49000, (1, context), generator=g)
    x = torch.randint(0, 49000, (1, width), generator=g)
    with torch.inference_mode(), torch.backends.mkldnn.flags(enabled=mkldnn):
        cache = DynamicCache()
        model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        for _ in range(3):
            model(x, past_key_values=cache, use_cache=True, logits_to_keep=width)
        return _median_ms(lambda: model(x, past_key_values=cache, use_cache=True, logits_to_keep=width), steps)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--k", type=int, default=5, help="verification pass width is k+1")
    ap.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    from specdec.models import load_causal_lm
    from specdec.settings import model_store

    target = load_causal_lm("smollm2", dtype="float32", device="cpu", store=model_store()).model
    draft = copy.deepcopy(target).to(torch.bfloat16).eval()  # plain cast: no kernel switch installed
    rows = []
    for r in range(a.rounds):
        row = {}
        for on in ((True, False) if r % 2 == 0 else (False, True)):
            tag = "on" if on else "off"
            row[f"target_1tok_ms_{tag}"] = decode_pass_ms(target, 1, a.steps, mkldnn=on)
            row[f"draft_bf16_1tok_ms_{tag}"] = decode_pass_ms(draft, 1, a.steps, mkldnn=on)
            row[f"target_{a.k + 1}tok_ms_{tag}"] = decode_pass_ms(target, a.k + 1, a.steps, mkldnn=on)
        rows.append(row)
        print(json.dumps({k: round(v, 1) for k, v in row.items()}), flush=True)
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    # the core's choice: oneDNN for the target and multi-row passes, off for the draft's one-row pass
    c_default = med["draft_bf16_1tok_ms_on"] / med["target_1tok_ms_on"]
    c_chosen = med["draft_bf16_1tok_ms_off"] / med["target_1tok_ms_on"]
    linear = []
    for rows_n in (1, 2, 4, 8, 16, 64, 512):
        for out_f, in_f in ((1536, 576), (576, 1536), (49152, 576)):
            w = torch.randn(out_f, in_f).bfloat16()
            x = torch.randn(1, rows_n, in_f).bfloat16()
            n = 200 if rows_n <= 8 and out_f < 4096 else 10
            res = {}
            for on in (True, False):
                with torch.backends.mkldnn.flags(enabled=on):
                    F.linear(x, w)
                    res["on" if on else "off"] = _median_ms(lambda: F.linear(x, w), n) * 1e3
            linear.append({"rows": rows_n, "shape": [out_f, in_f], "onednn_us": res["on"], "aten_us": res["off"]})
    out = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__, "threads": a.threads, "cpu_count": os.cpu_count(),
        "load_avg": list(os.getloadavg()), "rounds": rows, "median": med,
        "cost_ratio_onednn": c_default, "cost_ratio_aten_gemv": c_chosen,
        "linear_bf16": linear,
    }
    od = Path(a.out_dir)
    od.mkdir(parents=True, exist_ok=True)
    (od / "bf16_kernels.json").write_text(json.dumps(out, indent=1))
    md = ["# bf16 draft on the CPU: oneDNN vs ATen's GEMV for one-token passes", "",
          f"{out['date']}, torch {torch.__version__}, {a.threads} threads, load avg at the end "
          f"{', '.join(f'{x:.2f}' for x in out['load_avg'])}; SmolLM2-135M-Instruct, warm KV cache of 100 tokens; "
          f"medians of {a.rounds} alternating rounds x {a.steps} passes. Written by `benchmarks/bf16_kernels.py`.", "",
          "| pass | oneDNN on (ms) | oneDNN off (ms) |", "|---|---|---|"]
    for name, key in (("fp32 target, 1 token", "target_1tok_ms"), ("bf16 draft, 1 token", "draft_bf16_1tok_ms"),
                      (f"fp32 target, {a.k + 1} tokens", f"target_{a.k + 1}tok_ms")):
        md.append(f"| {name} | {med[key + '_on']:.1f} | {med[key + '_off']:.1f} |")
    md += ["", f"Cost ratio c = draft pass / target pass: **{c_default:.2f}** with oneDNN (PyTorch's default), "
           f"**{c_chosen:.2f}** with the core's choice (draft one-row passes on ATen's GEMV).", "",
           "Single bf16 `F.linear` calls (µs):", "", "| rows | weight | oneDNN | ATen |", "|---|---|---|---|"]
    md += [f"| {r['rows']} | {r['shape'][0]}x{r['shape'][1]} | {r['onednn_us']:.0f} | {r['aten_us']:.0f} |" for r in linear]
    md += ["", "ATen wins only for one row; from two rows on oneDNN's blocked GEMM is faster, so the switch is per call."]
    (od / "bf16_kernels.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
