"""Serve the nightly validation on a cron schedule (``specdec nightly serve``).

Two ways to schedule it, both need a real Prefect server (``prefect server start``): ephemeral mode
cannot run schedules.

* ``serve`` (this module): one long-lived process that both schedules and runs the flow;
* ``prefect.yaml`` + ``prefect deploy --all`` + ``prefect worker start --pool cpu-pool``: the
  deployment lives in the server and any worker of the pool (CPU or GPU) runs it.
"""

from __future__ import annotations

from flows.settings import NightlySettings


def deployment_parameters(s: NightlySettings) -> dict:
    """The nightly flow's parameters from settings (JSON-ready): :meth:`flows.nightly.NightlyJob.from_settings`,
    failing the flow run when a validation fails (deployments report to Prefect)."""
    from flows.nightly import NightlyJob

    return NightlyJob.from_settings(s, fail_on_failure=True).parameters()


def serve_nightly(s: NightlySettings) -> None:
    """Serve the nightly flow of section ``s`` (its cron, deployment name and parameters) until interrupted
    (blocks)."""
    from flows.nightly import nightly_flow_for

    f = nightly_flow_for(parallel=s.parallel, dask_workers=s.dask_workers, ray_address=s.ray_address)
    f.serve(name=s.deployment_name, cron=s.cron, parameters=deployment_parameters(s),
            tags=["specdec", "nightly"], description="Validate champion/challenger pairs and alert on drift.")
