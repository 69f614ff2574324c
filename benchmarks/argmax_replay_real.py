"""Argmax rule at T = 0.7, top-p 0.9 on the real pair: is replay exact? (issue 21)

For each prompt and seed: (a) a target-only sample ``y`` and the counters replayed along it
(:func:`specdec.validation.replay.draft_trace` + :func:`replay_counters`, the validation's replay);
(b) a speculative run (:func:`specdec.speculative_generate`, ``draft_sampling="argmax"``) and the
counters replayed along ITS output, which must equal the decoded counters (the identity behind
``replay_run.replays_exactly``; a bf16 draft may differ at near-tied argmaxes). Prints per run and
the pooled acceptance of (a) vs (b) with a bootstrap CI of the difference over runs; writes
``benchmarks/results/<date>-argmax-replay-cpu.json``.

Usage::

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/argmax_replay_real.py --draft derived:bf16 -k 4 --prompts 4 --seeds 12
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def one_prompt(tgt, d, ids, args, sampling, stop, vocab) -> list[dict]:
    """Rows ``{seed, replay: (accepted, drafted), decode: (...), replay_on_decoded: (...), identical}``."""
    import torch

    from specdec import autoregressive_generate, speculative_generate
    from specdec.validation.replay import COMPARED_COUNTERS, draft_trace, replay_counters
    from specdec.validation.replay_run import adopts_prefix

    adopt, eos, rows = adopts_prefix(d, tgt.model, len(ids)), sorted(stop) or None, []

    def replay(y):
        tr = draft_trace(d, ids, y, vocab, kmax=args.k, stop_token_ids=stop, exact=True, adopts_prefix=adopt)
        return replay_counters(tr, y, num_speculative_tokens=args.k, max_new_tokens=args.max_new_tokens,
                               stop_token_ids=stop)

    for s in range(args.seeds):
        y = autoregressive_generate(tgt.model, torch.tensor([ids]), max_new_tokens=args.max_new_tokens,
                                    sampling=sampling, eos_token_id=eos, generator=torch.Generator().manual_seed(s))
        out = speculative_generate(tgt.model, d, torch.tensor([ids]), num_speculative_tokens=args.k,
                                   max_new_tokens=args.max_new_tokens, sampling=sampling, eos_token_id=eos,
                                   draft_sampling="argmax", generator=torch.Generator().manual_seed(10_000 + s))
        r, rd = replay(y.token_ids), replay(out.token_ids)
        rows.append({"seed": s, "replay": [r.num_accepted_tokens, r.num_draft_tokens],
                     "decode": [out.stats.num_accepted_tokens, out.stats.num_draft_tokens],
                     "replay_on_decoded": [rd.num_accepted_tokens, rd.num_draft_tokens],
                     "identical": all(getattr(rd, c) == getattr(out.stats, c) for c in COMPARED_COUNTERS)})
        print(rows[-1], flush=True)
    return rows


def diff_ci(rows: list[dict], n: int = 2000) -> list[float]:
    """95% bootstrap CI over runs of pooled replay acceptance minus pooled decoded acceptance."""
    rng, out = random.Random(0), []
    for _ in range(n):
        sm = [rng.choice(rows) for _ in rows]
        out.append(rate(sm, "replay") - rate(sm, "decode"))
    out.sort()
    return [out[int(0.025 * n)], out[int(0.975 * n) - 1]]


def rate(rows: list[dict], key: str) -> float:
    return sum(r[key][0] for r in rows) / max(1, sum(r[key][1] for r in rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--draft", default="derived:bf16")
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--seeds", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--out", type=Path, help="results JSON (default benchmarks/results/<date>-argmax-replay-cpu.json)")
    args = ap.parse_args()
    import torch

    from specdec import SamplingConfig
    from specdec.core.inputs import stop_token_ids
    from specdec.models import load_causal_lm
    from specdec.kinds import resolve_drafter
    from specdec.settings import model_store
    from specdec.validation.heldout import load_heldout, prompt_token_ids
    from specdec.validation.machine import cpu_model

    torch.set_num_threads(1)
    t0, load0 = time.perf_counter(), Path("/proc/loadavg").read_text().split()[:3]
    tgt = load_causal_lm(args.target, dtype="float32", device="cpu", store=model_store())
    d = resolve_drafter(args.draft, tgt, store=model_store()).drafter
    sampling = SamplingConfig(temperature=0.7, top_p=0.9)
    stop, vocab = stop_token_ids(tgt.tokenizer.eos_token_id), tgt.model.get_output_embeddings().weight.shape[0]
    rows = []
    for p in load_heldout("spec_bench").subset(args.prompts, seed=0).prompts:
        rows += [{"prompt_id": p.id, **r} for r in one_prompt(tgt, d, prompt_token_ids(p, tgt.tokenizer), args,
                                                               sampling, stop, vocab)]
    out = {"created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "config": {**vars(args), "out": str(args.out) if args.out else None},
           "cpu_model": cpu_model(), "torch_threads": 1, "loadavg_before": load0,
           "loadavg_after": Path("/proc/loadavg").read_text().split()[:3], "wall_seconds": time.perf_counter() - t0,
           "replay_acceptance_rate": rate(rows, "replay"), "decoded_acceptance_rate": rate(rows, "decode"),
           "difference_ci": diff_ci(rows), "identical_runs": sum(r["identical"] for r in rows), "runs": len(rows),
           "rows": rows}
    path = args.out or ROOT / "benchmarks" / "results" / f"{dt.date.today().isoformat()}-argmax-replay-cpu.json"
    path.write_text(json.dumps(out, indent=2))
    print(f"replay {out['replay_acceptance_rate']:.3f} decoded {out['decoded_acceptance_rate']:.3f} difference CI "
          f"{out['difference_ci']}; replay on decoded output identical in {out['identical_runs']}/{len(rows)} runs; "
          f"wrote {path}")


if __name__ == "__main__":
    main()
