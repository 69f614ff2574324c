"""Helpers of the production-acceptance flow that need no Prefect (the ``specdec ingest`` CLI imports
them without importing Prefect, whose logging setup binds a console handler to the current stderr).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path


def version_resolver(section):
    """``(pair, alias) -> version | None``: the version ``alias`` of ``pair`` points at now in the MLflow
    registry of ``section`` (the :class:`registry.settings.RegistrySettings` the entry point read); ``None``
    without that alias. Its :class:`registry.service.Registry` is opened at the first call that needs it and
    kept for the later ones.

    The returned function raises ``registry.RegistryError``: MLflow unreachable or the pair unknown (the
    caller falls back).
    """
    opened = []

    def resolve(pair: str, alias: str) -> str | None:
        from registry import AliasNotFound, resolve_alias
        from registry.service import Registry

        if not opened:
            opened.append(Registry(section))
        try:
            return str(resolve_alias(pair, alias, registry=opened[0]))
        except AliasNotFound:
            return None

    return resolve


def window_end_of_run(settle_seconds: float = 60.0, now: dt.datetime | None = None) -> dt.datetime:
    """The flow run's scheduled time (else now), floored to the minute, minus ``settle_seconds``."""
    t = None
    if now is None:
        try:
            from prefect.runtime import flow_run

            t = flow_run.scheduled_start_time
        except Exception:  # noqa: BLE001 (prefect.runtime outside a flow run raises its own types; fall back to now)
            t = None
    t = (now or t or dt.datetime.now(dt.timezone.utc)).astimezone(dt.timezone.utc)
    return t.replace(second=0, microsecond=0) - dt.timedelta(seconds=settle_seconds)


def write_trend_plots(pairs: list[str], out_dir: Path, settings) -> dict[str, str]:
    """``<out_dir>/<pair>/acceptance_trend.png`` (nightly and production) for each pair; pair -> path.
    ``settings``: the monitoring section (the history store, the threshold line)."""
    import monitoring
    from monitoring.history import trend_points
    from registry import plots

    db = monitoring.connect(settings)
    paths = {}
    try:
        for pair in pairs:
            d = out_dir / pair.replace("/", "_")
            d.mkdir(parents=True, exist_ok=True)
            p = plots.plot_trend(trend_points(db, pair), d / "acceptance_trend.png",
                                 threshold=settings.rules.policy.threshold, estimator=settings.rules.policy.estimator,
                                 title=f"{pair}: acceptance rate, nightly held-out vs production traffic")
            paths[pair] = str(p)
    finally:
        db.dispose()
    return paths
