"""Shards of one pair's replay: the held-out prompts split across workers, pooled exactly.

A replay night's per-prompt work (the target's continuation, one teacher-forced pass per drafter) does not
depend on the other prompts, and everything a report pools (counters per category and overall, bootstrap CIs
over prompts, acceptance by k) is computed from the per-prompt rows in held-out order. So a night is split
into ``num_shards`` shards (:func:`shard_indices`: prompt ``i`` of the stratified subset goes to shard
``i % num_shards``, which spreads every category over the shards), each worker replays its shard
(:func:`measure_shard`) and returns its per-prompt rows with their integer counters (:class:`ShardResult`),
and :func:`pool` puts the rows back in held-out order, checking that every prompt came back exactly once and
that each shard's counters sum to what its rows hold. The report built from the pool
(:func:`specdec.validation.validate` with ``replayed=``) is the one-process report: same counters, same CIs.
Where the shards ran (Dask, Ray, threads) is the caller's business (``flows.nightly``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from specdec.validation.replay_report import ReplayMeasurement, measure_replay
from specdec.validation.replay_run import ReplayedPrompt

__all__ = ["ShardResult", "shard_indices", "measure_shard", "pool", "shard_counters", "SHARD_COUNTERS"]

#: the integer counters a shard reports per drafter and k, and the pool checks
SHARD_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_emitted_tokens")


@dataclass
class ShardResult:
    """One shard's replay.

    Attributes:
        shard / num_shards: which shard of how many.
        indices: the positions (in the night's stratified subset) of its prompts, ascending.
        prompts: one :class:`~specdec.validation.replay_run.ReplayedPrompt` per index (per-prompt rows: ids,
            continuation, each drafter's counters for every k).
        counters: ``{"<drafter>/<k>/<counter>": int}`` summed over its ``ok`` prompts (:func:`shard_counters`).
        kmax: the largest k replayed; calibration: the pass costs (measured by shard 0 only, or None).
    """

    shard: int
    num_shards: int
    indices: list[int]
    prompts: list[ReplayedPrompt]
    counters: dict[str, int] = field(default_factory=dict)
    kmax: int = 0
    calibration: Any = None


def shard_indices(n: int, num_shards: int) -> list[list[int]]:
    """Prompt positions ``0..n-1`` split round-robin into ``num_shards`` lists (ascending).

    Raises:
        ValueError: ``num_shards`` < 1.
    """
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    return [list(range(s, n, num_shards)) for s in range(num_shards)]


def shard_counters(prompts: list[ReplayedPrompt], kmax: int) -> dict[str, int]:
    """``{"<drafter>/<k>/<counter>": int}`` of :data:`SHARD_COUNTERS` summed over the ``ok`` prompts with
    exact counters (a drafter replayed as expected values has none)."""
    out: dict[str, int] = {}
    for rp in prompts:
        if rp.status != "ok":
            continue
        for j, d in enumerate(rp.drafters):
            for k, st in d.curve.items():
                if k <= kmax:
                    for name in SHARD_COUNTERS:
                        key = f"{j}/{k}/{name}"
                        out[key] = out.get(key, 0) + int(getattr(st, name))
    return out


def measure_shard(request: Any, shard: int, num_shards: int) -> ShardResult:
    """Replay shard ``shard`` of ``num_shards`` of ``request`` (a :class:`~specdec.validation.ValidationRequest`;
    the stratified subset is drawn as :func:`~specdec.validation.validate` draws it); only shard 0 measures the
    pass costs.

    Raises:
        ValueError: ``shard`` outside ``[0, num_shards)``; as :func:`~specdec.validation.validate`.
    """
    from specdec.validation.api import prepare_run

    if not 0 <= shard < num_shards:
        raise ValueError(f"shard must be in [0, {num_shards}), got {shard}")
    run = prepare_run(request)
    idx = shard_indices(len(run.subset), num_shards)[shard]
    mine = dataclasses.replace(run.subset, prompts=[run.subset.prompts[i] for i in idx])
    was_training = run.model.training
    run.model.eval()
    try:
        m = measure_replay(dataclasses.replace(run, subset=mine), calibrate=shard == 0)
    finally:
        run.model.train(was_training)
    return ShardResult(shard, num_shards, idx, m.prompts, shard_counters(m.prompts, m.kmax), m.kmax, m.calibration)


def pool(results: list[ShardResult], subset_size: int | None = None) -> ReplayMeasurement:
    """The night's :class:`~specdec.validation.replay_report.ReplayMeasurement` from its shards: rows back in
    held-out order, the calibration of shard 0.

    Raises:
        ValueError: a shard missing or given twice, shards of different splits or kmax, a prompt missing or
            given twice (``subset_size``: the night's prompt count, when known), or a shard whose counters
            differ from the sum of its rows.
    """
    if not results:
        raise ValueError("pool needs at least one shard")
    num = results[0].num_shards
    if sorted(r.shard for r in results) != list(range(num)) or {r.num_shards for r in results} != {num}:
        raise ValueError(f"shards {sorted(r.shard for r in results)} are not one split into {num}")
    if len({r.kmax for r in results}) != 1:
        raise ValueError(f"shards replayed different kmax: {sorted({r.kmax for r in results})}")
    n = sum(len(r.indices) for r in results) if subset_size is None else subset_size
    rows: list[ReplayedPrompt | None] = [None] * n
    for r in results:
        if len(r.prompts) != len(r.indices) or shard_counters(r.prompts, r.kmax) != r.counters:
            raise ValueError(f"shard {r.shard}: its counters are not the sum of its {len(r.prompts)} rows")
        for i, rp in zip(r.indices, r.prompts):
            if not 0 <= i < n or rows[i] is not None:
                raise ValueError(f"shard {r.shard}: prompt position {i} is outside the night or given twice")
            rows[i] = rp
    missing = [i for i, rp in enumerate(rows) if rp is None]
    if missing:
        raise ValueError(f"{len(missing)} prompt(s) of the night came back from no shard (first: position {missing[0]})")
    first = next(r for r in results if r.shard == 0)
    return ReplayMeasurement(rows, first.kmax, first.calibration)

