"""Speed benchmark: our speculative decoding vs target-only vs transformers assisted generation.

Setup (defaults): SmolLM2-135M-Instruct target; drafters ``ngram``, ``derived:bf16``,
``derived:int8``, ``derived:int4``; a stratified Spec-Bench subset (2 prompts per category); greedy; 64 new tokens;
k = 4. Runs are interleaved (A B A B: per prompt and repeat the order of target-only / ours / HF
alternates) on one machine; the results are medians and paired ratios.

Writes ``benchmarks/results/<YYYY-MM-DD>-cpu.json`` (``-gpu`` on CUDA; ``-quick`` added for
``--quick``) with top-level floats ``p1 p2 p3 p5`` (or null plus ``*_reason``), the machine, the
config, per-drafter details, per-prompt rows, the k sweep, P5 and the profile; and the same tables
as ``<...>.md``. Writes are atomic; a partial file (``"complete": false``) is written after each
phase so an interrupted run keeps what it measured.

Usage::

    .venv/bin/python benchmarks/perf.py                          # the full CPU run
    .venv/bin/python benchmarks/perf.py --quick --drafters ngram  # smoke run
    .venv/bin/python benchmarks/perf.py --target /tmp/tiny --drafters ngram,model:/tmp/tiny-draft --out-dir /tmp/perf
    .venv/bin/python benchmarks/perf.py --device cuda --dtype bfloat16 --threads 0   # GPU run

Definitions (also written into the JSON under ``definitions``):

* tokens/s = new tokens / wall seconds of one full generation (prefill included, device synced).
* measured speedup = pooled ratio of token rates over prompts and repeats (as validation reports
  it), with a paired bootstrap 95% CI over prompts; ``identical_outputs`` / ``compared_outputs``
  count ours == target-only. The median over (prompt, repeat) pairs of ours tok/s / target-only
  tok/s is kept as ``measured_speedup_median_pair``.
* α̂ = accepted / (accepted + steps that ended in a rejection): validation's estimator
  (``DecodingStats.alpha_hat``). α pos0 = accepted_per_position[0] / num_drafts (the old estimator).
* predicted speedup: the product's one speed model, ``specdec.validation.speed.predicted_speedup``, per prompt on
  the counters our run took there (steps after the prefill step) with c and v(n) calibrated by
  ``specdec.validation.timing.calibrate`` at a short and a long context (the prompt's own kind), the prefill
  (which the model leaves out) added on both sides from the target-only run's first pass; pooled like the
  measured speedup (``perf_speed.predicted_speed``). Leviathan's closed form (Thm 3.8 at α̂, c, k) is reported
  as ``leviathan_closed_form``: the special case of the same model with i.i.d. counters and v = 1.
* P1 = measured speedup / predicted speedup (overall, per context, per category). P2 = median of ours/HF tok/s over pairs whose
  outputs are identical. P3 = validation's teacher-forced pass time / speculative decoding time on
  the same prompts. P5 = batch-8 tok/s / batch-1 tok/s of our speculative decoding.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
if str(ROOT) not in sys.path:
    sys.path.insert(1, str(ROOT))

for _k, _v in (("HF_HUB_OFFLINE", "1"), ("DO_NOT_TRACK", "true"), ("TOKENIZERS_PARALLELISM", "false")):
    os.environ.setdefault(_k, _v)


def _csv(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def _ints(s: str) -> list[int]:
    return [int(x) for x in _csv(s)]


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2", help="target model: smollm2, a local checkpoint dir, a .gguf, or a Hub id")
    ap.add_argument("--drafters", default="ngram,derived:bf16,derived:int8,derived:int4",
                    help="comma-separated drafter specs (ngram[:N[:M]], derived:bf16, derived:int8, derived:int4, "
                         "derived:fp8 (CUDA), model:PATH)")
    ap.add_argument("--draft", action="append", default=[], metavar="PATH",
                    help="add a draft model checkpoint (same as model:PATH in --drafters); repeatable")
    ap.add_argument("--heldout", default="spec_bench")
    ap.add_argument("--limit", type=int, default=12, help="prompts (stratified subset; 12 = 2 per Spec-Bench category)")
    ap.add_argument("--seed", type=int, default=0, help="subset seed")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens (k) for the main comparison")
    ap.add_argument("--k-sweep", default="1,2,3,4,6", help="k values for the best-k measurement ('' to skip)")
    ap.add_argument("--k-sweep-limit", type=int, default=6, help="prompts for the k sweep (a subset of the main prompts)")
    ap.add_argument("--k-sweep-repeats", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2, help="interleaved repeats per prompt (A B A B)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--passes", default="eager", choices=["eager", "static", "graphs"],
                    help="B=1 passes of our decoding (specdec.core.static.use_passes; graphs: CUDA only)")
    ap.add_argument("--warmup-rounds", type=int, default=4,
                    help="most warm-up runs per method; stops once two in a row agree within 10%%")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (0 = leave torch's default)")
    ap.add_argument("--batch-sizes", default="1,8", help="batch sizes for P5 ('' to skip)")
    ap.add_argument("--p5-drafters", default="best", help="'best' (the drafter with the highest measured speedup), 'all', or specs")
    ap.add_argument("--cost-reps", type=int, default=15, help="interleaved rounds per median in the calibration of c and v(n)")
    ap.add_argument("--ignore-eos", action="store_true", help="disable EOS stopping for every method (default: the target's EOS for all)")
    ap.add_argument("--no-hf", action="store_true", help="skip transformers assisted generation (no P2)")
    ap.add_argument("--no-tf", action="store_true", help="skip the teacher-forced timing (no P3)")
    ap.add_argument("--profile", action="store_true", help="torch.profiler + cProfile over a short generation of ours")
    ap.add_argument("--profile-tokens", type=int, default=32)
    ap.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--tag", default="", help="suffix of the output file names (default '-quick' with --quick)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 2 prompts, 1 repeat, 16 new tokens, k-sweep 2,4 on 1 prompt, 10 cost reps")
    args = ap.parse_args(argv)
    if args.quick:
        args.limit, args.repeats, args.max_new_tokens = 2, 1, 16
        args.k_sweep, args.k_sweep_limit, args.k_sweep_repeats, args.cost_reps = "2,4", 1, 1, 10
        args.profile_tokens = min(args.profile_tokens, 16)
        args.tag = args.tag or "-quick"
    args.drafter_specs = _csv(args.drafters) + [f"model:{p}" for p in args.draft]
    args.k_values = _ints(args.k_sweep)
    args.batch_list = _ints(args.batch_sizes)
    for name, v in (("--limit", args.limit), ("--repeats", args.repeats), ("--max-new-tokens", args.max_new_tokens), ("--k", args.k)):
        if v < 1:
            ap.error(f"{name} must be >= 1")
    if not args.drafter_specs:
        ap.error("no drafter given")
    if any(k < 1 for k in args.k_values) or any(b < 1 for b in args.batch_list):
        ap.error("k and batch sizes must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but CUDA is not available")
    import transformers

    transformers.logging.set_verbosity_error()
    from perf_bench import Bench

    bench = Bench(args)
    try:
        bench.run()
    except KeyboardInterrupt:
        bench.log("interrupted: writing what was measured")
        bench.write(complete=False, note="interrupted")
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
