"""Pooled measured speedup with its paired bootstrap CI from the benchmark's per-run rows."""

from __future__ import annotations

from collections import defaultdict


def pooled_speed(target_rows: list[dict], rows: list[dict]) -> dict:
    """Pooled speedup of ``rows`` over the target-only runs of the same (prompt, repeat), with the
    paired bootstrap CI over prompts (runs of one prompt summed over repeats)."""
    from specdec.validation.speed import bootstrap_speedup_ci, pooled_speedup

    ref = {(r["prompt_id"], r["repeat"]): r for r in target_rows}
    per: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for r in rows:
        t = ref.get((r["prompt_id"], r["repeat"]))
        if t is None:
            continue
        acc = per[r["prompt_id"]]
        acc[0] += t["new_tokens"]
        acc[1] += t["seconds"]
        acc[2] += r["new_tokens"]
        acc[3] += r["seconds"]
    cols = list(zip(*per.values())) if per else [[], [], [], []]
    return {"measured_speedup": pooled_speedup(*cols), "measured_speedup_ci": bootstrap_speedup_ci(*cols),
            "prompts": len(per)}
