"""The nightly's shards of one pair: its held-out prompts replayed on several workers, pooled exactly.

With ``shards > 1`` (:func:`flows.nightly.nightly_validation_flow`), a pair version's validation is
``shards`` :func:`replay_shard` tasks (each loads the pair's models into its worker's cache and replays its
share of the prompts, :func:`specdec.validation.shard.measure_shard`) and one :func:`pool_validation` task
that pools their per-prompt rows (:func:`specdec.validation.shard.pool`: every prompt once, the counters
checked) and builds the report from them: the one-process night's report, same counters, same CIs. On the
flow's Dask runner (:func:`flows.nightly.nightly_flow_for`) the shards run on different workers; on Ray
through ``prefect-ray``'s ``RayTaskRunner`` the same tasks run unchanged; with the default thread runner
they run one after the other in the flow's thread.
"""

from __future__ import annotations

from typing import Any

from prefect import task

from flows.night_request import worth_retrying


@task(task_run_name="replay {pv.name}@v{pv.version} shard {shard}", retries=1, retry_delay_seconds=30,
      retry_condition_fn=worth_retrying)
def replay_shard(pv, params, shard: int):
    """Shard ``shard`` of ``params.shards`` of pair version ``pv``'s replay (a
    :class:`specdec.validation.shard.ShardResult`: per-prompt rows and integer counters)."""
    from flows.night_request import validation_progress, validation_request
    from specdec.validation.shard import measure_shard

    request = validation_request(pv, params, validation_progress(pv))
    try:
        return measure_shard(request, shard, params.shards)
    finally:
        if request.engine is not None:
            request.engine.close()


@task(task_run_name="pool {pv.name}@v{pv.version}")
def pool_validation(pv, params, out_dir: str, shards: list):
    """The report of pair version ``pv`` from its pooled ``shards`` (decoding the subsample here with
    ``method="both"``), written to ``out_dir``."""
    from flows.night_request import validate_and_write, validation_request
    from specdec.validation.shard import pool

    return validate_and_write(validation_request(pv, params, None, replayed=pool(list(shards))), out_dir)


class _Chain:
    """A sharded validation run in the flow's thread: the shards, then the pool, with a future's ``result()``."""

    def __init__(self, args: tuple) -> None:
        self.args = args

    def result(self):
        pv, params, out_dir = self.args
        return pool_validation(pv, params, out_dir, [replay_shard(pv, params, s) for s in range(params.shards)])


def submit_sharded(args: tuple, serial: bool) -> Any:
    """``(pv, params, out_dir)``'s sharded validation: submitted to the flow's task runner (the pool task
    waits on the shard futures), or run at ``result()`` in the flow's thread when ``serial``."""
    pv, params, out_dir = args
    if serial:
        return _Chain(args)
    futures = [replay_shard.submit(pv, params, s) for s in range(params.shards)]
    return pool_validation.submit(pv, params, out_dir, futures)
