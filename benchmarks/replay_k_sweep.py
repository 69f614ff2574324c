"""Replay vs decoding on the real pair for every k (issue 13): replayed counters == decoded counters?

For each k in ``--ks`` (default 1..8), ``validate(ValidationRequest(method="both", decode_fraction=1))`` on the
same stratified Spec-Bench prompts (continuations cached after the first k): every prompt is
decoded by the shared core and replayed, and ``replay_decode_agreement`` is the share whose
counters (and every proposed draft token) agree; each disagreement is listed with its logit margin
and class. Writes ``benchmarks/results/<date>-replay-ksweep-cpu.json``.

Usage::

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/replay_k_sweep.py --draft derived:int8 --limit 6
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--draft", default="derived:int8")
    ap.add_argument("--limit", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--ks", default="1,2,3,4,5,6,7,8")
    args = ap.parse_args()
    import torch

    from specdec.core.config import SamplingConfig, SpeculativeConfig
    from specdec.models import load_causal_lm
    from specdec.kinds import resolve_drafter
    from specdec.settings import model_store
    from specdec.validation.config import ValidationConfig
    from specdec.validation.continuation_cache import ContinuationCache
    from specdec.validation.heldout import load_heldout
    from specdec.validation.api import ValidationRequest, validate

    torch.set_num_threads(os.cpu_count() or 1)
    tgt = load_causal_lm(args.target, dtype="float32", device="cpu", store=model_store())
    drafter = resolve_drafter(args.draft, tgt, store=model_store())
    heldout = load_heldout("spec_bench")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = ContinuationCache(Path(tmp))
        for k in [int(x) for x in args.ks.split(",")]:
            t0 = time.perf_counter()
            config = ValidationConfig(SpeculativeConfig(k, SamplingConfig(), args.max_new_tokens), limit=args.limit,
                                      bootstrap_resamples=200)
            [r] = validate(ValidationRequest(tgt, [drafter], heldout, config, method="both", decode_fraction=1.0,
                                             cache=cache, target_ref=args.target))
            rep = r.replay
            rows.append({"k": k, "num_prompts_decoded": rep["num_prompts_decoded"],
                         "replay_decode_agreement": rep["replay_decode_agreement"],
                         "beyond_numerics": rep["beyond_numerics"], "disagreements": rep["disagreements"],
                         "decode": rep["counters"]["decode"], "replay_on_decoded": rep["counters"]["replay_on_decoded"],
                         "seconds": time.perf_counter() - t0})
            print(f"k={k}: agreement {rep['replay_decode_agreement']:.3f} over {rep['num_prompts_decoded']} prompts, "
                  f"beyond numerics {rep['beyond_numerics']}", file=sys.stderr, flush=True)
    out = ROOT / "benchmarks" / "results" / f"{dt.date.today().isoformat()}-replay-ksweep-cpu.json"
    out.write_text(json.dumps({"created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                               "config": vars(args), "rows": rows}, indent=2, default=str))
    print(out, file=sys.stderr)


if __name__ == "__main__":
    main()
