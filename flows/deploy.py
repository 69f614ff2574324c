"""Serve the nightly validation on a cron schedule (``specdec nightly serve``).

Two ways to schedule it, both need a real Prefect server (``prefect server start``): ephemeral mode
cannot run schedules.

* ``serve`` (this module): one long-lived process that both schedules and runs the flow;
* ``prefect.yaml`` + ``prefect deploy --all`` + ``prefect worker start --pool cpu-pool``: the
  deployment lives in the server and any worker of the pool (CPU or GPU) runs it.
"""

from __future__ import annotations

from flows.settings import NightlySettings, get_settings


def deployment_parameters(s: NightlySettings) -> dict:
    """The nightly flow's parameters from settings (JSON-ready)."""
    return {"pairs": list(s.pairs), "aliases": list(s.aliases), "heldout": s.heldout, "limit": s.limit,
            "device": s.device, "dtype": s.dtype, "batch_size": s.batch_size, "method": s.method,
            "decode_fraction": s.decode_fraction, "fail_on_failure": True, "shards": s.shards,
            "continuations": s.continuations}


def serve_nightly(settings: NightlySettings | None = None) -> None:
    """Serve the nightly flow with its cron schedule until interrupted (blocks)."""
    from flows.nightly import nightly_flow_for

    s = settings or get_settings()
    f = nightly_flow_for(parallel=s.parallel, dask_workers=s.dask_workers)
    f.serve(name=s.deployment_name, cron=s.cron, parameters=deployment_parameters(s),
            tags=["specdec", "nightly"], description="Validate champion/challenger pairs and alert on drift.")
