"""What both engine-check benchmarks share (``engine_check.py`` for llama.cpp, ``vllm_engine_check.py`` for vLLM):
their markdown: one engine-check result dict (``EngineCheck.to_dict()`` plus the
benchmark's ``speed`` and ``audit``) or the run's ``meta`` in, lines of markdown out. Each script adds its own
engine line and engine-specific lines around these."""

from __future__ import annotations

TABLE_HEAD = ["| group | prompts | engine | core (same tokens) | engine - core [95% CI] |", "|---|---|---|---|---|"]


def run_line(meta: dict) -> str:
    """The machine and the run: CPU (``cpu``, ``nproc``), load at start and end, prompts, tokens, k, command."""
    return (f"CPU: {meta['cpu']} ({meta['nproc']} cores), load {meta['load_start']} at start, {meta['load_end']} at "
            f"the end. {meta['limit']} Spec-Bench prompts (all categories), greedy, {meta['max_new_tokens']} new "
            f"tokens, k = {meta['k']}. Command: `{meta['command']}`.")


def fmt(x, spec: str = ".3f") -> str:
    """``x`` formatted with ``spec``; ``-`` for a missing (None) or NaN figure."""
    return "-" if x is None or (isinstance(x, float) and x != x) else format(x, spec)


def fmt_ci(ci, spec: str = ".3f") -> str:
    """A ``[lo, hi]`` interval; ``[-]`` when it is missing."""
    return "[-]" if not ci or None in ci else f"[{fmt(ci[0], spec)}, {fmt(ci[1], spec)}]"


def group_table(result: dict) -> list[str]:
    """The acceptance table: overall, then one row per category (engine, core along the same tokens, and their
    paired difference, each with its 95% CI)."""
    rows = list(TABLE_HEAD)
    for name, g in [("overall", result["overall"]), *result["categories"].items()]:
        rows.append(f"| {name} | {g['num_prompts']} | {fmt(g['engine_acceptance_rate'])} "
                    f"{fmt_ci(g['engine_acceptance_rate_ci'])} | {fmt(g['core_acceptance_rate'])} "
                    f"{fmt_ci(g['core_acceptance_rate_ci'])} | {fmt(g['difference'], '+.3f')} "
                    f"{fmt_ci(g['difference_ci'], '+.3f')} |")
    return rows


def position_and_speed(result: dict) -> list[str]:
    """Accepted tokens per draft position (engine, core) and the engine's paired throughput with/without
    speculation (tokens/s, speedup with its CI)."""
    s = result["speed"]
    return [f"Per position (accepted tokens): engine {result['engine_per_position']}, "
            f"core {result['core_per_position']}.",
            f"Engine throughput: {fmt(s['speculative_tokens_per_second'], '.1f')} tokens/s with speculation, "
            f"{fmt(s['baseline_tokens_per_second'], '.1f')} without; paired speedup {fmt(s['speedup'], '.2f')}x "
            f"{fmt_ci(s['speedup_ci'], '.2f')}."]
