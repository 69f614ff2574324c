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


#: prompts longer than this (tokens) are costed with the long-context calibration
LONG_CONTEXT_TOKENS = 400


def context_bucket(prompt_tokens: int) -> str:
    """'short' or 'long': which calibration point (c, v(n) measured at that context) costs a prompt."""
    return "long" if prompt_tokens > LONG_CONTEXT_TOKENS else "short"


def costs_for(calibration: dict, bucket: str, spec: str):
    """``(c, VerifyCost)`` of drafter ``spec`` at the calibration point ``bucket`` (falls back to the other
    point when a prompt set has only one kind of context); ``(nan, None)`` without a calibration."""
    import math

    from specdec.validation.speed import VerifyCost

    cal = calibration.get(bucket) or next(iter(calibration.values()), None)
    if not cal:
        return math.nan, None
    return cal["c"].get(spec, math.nan), VerifyCost.from_list(cal["verify_cost"])


def predicted_speed(target_rows: list[dict], rows: list[dict], calibration: dict, spec: str) -> dict:
    """The benchmark's prediction: the product's one speed model per prompt, pooled as measured.

    Per prompt, :func:`specdec.validation.speed.predicted_speedup` on the counters our decoding took on
    that prompt (``StepCounters.from_steps`` over the steps after the prefill step, as recorded in the
    row's ``steps``) with c and v(n) calibrated at that prompt's context (:func:`context_bucket`). The
    model leaves the prefill out on both sides, while a run's wall time includes it: the predicted
    wall time of our run is the target-only run's prefill pass plus our remaining tokens at the
    predicted rate (target-only decode rate x predicted speedup). The predicted speedup is then pooled
    over (prompt, repeat) like the measured one (ratio of pooled token rates).

    Returns:
        ``{"predicted_speedup", "predicted_by_prompt": {id: S}, "prompts"}``; NaN where a prompt's
        counters, c or v are missing.
    """
    import math

    from specdec.validation.speed import StepCounters, predicted_speedup

    ref = {(r["prompt_id"], r["repeat"]): r for r in target_rows}
    by_prompt: dict[str, float] = {}
    sums = [0.0, 0.0, 0.0, 0.0]  # ref tokens, ref seconds, ours tokens, predicted ours seconds
    for r in rows:
        t, steps = ref.get((r["prompt_id"], r["repeat"])), r.get("steps")
        prefill = math.nan if t is None or t.get("prefill_seconds") is None else t["prefill_seconds"]
        if not steps or math.isnan(prefill):
            continue
        c, v = costs_for(calibration, context_bucket(r["prompt_tokens"]), spec)
        s = predicted_speedup(StepCounters.from_steps(steps[1:]), c, v) if v is not None and len(steps) > 1 else math.nan
        dec_s, dec_tok = t["seconds"] - t["prefill_seconds"], t["new_tokens"] - 1
        if math.isnan(s) or s <= 0 or dec_s <= 0 or dec_tok <= 0:
            continue
        by_prompt[r["prompt_id"]] = s
        first = steps[0][1] + 1  # tokens our prefill step emitted
        sums[0] += t["new_tokens"]
        sums[1] += t["seconds"]
        sums[2] += r["new_tokens"]
        sums[3] += t["prefill_seconds"] + max(0, r["new_tokens"] - first) / (s * dec_tok / dec_s)
    pred = (sums[2] / sums[3]) / (sums[0] / sums[1]) if all(sums) else math.nan
    return {"predicted_speedup": pred, "predicted_by_prompt": by_prompt, "prompts": len(by_prompt)}
