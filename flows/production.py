"""The ``production-acceptance`` flow: every 15 minutes, ingest the last window of every production
source (a Prometheus server or a ``/metrics`` endpoint), record it with ``source = production``,
run the drift rules, the representativeness rule and the incident lifecycle, and redraw each pair's
acceptance trend (nightly and production) as a PNG.

Window: ``(end - window_minutes, end]`` with ``end`` = the flow run's scheduled time floored to the
minute minus ``settle_seconds`` (so the last scrape before ``end`` is stored in Prometheus before it
is queried). A retried flow run re-ingests the same window into the same rows. Aliases are resolved
in the MLflow registry at run time (falling back to the history store when MLflow is down).

Deployment: ``prefect.yaml`` (``production-acceptance``, cron ``SPECDEC_PRODUCTION_CRON``, default
``*/15 * * * *``), or ``specdec ingest serve``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.utilities.annotations import quote

from flows.production_lib import version_resolver, window_end_of_run, write_trend_plots
from flows.tasks import retry_when, run_logger
from monitoring.production.sources import ProductionSourceError
from specdec.validation.provenance import code_version


def _logger():
    return run_logger("flows.production")


@task(retries=2, retry_delay_seconds=[10, 30], retry_condition_fn=retry_when(ProductionSourceError),
      task_run_name="ingest {source_name}", cache_policy=NO_CACHE)
def ingest_source(source_name: str, start: dt.datetime, end: dt.datetime, tree) -> list[dict]:
    """Ingest one window of one configured source (sections of the flow run's settings ``tree``); returns
    the outcomes as dicts."""
    import monitoring
    from monitoring.production.ingest import ingest_window

    ps, ms = tree.production, tree.monitoring
    src = next(s for s in ps.sources if s.name == source_name)
    db = monitoring.connect(ms)
    try:
        out = ingest_window(db, src, start, end, settings=ps, monitoring_settings=ms,
                            resolve_version=version_resolver(tree.registry), code_version=code_version())
    finally:
        db.dispose()
    return [asdict(o) for o in out]


@flow(name="production-acceptance", log_prints=True)
def production_acceptance_flow(
    window_minutes: float | None = None, end: dt.datetime | None = None, sources: list[str] | None = None,
    settle_seconds: float = 60.0, plot: bool = True,
) -> list[dict]:
    """Ingest one window of every configured production source (``SPECDEC_PRODUCTION_SOURCES``).

    Args:
        window_minutes: window length (default ``SPECDEC_PRODUCTION_WINDOW_MINUTES``, 15).
        end: window end (aware; default :func:`window_end_of_run`). sources: only these source names.
        settle_seconds: how far behind the schedule the window ends. plot: redraw the trend PNGs.
    Returns:
        One dict per (source, model) (:class:`monitoring.production.ingest.WindowOutcome` fields);
        a source that could not be read gives ``{"source", "status": "error", "message"}``.
        No source configured: a warning and ``[]`` (the deployment is harmless until configured).
    Raises:
        ValueError: an unknown name in ``sources``.
    """
    from flows.settings import for_this_run

    log = _logger()
    tree = for_this_run()  # the flow is an entry point: its settings tree, read once
    ps = tree.production
    names = [s.name for s in ps.sources]
    if not names:
        log.warning("no production source configured (SPECDEC_PRODUCTION_SOURCES): nothing to ingest")
        return []
    unknown = sorted(set(sources or []) - set(names))
    if unknown:
        raise ValueError(f"unknown production source(s) {unknown}; configured: {names}")
    end = end or window_end_of_run(settle_seconds)
    start = end - dt.timedelta(minutes=window_minutes or ps.window_minutes)
    results: list[dict] = []
    for name in sources or names:
        try:
            out = ingest_source(name, start, end, quote(tree))
        except Exception as e:  # noqa: BLE001 (a source's HTTP, parsing, store or alert errors: one broken source must not stop the others)
            log.error("production source %s: %s: %s", name, type(e).__name__, e)
            results.append({"source": name, "status": "error", "message": f"{type(e).__name__}: {e}"})
            continue
        for o in out:
            acc = "-" if o["acceptance_rate"] is None else f"{o['acceptance_rate']:.3f}"
            log.info("%s/%s -> %s@%s v%s: %s, acceptance %s on %s draft tokens%s", o["source"], o["model"] or "-",
                     o["pair"], o["alias"], o["version"], o["status"], acc, o["num_draft_tokens"],
                     f", alert {o['health_transition']}" if o["health_transition"] else "")
        results += out
    if plot:
        pairs = sorted({r["pair"] for r in results if r.get("pair")})
        if pairs:
            write_trend_plots(pairs, tree.monitoring.reports_dir / "production", tree.monitoring)
    return results
