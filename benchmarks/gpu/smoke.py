"""Quick environment check for the remote GPU machine (run by device_stage.sh and device_run.sh; on the CPU by make test).

Imports everything specdec needs at runtime (the carried wheels: pydantic, pydantic-settings, gguf,
torchao), prints versions, then on a tiny random Llama (no download) checks on the chosen device:
greedy speculative decoding with derived drafts (``--kinds``, default int8 and int4) and a layer-skip
draft is token-identical to target-only decoding (strict in float32; the requested dtype is reported,
since bf16 block verification may flip near-ties), B = 2 rows equal single-row runs, the KV-cache
forward/crop API of the installed transformers works, and static passes (plus CUDA graphs on CUDA)
give the eager tokens (with the one-token pass time per mode). Exits non-zero on a failed import or
strict check. ``make test`` runs it on the CPU (tests/benchmarks/test_gpu_smoke.py).

Usage: python3 benchmarks/gpu/smoke.py [--device cuda] [--dtype bfloat16] [--kinds int8,int4]
"""

from __future__ import annotations

import argparse
import sys
import time
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # tests.support.models (the tiny model) lives in the repository
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--kinds", default="int8,int4", help="derived precisions checked (comma-separated)")
    args = ap.parse_args()
    t0 = time.perf_counter()

    import torch

    pkgs = ("torch", "transformers", "tokenizers", "huggingface-hub", "accelerate", "safetensors",
            "gguf", "torchao", "pydantic", "pydantic-core", "pydantic-settings", "typing-extensions",
            "filelock", "numpy", "scipy", "typer", "rich")
    print("versions:", ", ".join(f"{p}={_ver(p)}" for p in pkgs), flush=True)

    import gguf  # noqa: F401  (transformers' gguf_file= loader)
    import pydantic_settings  # noqa: F401
    from torchao.quantization import Int8WeightOnlyConfig, IntxWeightOnlyConfig  # noqa: F401
    from torchao.quantization.granularity import PerGroup  # noqa: F401
    from transformers.utils.import_utils import is_gguf_available

    from specdec import autoregressive_generate, speculative_generate
    from specdec.models.derived import DerivedDraftRecipe, derive_draft
    from specdec.models.layerskip import LayerSkipRecipe, derive_layerskip
    from specdec.core.kv import crop_cache, forward_tokens, new_cache
    from specdec.core.config import SamplingConfig
    from specdec.settings import get_settings
    from tests.support.models import tiny_llama

    assert is_gguf_available(), "transformers does not see the gguf package"
    s = get_settings()
    print(f"specdec settings: home={s.home} models_dir={s.models_dir}", flush=True)
    if args.device.startswith("cuda"):
        assert torch.cuda.is_available(), "CUDA not available"
        print("gpu:", torch.cuda.get_device_name(), flush=True)
    dtype = getattr(torch, args.dtype)

    failures = 0
    for dt in dict.fromkeys([torch.float32, dtype]):  # strict in fp32; the requested dtype reported
        strict = dt == torch.float32
        target = tiny_llama(103, seed=0, hidden_size=64).to(args.device, dt).eval()
        # KV-cache API: forward 5 tokens, crop to 3, forward 2 more == fresh forward of those 5
        ids = [5, 6, 7, 8, 9]
        cache = new_cache(target)
        forward_tokens(target, ids, cache)
        crop_cache(cache, 3)
        assert cache.get_seq_length() == 3, cache.get_seq_length()
        a = forward_tokens(target, [20, 21], cache)[-1].float()
        b = forward_tokens(target, ids[:3] + [20, 21], new_cache(target))[-1].float()
        err = (a - b).abs().max().item()
        print(f"[{dt}] cache crop/forward max |diff| = {err:.2e}", flush=True)
        if strict and err > 1e-3:
            failures += 1

        prompt = torch.tensor([[1, 10, 11, 12, 13]], device=args.device)
        greedy = SamplingConfig(temperature=0.0)
        ref = autoregressive_generate(target, prompt, max_new_tokens=24, sampling=greedy).token_ids
        for kind in [k for k in args.kinds.split(",") if k]:
            draft = derive_draft(target, DerivedDraftRecipe(kind=kind))
            out = speculative_generate(target, draft, prompt, num_speculative_tokens=4, max_new_tokens=24,
                                       sampling=greedy)
            ok = out.token_ids == ref
            print(f"[{dt}] derived:{kind} greedy token-identical={ok} stats={out.stats}", flush=True)
            if not ok:
                print(f"  ref={ref}\n  got={out.token_ids}", flush=True)
                failures += strict
        draft = derive_layerskip(target, LayerSkipRecipe(num_layers=1))
        out = speculative_generate(target, draft, prompt, num_speculative_tokens=4, max_new_tokens=24, sampling=greedy)
        print(f"[{dt}] layerskip:1 greedy token-identical={out.token_ids == ref} stats={out.stats}", flush=True)
        failures += strict and out.token_ids != ref
        failures += _batch_check(target, draft, greedy, args.device, strict)
        failures += _passes_check(target, draft, prompt, greedy, strict)
    if failures:
        print(f"smoke FAILED ({failures} strict check(s))", flush=True)
        return 1
    print(f"smoke OK in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


def _batch_check(target, draft, greedy, device, strict) -> int:
    """B=2 left-padded greedy speculative decoding == each row alone (only if specdec.core.batch exists)."""
    import importlib.util

    import torch

    from specdec import speculative_generate

    if importlib.util.find_spec("specdec.core.batch") is None:
        return 0
    rows = [[1, 10, 11, 12, 13], [1, 40, 41]]
    width = max(map(len, rows))
    ids = torch.tensor([[3] * (width - len(r)) + r for r in rows], device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
    try:
        out = speculative_generate(target, draft, ids, mask, num_speculative_tokens=4, max_new_tokens=16,
                                   sampling=greedy)
        single = [speculative_generate(target, draft, torch.tensor([r], device=device), num_speculative_tokens=4,
                                       max_new_tokens=16, sampling=greedy).token_ids for r in rows]
        ok = [r.token_ids for r in out.rows] == single
    except Exception as e:  # report, do not hide: batch.py is new
        print(f"[{target.dtype}] batch B=2 raised {type(e).__name__}: {e}", flush=True)
        return int(strict)
    print(f"[{target.dtype}] batch B=2 rows == single-row runs: {ok}", flush=True)
    return int(strict and not ok)


def _passes_check(target, draft, prompt, greedy, strict) -> int:
    """Static passes (and CUDA graphs on CUDA) give the eager tokens, target-only and speculative; prints the
    one-token target pass per mode (median of 20 after 5 warm ones) and the graph replay/capture counters."""
    import torch

    from specdec import autoregressive_generate, speculative_generate
    from specdec.core.kv import forward_tokens, new_cache, now
    from specdec.core.static import passes_of, use_passes

    def run():
        ref = autoregressive_generate(target, prompt, max_new_tokens=24, sampling=greedy).token_ids
        spec = speculative_generate(target, draft, prompt, num_speculative_tokens=4, max_new_tokens=24,
                                    sampling=greedy).token_ids
        return ref, spec

    def one_token_ms() -> float:
        cache = new_cache(target, static=True, need=64)
        forward_tokens(target, prompt[0].tolist(), cache, logits_to_keep=1)
        times = []
        for i in range(25):
            t0 = now(target.device)
            forward_tokens(target, [7], cache, logits_to_keep=1)
            times.append(now(target.device) - t0)
            cache.crop(-1)
        return sorted(times[5:])[len(times[5:]) // 2] * 1e3

    failures = 0
    modes = ["eager", "static"] + (["graphs"] if target.device.type == "cuda" else [])
    base = None
    for mode in modes:
        use_passes(target, mode, max_len=128)
        use_passes(draft, mode, max_len=128)
        got = run()
        base = base or got
        same = got == base and got[0] == got[1]
        p = passes_of(target)
        counters = "" if p is None else f" replays={p.replays} uncaptured={p.uncaptured} failures={p.failures}"
        print(f"[{target.dtype}] passes={mode} token-identical to eager={same} one-token target pass "
              f"{one_token_ms():.3f} ms{counters}", flush=True)
        failures += strict and not same
    use_passes(target, "eager")
    use_passes(draft, "eager")
    return int(failures)


def _ver(pkg: str) -> str:
    try:
        return version(pkg)
    except Exception:
        return "MISSING"


if __name__ == "__main__":
    sys.exit(main())
