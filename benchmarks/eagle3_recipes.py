"""Which EAGLE-3 training-data recipe gives more acceptance per CPU minute here (issue 23 item 3).

For each recipe (``fixed``: the target's distributions over fixed text, one teacher-forced pass;
``regenerated``: the target answers the training prompts first) a head is trained for the fp32
SmolLM2 target from the same training prompts with the same optimiser settings, and evaluated by
teacher-forced agreement (:mod:`specdec.training.eagle3_eval`) on short held-out Spec-Bench prompts
answered greedily by the target (the text a drafter meets when decoding). CPU time is this process's
user+system time (``getrusage``), per phase; wall time and the load average are recorded too, because
the machine is shared.

Writes ``benchmarks/results/eagle3_recipes.json`` and ``.md``. Usage::

    .venv/bin/python benchmarks/eagle3_recipes.py [--sequences 48] [--response-tokens 128] [--epochs 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from specdec.validation.machine import cpu_model

OUT = ROOT / "benchmarks" / "results" / "eagle3_recipes"


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_recipe(target, recipe: str, args, eval_feats) -> dict:
    """Train one head with ``recipe``; CPU and wall time per phase, agreement on the held-out sequences."""
    from specdec.training.eagle3 import Eagle3TrainConfig, train_eagle3_head
    from specdec.training.eagle3_eval import teacher_forced_agreement

    cfg = Eagle3TrainConfig(recipe=recipe, num_sequences=args.sequences, response_tokens=args.response_tokens,
                            draft_vocab_size=args.draft_vocab, epochs=args.epochs, batch_size=args.batch_size,
                            lr=args.lr, seed=args.seed)
    load0, c0, w0 = os.getloadavg()[0], _cpu_s(), time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="eagle3-recipe-") as tmp:
        res = train_eagle3_head(target, out_dir=tmp, config=cfg, progress=True)
    cpu_min, wall_min = (_cpu_s() - c0) / 60, (time.perf_counter() - w0) / 60
    ev = teacher_forced_agreement(res.head, target, eval_feats, steps=cfg.ttt_steps)
    return {"recipe": recipe, "config": cfg.__dict__, "cpu_minutes": cpu_min, "wall_minutes": wall_min,
            "load_avg_1m": [load0, os.getloadavg()[0]], "training": res.metrics, "heldout": ev,
            "alpha_tf_per_cpu_minute": ev["alpha_tf"] / cpu_min,
            "accepted_per_draft_per_cpu_minute": ev["accepted_per_draft"] / cpu_min}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sequences", type=int, default=48)
    ap.add_argument("--response-tokens", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--draft-vocab", type=int, default=4096)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-per-category", type=int, default=1)
    ap.add_argument("--eval-new-tokens", type=int, default=48)
    ap.add_argument("--recipes", default="fixed,regenerated")
    args = ap.parse_args()
    from specdec.models import load_causal_lm
    from specdec.models.eagle3 import default_layer_ids
    from specdec.settings import model_store
    from specdec.training.eagle3_eval import evaluation_features

    target = load_causal_lm("smollm2", dtype=torch.float32, store=model_store())
    c0, w0 = _cpu_s(), time.perf_counter()
    eval_feats = evaluation_features(target, default_layer_ids(target.model.config.num_hidden_layers),
                                     per_category=args.eval_per_category, max_new_tokens=args.eval_new_tokens)
    doc = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "cpu": cpu_model(),
           "num_cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "target": "smollm2 (fp32)",
           "args": vars(args), "eval": {"sequences": len(eval_feats), "cpu_minutes": (_cpu_s() - c0) / 60,
                                        "wall_minutes": (time.perf_counter() - w0) / 60}, "runs": []}
    for recipe in args.recipes.split(","):
        doc["runs"].append(run_recipe(target, recipe, args, eval_feats))
        print(json.dumps(doc["runs"][-1], indent=1, default=str), flush=True)
    best = max(doc["runs"], key=lambda r: r["accepted_per_draft_per_cpu_minute"])
    doc["best_per_cpu_minute"] = best["recipe"]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.with_suffix(".json").write_text(json.dumps(doc, indent=2, default=str))
    OUT.with_suffix(".md").write_text(_markdown(doc))
    print(_markdown(doc))


def _markdown(doc: dict) -> str:
    lines = [f"# EAGLE-3 data recipes: acceptance per CPU minute ({doc['date']})", "",
             f"{doc['cpu']}, {doc['num_cpus']} CPUs, {doc['torch_threads']} torch threads; target {doc['target']}; "
             f"settings {json.dumps(doc['args'])}. Held-out: {doc['eval']['sequences']} short Spec-Bench prompts "
             "answered greedily by the target; agreement is teacher-forced (eagle3_eval).", "",
             "| recipe | CPU min | wall min | load avg (start, end) | alpha_tf | step agreement | accepted/draft (k=3) "
             "| alpha_tf per CPU min | accepted per CPU min |", "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["runs"]:
        ev = r["heldout"]
        lines.append(f"| {r['recipe']} | {r['cpu_minutes']:.1f} | {r['wall_minutes']:.1f} | "
                     f"{r['load_avg_1m'][0]:.1f}, {r['load_avg_1m'][1]:.1f} | {ev['alpha_tf']:.3f} | "
                     f"{', '.join(f'{x:.3f}' for x in ev['step_agreement'])} | {ev['accepted_per_draft']:.3f} | "
                     f"{r['alpha_tf_per_cpu_minute']:.4f} | {r['accepted_per_draft_per_cpu_minute']:.4f} |")
    lines += ["", f"More accepted tokens per CPU minute: **{doc['best_per_cpu_minute']}** (the default recipe).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
