"""Cost ratio c and greedy acceptance of cheap drafts of a target, on any device (issue 39, "drafts that pay").

For each drafter spec (default: ``layerskip:N`` for several N, and the derived copies that run on the
device) this measures

* ``c`` = the draft's one-token pass / the target's one-token pass: the product's own calibration
  (:func:`specdec.validation.timing.calibrate`: isolated passes on a warm KV cache, interleaved rounds, medians),
* greedy decoding over a few held-out prompts: the acceptance rate and mean accepted length at ``k`` and
  whether the output is token-identical to target-only decoding (it must be),
* the speed model's predicted speedup from those counters (:func:`specdec.validation.speed.predicted_speedup`
  is not re-implemented here: Leviathan's closed form with the calibrated v(k+1) is reported beside the counters).

Writes ``benchmarks/results/<date>-draft-cost-<cpu|gpu>[tag].json`` and ``.md`` (machine, load average, command).

Usage: python benchmarks/gpu/draft_cost.py [--target smollm2] [--device cpu] [--dtype float32]
       [--drafters layerskip:6,layerskip:10,layerskip:15,derived:bf16] [--prompts 4] [--max-new-tokens 48] [--k 4]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--drafters", default="layerskip:6,layerskip:10,layerskip:15,derived:bf16")
    ap.add_argument("--heldout", default="spec_bench")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-prompt-tokens", type=int, default=256, help="draw among prompts at most this long")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--reps", type=int, default=7, help="calibration rounds (medians)")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    ap.add_argument("--passes", default="eager", choices=["eager", "static", "graphs"])
    ap.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--tag", default="")
    return ap.parse_args(argv)


def measure(args) -> dict:
    import torch

    from specdec import SamplingConfig, autoregressive_generate, speculative_generate
    from specdec.core.static import use_passes
    from specdec.models import load_causal_lm
    from specdec.kinds import resolve_drafter
    from specdec.settings import model_store
    from specdec.validation.heldout import load_heldout, prompt_token_ids
    from specdec.validation.timing import calibrate

    if args.threads:
        torch.set_num_threads(args.threads)
    tgt = load_causal_lm(args.target, dtype=args.dtype, device=args.device, store=model_store())
    target = use_passes(tgt.model.eval(), args.passes)
    ctx = min(getattr(target.config, "max_position_embeddings", None) or 10**9, 10**9)
    limit = min(args.max_prompt_tokens, ctx - args.max_new_tokens - args.k - 1)
    by_category: dict[str, list[list[int]]] = {}
    for p in load_heldout(args.heldout).prompts:  # the short enough prompts, one category after the other
        ids = [] if p.is_empty else prompt_token_ids(p, tgt.tokenizer)
        if 0 < len(ids) <= limit:
            by_category.setdefault(p.category, []).append(ids)
    rounds = zip(*by_category.values()) if by_category else []
    prompts = [ids for row in rounds for ids in row][: args.prompts]
    if not prompts:
        raise SystemExit(f"error: no held-out prompt of at most {limit} tokens")
    greedy = SamplingConfig(temperature=0.0)
    rows = {}
    for spec in [s for s in args.drafters.split(",") if s]:
        try:
            r = resolve_drafter(spec, tgt, store=model_store())
        except Exception as e:  # noqa: BLE001  (a recipe the device cannot run is reported, not fatal)
            rows[spec] = {"error": f"{type(e).__name__}: {e}"}
            continue
        draft = r.drafter
        if isinstance(draft, torch.nn.Module):
            use_passes(draft.eval(), args.passes)
        cal = calibrate(target, [draft if isinstance(draft, torch.nn.Module) else None], prompts[0], args.k, reps=args.reps)
        drafted = accepted = steps = identical = 0
        t_spec = t_ref = 0.0
        for ids in prompts:
            x = torch.tensor([ids], device=target.device)
            t0 = time.perf_counter()
            ref = autoregressive_generate(target, x, max_new_tokens=args.max_new_tokens, sampling=greedy)
            t1 = time.perf_counter()
            out = speculative_generate(target, draft, x, num_speculative_tokens=args.k,
                                       max_new_tokens=args.max_new_tokens, sampling=greedy)
            t_ref, t_spec = t_ref + t1 - t0, t_spec + time.perf_counter() - t1
            s = out.stats
            drafted, accepted, steps = drafted + s.num_draft_tokens, accepted + s.num_accepted_tokens, steps + s.num_drafts
            identical += out.token_ids == ref.token_ids
        c = cal.cost_ratios[0]
        alpha = accepted / drafted if drafted else float("nan")
        rows[spec] = {"kind": r.kind, "recipe": r.recipe, "cost_ratio_c": c, "target_step_ms": cal.target_step_s * 1e3,
                      "acceptance_rate": alpha, "mean_accepted_length": 1 + accepted / steps if steps else None,
                      "identical_outputs": identical, "compared_outputs": len(prompts),
                      "measured_speedup_wall": t_ref / t_spec if t_spec else None,
                      "verify_cost_raw": {str(n): v for n, v in cal.raw_verify.items()}}
    return {"rows": rows, "num_prompts": len(prompts)}


def write(args, result: dict, wall: float) -> Path:
    import torch

    dev = "gpu" if str(args.device).startswith("cuda") else "cpu"
    stem = f"{dt.date.today().isoformat()}-draft-cost-{dev}{args.tag}"
    machine = {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
               "torch": torch.__version__, "threads": torch.get_num_threads(),
               "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
               "loadavg": os.getloadavg() if hasattr(os, "getloadavg") else None}
    doc = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "config": {k: str(v) for k, v in vars(args).items()},
           "machine": machine, "wall_seconds": wall, **result,
           "definitions": {"cost_ratio_c": "draft one-token pass / target one-token pass (specdec.validation.timing."
                                           "calibrate: warm KV cache, interleaved rounds, medians)",
                           "acceptance_rate": "accepted drafts / drafted tokens, greedy, at k",
                           "measured_speedup_wall": "target-only seconds / speculative seconds over the same prompts "
                                                    "(one run each, after the calibration warmed both up)"}}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"{stem}.json"
    out.write_text(json.dumps(doc, indent=1, default=str))
    lines = [f"# Draft cost ratio c and greedy acceptance ({dev})", "", f"Command: `{doc['command']}`", "",
             f"Machine: {machine}", "", f"{result['num_prompts']} held-out prompts, {args.max_new_tokens} new tokens, "
             f"k={args.k}, dtype {args.dtype}, passes {args.passes}; wall {wall:.0f} s.", "",
             "| drafter | c | target pass ms | acceptance | mean accepted length | identical | wall speedup |",
             "|---|---|---|---|---|---|---|"]
    for spec, r in result["rows"].items():
        if "error" in r:
            lines.append(f"| {spec} | {r['error']} | | | | | |")
            continue
        lines.append(f"| {spec} | {r['cost_ratio_c']:.3f} | {r['target_step_ms']:.2f} | {r['acceptance_rate']:.3f} | "
                     f"{r['mean_accepted_length'] or float('nan'):.2f} | {r['identical_outputs']}/{r['compared_outputs']} | "
                     f"{r['measured_speedup_wall'] or float('nan'):.2f} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    result = measure(args)
    out = write(args, result, time.perf_counter() - t0)
    print(out.with_suffix(".md").read_text())
    bad = [s for s, r in result["rows"].items() if "error" not in r and r["identical_outputs"] != r["compared_outputs"]]
    if bad and args.dtype == "float32":
        print(f"NOT token-identical in fp32: {bad}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
