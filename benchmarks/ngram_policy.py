"""Which n-gram proposal length after a short match? Exact greedy simulation on Spec-Bench, priced by the speed model.

Greedy speculative decoding reproduces the target's greedy continuation token for token, so an n-gram drafter's
steps along it are deterministic (the replay argument, docs/metrics.md "Replay"): per step the drafter proposes from
prompt + the continuation so far, the accepted count is the longest prefix of the proposal that equals the
continuation, and one more token (the correction or the bonus) is emitted. This script replays each candidate
proposal policy along the same continuations and prices every step with the target's calibrated verification cost
``v(n)`` (``specdec.validation.timing.calibrate``; an n-gram proposal costs no draft pass, c = 0), exactly what the one
speed model (:func:`specdec.validation.speed.predicted_speedup`) does for an n-gram draft.

Policies (k = ``--k``):

- ``weak1`` (the default, ``ngram:3:1``): k tokens after a match of >= 2 tokens, 1 token after a 1-token match;
- ``classic``: k tokens after any match, down to 1 token (transformers' prompt lookup);
- ``min2`` (``ngram:3:2``, the faster policy on a CPU): k tokens after a match of >= 2 tokens, none after a 1-token match (vLLM's
  ``prompt_lookup_min = 2``);
- ``min3``: a 3-token match needed; ``min2_max4``: as ``min2`` with suffixes up to 4 tokens; ``min2_first``: as
  ``min2``, continuing the earliest occurrence (transformers' choice) instead of the most recent.

    PYTHONPATH=. HF_HUB_OFFLINE=1 python benchmarks/ngram_policy.py --per-category 8 --out benchmarks/results/...json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
from pathlib import Path

def drafters() -> dict:
    """The policies as the product's :class:`specdec.core.drafters.NgramDrafter` (max_ngram 3 unless named)."""
    from specdec.core.drafters import NgramDrafter

    return {"weak1": NgramDrafter(min_ngram=1, match_tokens=(1,)), "classic": NgramDrafter(min_ngram=1, match_tokens=()),
            "min2": NgramDrafter(), "min3": NgramDrafter(min_ngram=3), "min2_max4": NgramDrafter(max_ngram=4),
            "min2_first": NgramDrafter(first_occurrence=True)}


def simulate(drafter, prompt: list[int], continuation: list[int], k: int) -> list[int]:
    """Proposal length of every speculative step along ``continuation`` (the first token comes from the prefill),
    ``drafter.lookup`` proposing."""
    context = list(prompt) + continuation[:1]
    drafter.reset()
    pos, widths = 1, []
    while pos < len(continuation):
        remaining = len(continuation) - pos
        prop = drafter.lookup(context, min(k, remaining - 1))
        accepted = 0
        while accepted < len(prop) and prop[accepted] == continuation[pos + accepted]:
            accepted += 1
        widths.append(len(prop))
        new = continuation[pos:pos + accepted + 1]
        context.extend(new)
        pos += len(new)
    return widths


def predicted_time(widths: list[int], v: list[float]) -> float:
    """Target passes in units of the one-token pass: 1 for a step without a proposal, ``v(n)`` for n drafted."""
    return sum(1.0 if n == 0 else v[min(n, len(v)) - 1] for n in widths)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-category", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--k", type=int, default=6)
    ap.add_argument("--v", type=str, default="", help="v(1..k) as comma-separated numbers (from an idle calibration; "
                    "default: calibrate here)")
    ap.add_argument("--continuations", type=Path, default=None,
                    help="JSON cache of the target's greedy continuations (read when present, else written)")
    ap.add_argument("--out", type=Path, default=Path(f"benchmarks/results/{dt.date.today()}-ngram-policy-cpu.json"))
    args = ap.parse_args()

    import torch

    from specdec.core.config import SamplingConfig
    from specdec.core.decoding import autoregressive_generate
    from specdec.models import load_causal_lm
    from specdec.settings import model_store
    from specdec.validation.heldout import load_heldout, prompt_token_ids
    from specdec.validation.machine import cpu_model
    from specdec.validation.timing import calibrate

    torch.set_num_threads(1)
    target = load_causal_lm("smollm2", store=model_store())
    tok, model = target.tokenizer, target.model.eval()
    subset = load_heldout("spec_bench").subset(6 * args.per_category, seed=0)
    ids0 = prompt_token_ids(subset.prompts[0], tok)
    if args.v:
        v = [float(x) for x in args.v.split(",")]
    else:
        v = calibrate(model, [None], ids0[:120], max(args.k, 8), 7).verify_cost.as_list()[1:]  # v(1..kmax)
    policies = drafters()  # each simulate() resets its drafter's index
    rows = []
    cached = json.loads(args.continuations.read_text()) if args.continuations and args.continuations.exists() else {}
    for p in subset.prompts:
        ids = prompt_token_ids(p, tok)
        if not ids or len(ids) > 1500:
            continue
        if p.id not in cached:
            cached[p.id] = list(autoregressive_generate(model, torch.tensor([ids]), max_new_tokens=args.max_new_tokens,
                                                        sampling=SamplingConfig(), eos_token_id=tok.eos_token_id).token_ids)
        cont = cached[p.id]
        base = max(len(cont) - 1, 0)
        row = {"prompt_id": p.id, "category": p.category, "prompt_tokens": len(ids), "new_tokens": len(cont)}
        for pol, drafter in policies.items():
            w = simulate(drafter, ids, cont, args.k)
            row[pol] = {"steps": len(w), "drafted": sum(w), "time": predicted_time(w, v),
                        "speedup": base / predicted_time(w, v) if w else 1.0}
        rows.append(row)
        print(p.category, p.id, {pol: round(row[pol]["speedup"], 3) for pol in policies}, flush=True)
    if args.continuations:
        args.continuations.write_text(json.dumps(cached))
    summary = {}
    for cat in sorted({r["category"] for r in rows}) + ["overall"]:
        sel = [r for r in rows if cat in ("overall", r["category"])]
        base = sum(max(r["new_tokens"] - 1, 0) for r in sel)
        summary[cat] = {pol: base / sum(r[pol]["time"] for r in sel) for pol in policies}
    print(json.dumps(summary, indent=1))
    args.out.write_text(json.dumps({
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "cpu": cpu_model(),
        "load": os.getloadavg(), "k": args.k, "max_new_tokens": args.max_new_tokens, "v": v,
        "note": "predicted speedup of the decoding steps after the prefill (pooled: tokens / priced target passes)",
        "summary": summary, "prompts": rows}, indent=1))


if __name__ == "__main__":
    main()
