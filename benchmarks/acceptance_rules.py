"""Both acceptance rules per draft position on SmolLM2 pairs at several temperatures (issue 49).

For each temperature, each held-out prompt gets the target's own continuation (target-only sampling, the
validation's per-prompt seed) and ONE teacher-forced pass of the target and of each drafter over it
(:func:`specdec.validation.teacher_forcing.draft_agreement`, the code ``specdec validate`` runs); the prompts are
pooled by :func:`specdec.validation.aggregate.groups` exactly as a report's ``exact_rule_*`` / ``argmax_rule_*``
fields (docs/metrics.md "Two acceptance rules"). No speculative decoding and no timing: acceptance only, so the
numbers do not depend on the machine's load. Writes ``benchmarks/results/<date>-acceptance-rules-cpu.md``.

Usage::

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/acceptance_rules.py --drafts derived:bf16,derived:int8,ngram \\
        --temperatures 0,0.7,1.0 --limit 12 --max-new-tokens 32 -k 4
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def continuation(tgt, ids: list[int], sampling, args, seed: int) -> list[int]:
    """The target's own ``max_new_tokens`` continuation of ``ids`` at ``sampling`` (seeded as validation seeds it)."""
    import torch

    from specdec import autoregressive_generate
    from specdec.validation.prompt_run import seeded_generator

    out = autoregressive_generate(tgt.model, torch.tensor([ids]), max_new_tokens=args.max_new_tokens, sampling=sampling,
                                  eos_token_id=args.eos, generator=seeded_generator(seed, torch.device("cpu")))
    return list(out.token_ids)


def runs_at(tgt, drafters: dict, prompts: list, sampling, args) -> dict[str, list]:
    """Per drafter, one :class:`~specdec.validation.prompt_run.PromptRun` per prompt with its teacher-forced agreement."""
    from specdec.core.stats import DecodingStats
    from specdec.kinds import drafter_parts
    from specdec.validation.prompt_run import PromptRun, prompt_seed
    from specdec.validation.report import PromptResult
    from specdec.validation.teacher_forcing import draft_agreement, target_teacher_forcing

    out: dict[str, list] = {name: [] for name in drafters}
    for p, ids in prompts:
        y = continuation(tgt, ids, sampling, args, prompt_seed(args.seed, p.id))
        if len(y) < 2:
            continue
        tf = target_teacher_forcing(tgt.model, ids, y, sampling)
        for name, d in drafters.items():
            obj, model, *_ = drafter_parts(d)
            agree = draft_agreement(tf, model, obj if model is None else None, sampling, chain=args.k)
            out[name].append(PromptRun(row=PromptResult(p.id, p.category), stats=DecodingStats(num_speculative_tokens=args.k),
                                       agree=agree, tf_total=len(y)))
        print(f"T {sampling.temperature:g} {p.category} #{p.id}: {len(y)} tokens", flush=True)
    return out


def table(results: list[tuple[str, float, object]], k: int) -> list[str]:
    """Markdown rows: drafter, T, each rule's pooled rate [95% CI] and its per-position rates 1..k."""
    def ci(x: float, c: list[float]) -> str:
        return f"{x:.3f} [{c[0]:.3f}, {c[1]:.3f}]"

    lines = [f"| draft | T | exact Σmin(p,q) [95% CI] | exact, positions 1..{k} | argmax p(argmax q) [95% CI] | "
             f"argmax, positions 1..{k} | positions |", "|---|---|---|---|---|---|---|"]
    for name, t, g in results:
        lines.append(f"| {name} | {t:g} | {ci(g.exact_rule_acceptance, g.exact_rule_acceptance_ci)} | "
                     f"{' '.join(f'{x:.3f}' for x in g.exact_rule_per_position)} | "
                     f"{ci(g.argmax_rule_acceptance, g.argmax_rule_acceptance_ci)} | "
                     f"{' '.join(f'{x:.3f}' for x in g.argmax_rule_per_position)} | {g.num_tf_positions} |")
    return lines


def machine() -> str:
    """CPU model, usable cores and the 1/5/15-minute load averages, one line."""
    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("model name")), platform.processor() or "unknown CPU")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{model}; {len(os.sched_getaffinity(0))} usable cores; load average {load}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--drafts", default="derived:bf16,derived:int8,ngram")
    ap.add_argument("--temperatures", default="0,0.7,1.0")
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    from specdec import SamplingConfig
    from specdec.kinds import resolve_drafter
    from specdec.models import load_causal_lm
    from specdec.settings import model_store
    from specdec.validation.aggregate import groups
    from specdec.validation.heldout import load_heldout, prompt_token_ids
    from specdec.validation.provenance import eos_token_ids

    store, load_before = model_store(), machine()
    tgt = load_causal_lm(args.target, store=store, device="cpu", dtype="float32")
    drafters = {s: resolve_drafter(s, tgt, store=store) for s in args.drafts.split(",")}
    args.eos = eos_token_ids(tgt.tokenizer, tgt.model)  # what validation passes to the decoding loops
    prompts = [(p, prompt_token_ids(p, tgt.tokenizer)) for p in load_heldout("spec_bench").subset(args.limit, seed=args.seed).prompts]
    results = []
    for t in (float(x) for x in args.temperatures.split(",")):
        per = runs_at(tgt, drafters, prompts, SamplingConfig(temperature=t), args)
        results += [(name, t, groups(runs, args.k)[0]) for name, runs in per.items()]
        write(results, args, len(prompts), load_before)  # after each temperature: a partial table survives a stop


def write(results: list, args: argparse.Namespace, num_prompts: int, load_before: str) -> None:
    """The markdown of ``results`` (command, machine, setup, table) to ``--out`` (default ``benchmarks/results/``)."""
    out = args.out or ROOT / "benchmarks" / "results" / f"{dt.date.today().isoformat()}-acceptance-rules-cpu.md"
    cmd = "HF_HUB_OFFLINE=1 .venv/bin/python " + shlex.join([str(Path(sys.argv[0]).relative_to(ROOT)
                                                                  if Path(sys.argv[0]).is_absolute() else sys.argv[0]),
                                                              *sys.argv[1:]])
    body = [f"# Both acceptance rules per draft position, {args.target} (issue 49)", "",
            f"Command: `{cmd}`", "", f"Machine at the start: {load_before}", f"Machine at the end: {machine()}", "",
            f"{num_prompts} Spec-Bench prompts (stratified, seed {args.seed}), {args.max_new_tokens} new tokens, "
            f"k = {args.k}; the target's own continuation per prompt and temperature, one teacher-forced pass of each "
            "model over it (no decoding: these numbers do not depend on the load). Rates pooled over positions, 95% "
            "bootstrap CIs over prompts; per position j: the expected acceptance of draft j of a chain started at "
            "every position (docs/metrics.md \"Two acceptance rules\").", "", *table(results, args.k), ""]
    out.write_text("\n".join(body))
    print("\n".join(body))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
