"""Replay vs decoding validation (issue 13): p3_replay, p3_replay_cold, replay_decode_agreement.

For each drafter, on the same stratified Spec-Bench prompts (48 over 6 categories by default,
64 new tokens, greedy, k = 4, fp32 SmolLM2 target):

1. ``both`` with ``decode_fraction = 1`` and an EMPTY continuation cache: the cold replay (the
   core produces every continuation, then one teacher-forced draft pass per prompt) followed by the
   full decoding validation of every prompt (target-only + speculative + teacher forcing + audit),
   and their agreement (every disagreement named with its logit margin);
2. ``replay`` twice more with the now-warm cache: the re-run night (the faster of the two counts).

    p3_replay      = warm replay seconds / decoding-validation seconds   (target <= 0.1)
    p3_replay_cold = cold replay seconds / decoding-validation seconds   (target <= 0.6)

Seconds are wall seconds of the whole call (model hashing, continuations, passes, bootstrap).
The 480-prompt re-run night is measured with ``--night`` (warm replay of every Spec-Bench prompt,
continuations produced first, untimed) or extrapolated from the warm seconds per prompt.
Writes ``benchmarks/results/<date>-replay-cpu.json`` and merges ``p3_replay``, ``p3_replay_cold``
and ``replay_decode_agreement`` into the newest speed-benchmark result (``<date>-cpu[-<tag>].json``).

Usage::

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/replay_bench.py --target smollm2 --drafts derived:bf16,derived:int8
    .venv/bin/python benchmarks/replay_bench.py --limit 12 --drafts derived:int8      # quicker
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

from specdec.settings import model_store
from specdec.validation.report import nan_to_none

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def _load() -> list[float]:
    return list(os.getloadavg())


def bench_drafter(tgt, spec: str, heldout, config, cache_root: Path) -> dict:
    """Cold both (fraction 1) + warm replay for one drafter; returns the measurements."""
    from specdec.kinds import resolve_drafter
    from specdec.validation.api import ValidationRequest, validate
    from specdec.validation.continuation_cache import ContinuationCache

    drafter = resolve_drafter(spec, tgt, store=model_store())
    cache_dir = cache_root / spec.replace(":", "_")
    load0 = _load()
    t0 = time.perf_counter()
    phase_t: dict[str, float] = {}

    def tick(p) -> None:
        phase_t.setdefault(p.phase + "_start", time.perf_counter())
        phase_t[p.phase + "_end"] = time.perf_counter()
        print(f"  {spec} {p.phase} {p.done}/{p.total}", file=sys.stderr, flush=True)

    [both] = validate(ValidationRequest(tgt, [drafter], heldout, config, method="both", decode_fraction=1.0,
                                        cache=ContinuationCache(cache_dir), target_ref="smollm2", progress=tick))
    t_both = time.perf_counter() - t0
    cold = phase_t["replay_end"] - t0  # hash, continuations and the replay of every prompt (before decoding starts)
    decode = both.wall_seconds  # the decode measurement's own wall (warm-up included)
    load1 = _load()
    warm_runs = []
    for _ in range(2):  # two re-run nights; the faster one is less disturbed by other load on the machine
        t1 = time.perf_counter()
        [warm] = validate(ValidationRequest(tgt, [drafter], heldout, config, method="replay",
                                            cache=ContinuationCache(cache_dir), target_ref="smollm2"))
        warm_runs.append(time.perf_counter() - t1)
    t_warm = min(warm_runs)
    load2 = _load()
    r = both.replay
    return nan_to_none({
        "drafter": spec, "precision": r["precision"], "gate_method": r["gate_method"],
        "num_prompts": r["num_prompts_replayed"], "num_prompts_decoded": r["num_prompts_decoded"],
        "seconds": {"replay_cold": cold, "replay_warm": t_warm, "replay_warm_runs": warm_runs, "decode_validation": decode, "both_total": t_both,
                    "replay_section_cold": r["seconds"], "replay_section_warm": warm.replay["seconds"]},
        "p3_replay": t_warm / decode, "p3_replay_cold": cold / decode,
        "replay_decode_agreement": r["replay_decode_agreement"], "beyond_numerics": r["beyond_numerics"],
        "disagreements": r["disagreements"], "counters": r["counters"],
        "replay_inside_decode_ci": r["replay_inside_decode_ci"],
        "acceptance_by_k": r["acceptance_by_k"], "recommended_num_speculative_tokens": r["recommended_num_speculative_tokens"],
        "predicted_speedup_at_recommended": r["predicted_speedup_at_recommended"], "cost_ratio": r["cost_ratio"],
        "verify_cost_by_n": r.get("verify_cost_by_n"), "speedup_decoded": both.overall.speedup,
        "exactness_mismatches": both.overall.exactness_mismatches,
        "load_avg": {"before_both": load0, "after_both": load1, "after_warm": load2},
        "warm_continuations": warm.replay["continuations"],
    })


def night(tgt, spec: str, config, cache_root: Path, limit: int | None) -> dict:
    """The re-run night: every prompt's continuation produced (untimed), then a timed warm replay."""
    from specdec.kinds import resolve_drafter
    from specdec.validation.continuation_cache import ContinuationCache
    from specdec.validation.api import ValidationRequest, validate
    from specdec.validation.heldout import load_heldout

    hs = load_heldout("spec_bench")
    cfg = type(config)(config.speculative, seed=config.seed, limit=limit, bootstrap_resamples=config.bootstrap_resamples)
    drafter = resolve_drafter(spec, tgt, store=model_store())
    cache = ContinuationCache(cache_root / "night")
    t0 = time.perf_counter()
    validate(ValidationRequest(tgt, [drafter], hs, cfg, method="replay", cache=cache, target_ref="smollm2"))
    cold = time.perf_counter() - t0
    load0 = _load()
    t1 = time.perf_counter()
    [warm] = validate(ValidationRequest(tgt, [drafter], hs, cfg, method="replay", cache=cache, target_ref="smollm2"))
    return nan_to_none({"drafter": spec, "num_prompts": warm.replay["num_prompts_replayed"], "cold_seconds": cold,
                   "warm_seconds": time.perf_counter() - t1, "load_avg_before": load0, "load_avg_after": _load(),
                   "acceptance_k4": warm.overall.acceptance_rate})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--drafts", default="derived:bf16,derived:int8")
    ap.add_argument("--limit", type=int, default=48)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--night", action="store_true", help="also time the re-run night on --night-limit prompts")
    ap.add_argument("--night-limit", type=int, default=None, help="prompts of the night (default: all 480)")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    import torch

    from specdec.core.config import SamplingConfig, SpeculativeConfig
    from specdec.models import load_causal_lm
    from specdec.validation.config import ValidationConfig
    from specdec.validation.heldout import load_heldout

    torch.set_num_threads(os.cpu_count() or 1)
    tgt = load_causal_lm(args.target, dtype="float32", device="cpu", store=model_store())
    config = ValidationConfig(SpeculativeConfig(args.k, SamplingConfig(), args.max_new_tokens), limit=args.limit)
    heldout = load_heldout("spec_bench")
    date = dt.date.today().isoformat()
    out_path = RESULTS / f"{date}-replay-cpu{args.tag}.json"
    result = {"created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "config": {"target": args.target, "limit": args.limit, "max_new_tokens": args.max_new_tokens, "k": args.k,
                         "heldout": "spec_bench", "sampling": "greedy", "dtype": "float32", "device": "cpu"},
              "machine": {"nproc": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads()},
              "targets": {"p3_replay": 0.1, "p3_replay_cold": 0.6, "night_480_seconds": 600},
              "drafters": []}
    with tempfile.TemporaryDirectory() as tmp:
        for spec in [s for s in args.drafts.split(",") if s]:
            print(f"== {spec}", file=sys.stderr, flush=True)
            result["drafters"].append(bench_drafter(tgt, spec, heldout, config, Path(tmp)))
            out_path.write_text(json.dumps(result, indent=2))
        if args.night:
            result["night"] = night(tgt, args.drafts.split(",")[0], config, Path(tmp), args.night_limit)
    headline(result)
    out_path.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: result[k] for k in ("p3_replay", "p3_replay_cold", "replay_decode_agreement",
                                             "night_480_extrapolated_seconds")}, indent=2))
    merge_into_newest(result, out_path.name)


def headline(result: dict) -> None:
    """Set the headline keys from the first drafter whose nightly gate is the replay (fp32
    activations on both sides: the replay replaces decoding there), else the first drafter."""
    d0 = next((d for d in result["drafters"] if d["gate_method"] == "replay"), result["drafters"][0])
    per_prompt_warm = d0["seconds"]["replay_warm"] / max(d0["num_prompts"], 1)
    result["night_480_extrapolated_seconds"] = per_prompt_warm * 480
    result.update({k: d0[k] for k in ("p3_replay", "p3_replay_cold", "replay_decode_agreement")})
    result["headline_drafter"] = d0["drafter"]


def merge_into_newest(result: dict, source: str) -> None:
    """Merge the headline keys into the newest speed-benchmark result (``benchmarks/perf.py``'s
    ``<date>-cpu[-<tag>].json``, recognised by its ``p1``/``p2`` headline; other ``*-cpu.json`` results,
    e.g. a step profile, are never touched), if any."""
    def perf_result(p: Path) -> dict | None:
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and {"p1", "p2", "drafters"} <= data.keys() else None

    found = [(p, d) for p in RESULTS.glob("*-cpu*.json") if (d := perf_result(p)) is not None]
    if not found:
        return
    path, data = max(found, key=lambda pd: str(pd[1].get("created_at", "")))  # the newest run
    for k in ("p3_replay", "p3_replay_cold", "replay_decode_agreement"):
        data[k] = result[k]
    data["replay_source"] = f"benchmarks/results/{source} (drafter {result['headline_drafter']})"
    path.write_text(json.dumps(data, indent=2))
    print(f"merged into {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
