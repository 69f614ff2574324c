"""One base, N LoRA adapters: what loading the base once and merging each adapter into a copy costs, against PEFT's
unmerged path (the adapter's A/B kept beside the base weights, switched with ``set_adapter`` or chosen per row with
``adapter_names``).

On SmolLM2-135M-Instruct (fp32, CPU, from ``specdec model fetch``'s store) with N rank-``r`` adapters on
``q_proj,k_proj,v_proj,o_proj`` (B non-zero, saved by ``peft``), measures:

- base load seconds (:func:`specdec.models.load_causal_lm`, median of 3) and, per adapter,
  :func:`specdec.models.adapters.attach_adapter` seconds and the bytes the adapted copy owns (the rest is shared);
- one-token decode pass (warm KV cache of 100 tokens, median) of the merged copy, of the PEFT model with the adapter
  active (unmerged), and a 4-row batch with PEFT's per-row ``adapter_names`` (4 adapters in one forward) against
  the merged copy at batch 4;
- whether the unmerged path is the merged model: max |logit difference| and greedy tokens (32) agreeing.

Writes ``benchmarks/results/<date>-adapter-attach-cpu.json`` and ``.md``. Usage::

    .venv/bin/python benchmarks/adapter_attach.py [--adapters 4] [--rank 16] [--steps 30]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

MODULES = ["q_proj", "k_proj", "v_proj", "o_proj"]


def _median_s(fn, n: int) -> float:
    ts = []
    for _ in range(n):
        s = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - s)
    return statistics.median(ts)


def make_adapters(base_dir: Path, out: Path, n: int, rank: int) -> list[Path]:
    """``n`` PEFT LoRA adapters of the checkpoint ``base_dir`` (B ~ N(0, 0.02), seeds 0..n-1) under ``out``."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    dirs = []
    for i in range(n):
        model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
        pm = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=MODULES, lora_dropout=0.0))
        g = torch.Generator().manual_seed(i)
        with torch.no_grad():
            for name, p in pm.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.02)
        pm.save_pretrained(out / f"adapter-{i}")
        dirs.append(out / f"adapter-{i}")
    return dirs


def decode_pass_s(model, batch: int, steps: int, **kw) -> float:
    """Median seconds of a one-token pass at ``batch`` rows after a 100-token prefill (``kw`` to every forward)."""
    from transformers.cache_utils import DynamicCache

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 49000, (batch, 100), generator=g)
    x = torch.randint(0, 49000, (batch, 1), generator=g)
    with torch.inference_mode():
        cache = DynamicCache()
        model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1, **kw)
        model(x, past_key_values=cache, use_cache=True, logits_to_keep=1, **kw)
        return _median_s(lambda: model(x, past_key_values=cache, use_cache=True, logits_to_keep=1, **kw), steps)


def greedy(model, ids: torch.Tensor, n: int) -> list[int]:
    """``n`` greedy tokens of ``model`` after ``ids`` (no cache: the same arithmetic on both sides)."""
    print(f"greedy {n} tokens of {type(model).__name__}", file=sys.stderr, flush=True)
    out = ids
    with torch.inference_mode():
        for _ in range(n):
            out = torch.cat([out, model(out).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return out[0, ids.shape[1]:].tolist()


def measure_loads(store, adapters: list[Path]) -> dict:
    """Base load seconds (median of 3) and each adapter's attach seconds and owned bytes."""
    from specdec.models import load_causal_lm
    from specdec.models.adapters import attach_adapter

    base_s = _median_s(lambda: load_causal_lm("smollm2", store=store, dtype="float32", device="cpu"), 3)
    base = load_causal_lm("smollm2", store=store, dtype="float32", device="cpu")
    shared = {t.data_ptr() for t in base.model.parameters()}
    rows, adapted = [], []
    for d in adapters:
        s = time.perf_counter()
        a = attach_adapter(base, d)
        secs = time.perf_counter() - s
        owned = sum(t.numel() * t.element_size() for t in a.model.parameters() if t.data_ptr() not in shared)
        rows.append({"adapter": d.name, "attach_s": secs, "owned_bytes": owned})
        adapted.append(a)
    total = sum(t.numel() * t.element_size() for t in base.model.parameters())
    return {"base_load_s": base_s, "base_bytes": total, "adapters": rows}, base, adapted


def measure_paths(base, adapted, adapters: list[Path], steps: int) -> dict:
    """Decode-pass seconds merged vs PEFT unmerged (B = 1 and B = 4 with per-row ``adapter_names``) and whether
    the unmerged path equals the merged model."""
    import copy

    from peft import PeftModel

    peft_model = PeftModel.from_pretrained(copy.deepcopy(base.model), str(adapters[0]), adapter_name="a0")
    for i, d in enumerate(adapters[1:], 1):
        peft_model.load_adapter(str(d), adapter_name=f"a{i}")
    peft_model.set_adapter("a0")
    peft_model.eval()
    names = [f"a{i % len(adapters)}" for i in range(4)]
    ids = torch.tensor([base.tokenizer.encode("The history of the sea, told in three short sentences:")])
    with torch.inference_mode():
        diff = (peft_model(ids).logits - adapted[0].model(ids).logits).abs().max().item()
    tok_merged, tok_unmerged = greedy(adapted[0].model, ids, 32), greedy(peft_model, ids, 32)
    return {
        "merged_b1_s": decode_pass_s(adapted[0].model, 1, steps),
        "unmerged_b1_s": decode_pass_s(peft_model, 1, steps),
        "merged_b4_s": decode_pass_s(adapted[0].model, 4, steps),
        "unmerged_b4_adapter_names_s": decode_pass_s(peft_model, 4, steps, adapter_names=names),
        "max_abs_logit_diff_unmerged_vs_merged": diff,
        "greedy_tokens_agree_of_32": sum(a == b for a, b in zip(tok_merged, tok_unmerged)),
        "first_greedy_divergence": next((i for i, (a, b) in enumerate(zip(tok_merged, tok_unmerged)) if a != b), None),
    }


def write(result: dict, out_dir: Path) -> Path:
    """``<date>-adapter-attach-cpu.json`` and ``.md`` in ``out_dir``; returns the JSON path."""
    stem = out_dir / f"{dt.date.today().isoformat()}-adapter-attach-cpu"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    L, P = result["loads"], result["paths"]
    attach = [r["attach_s"] for r in L["adapters"]]
    md = [f"# One base, {len(attach)} LoRA adapters (SmolLM2-135M fp32, CPU, rank {result['rank']})", "",
          f"`{result['command']}` on {result['machine']}", "",
          "| what | value |", "| --- | --- |",
          f"| base load (median of 3) | {L['base_load_s']:.2f} s |",
          f"| attach (merge into a copy) per adapter, median | {statistics.median(attach):.3f} s |",
          f"| bytes an adapted copy owns / base bytes | {L['adapters'][0]['owned_bytes'] / 2**20:.1f} MiB / "
          f"{L['base_bytes'] / 2**20:.1f} MiB |",
          f"| one-token pass, merged, B=1 | {P['merged_b1_s'] * 1e3:.1f} ms |",
          f"| one-token pass, PEFT unmerged, B=1 | {P['unmerged_b1_s'] * 1e3:.1f} ms |",
          f"| one-token pass, merged, B=4 | {P['merged_b4_s'] * 1e3:.1f} ms |",
          f"| one-token pass, PEFT per-row adapter_names (4 adapters), B=4 | "
          f"{P['unmerged_b4_adapter_names_s'] * 1e3:.1f} ms |",
          f"| max abs logit difference, unmerged vs merged | {P['max_abs_logit_diff_unmerged_vs_merged']:.2e} |",
          f"| greedy tokens equal (of 32), unmerged vs merged | {P['greedy_tokens_agree_of_32']} |"]
    stem.with_suffix(".md").write_text("\n".join(md) + "\n")
    return stem.with_suffix(".json")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    from specdec.models.resolve import fetch_smollm2
    from specdec.settings import model_store
    from specdec.validation.machine import cpu_model

    store = model_store()
    with tempfile.TemporaryDirectory() as tmp:
        adapters = make_adapters(fetch_smollm2(store), Path(tmp), a.adapters, a.rank)
        print(f"{len(adapters)} adapters saved; loading", file=sys.stderr, flush=True)
        loads, base, adapted = measure_loads(store, adapters)
        print(f"loads: {loads}; timing the paths", file=sys.stderr, flush=True)
        paths = measure_paths(base, adapted, adapters, a.steps)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    result = {"command": "python benchmarks/adapter_attach.py " + " ".join(argv or sys.argv[1:]), "rank": a.rank,
              "machine": f"{cpu_model()}, {a.threads} threads, torch {torch.__version__}", "loads": loads,
              "paths": paths}
    print(write(result, a.out_dir).with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
