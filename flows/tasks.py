"""Small Prefect tasks of the nightly validation. Each wraps one call into registry, monitoring or
specdec, with retries declared where a failure is transient (a server that is briefly down).

Plain data crosses task boundaries (PairVersion, ValidationReport, ids, paths), never models: the
models stay in the worker's :mod:`flows.model_cache`.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from prefect import task

log = logging.getLogger(__name__)


@dataclass
class PairTarget:
    """One (pair, alias) to validate tonight, resolved to an exact pair version."""

    pair: str
    alias: str
    version: str


@dataclass
class NightlyResult:
    """What the nightly flow did for one (pair, alias)."""

    pair: str
    alias: str
    version: str | None
    status: str  # passed | failed | inconclusive | skipped | already-running | error
    history_run_id: int | None = None
    mlflow_run_id: str | None = None
    acceptance_rate: float | None = None
    acceptance_rate_ci: list[float] = field(default_factory=list)
    alert_transition: str | None = None
    root_cause_hint: str | None = None
    report_dir: str | None = None
    evidently_html: str | None = None
    message: str = ""
    ungated_promotion: str | None = None  # champion only: flows.ungated (the alert's message)
    ungated_alert: str | None = None  # its transition: fire | remind-<n> | resolve


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:80]


def report_dir_for(home: Path, key) -> Path:
    """Deterministic directory of a run's report, from its idempotency key (so MLflow logging can
    be retried later from disk)."""
    return (home / "reports" / _safe(key.pair_name) / f"v{key.pair_version}"
            / f"{key.scheduled_date}-{key.heldout_version[:12]}-{key.config_hash[:12]}")


def retry_if_transient(task, task_run, state) -> bool:
    """Prefect ``retry_condition_fn``: retry only when MLflow was unreachable (not a missing pair)."""
    from registry import RegistryUnavailable

    try:
        state.result()
    except RegistryUnavailable:
        return True
    except Exception:
        return False
    return False


@task(retries=3, retry_delay_seconds=[5, 15, 45], retry_condition_fn=retry_if_transient,
      task_run_name="resolve {pair}@{alias}")
def resolve_pair_version(pair: str, alias: str) -> str | None:
    """The pair version ``alias`` points at now (read from MLflow, so UI promotions count).

    Returns None when the pair has no such alias (e.g. no challenger tonight).
    Raises:
        registry.PairNotFound: the pair is not registered (not retried).
    """
    from registry import AliasNotFound, resolve_alias

    try:
        return resolve_alias(pair, alias)
    except AliasNotFound as e:
        log.warning("%s", e)
        return None


@task(retries=3, retry_delay_seconds=[5, 15, 45], retry_condition_fn=retry_if_transient)
def log_to_mlflow(pair: str, version: str, report_dir: str, extra: list[str], run_key: str | None = None,
                  night: str | None = None) -> str:
    """Log the validation run (metrics, report, plots, Evidently files) and tag the pair version.

    ``night`` (``YYYY-MM-DD``, the history key's scheduled date) names the run ``<pair> v<N> night
    <night>``, so a run re-done or logged late keeps the date of the night it belongs to.

    ``run_key`` (the history key's :meth:`~monitoring.history.RunKey.key_id`) makes the logging
    idempotent: one finished MLflow run per nightly key, even after a crash mid-logging.
    Retried on transient failures; the caller keeps the history row pending if it still fails.
    """
    from flows.production_lib import trend_with_production
    from flows.recovery import checkpoint
    from registry import log_validation
    from specdec.validation.report import ValidationReport

    report = ValidationReport.read(report_dir)
    return log_validation(pair, version, report, report_dir, extra_artifacts=[p for p in extra if Path(p).exists()],
                          history=trend_with_production(pair), run_key=run_key,
                          run_name=f"{pair} v{version} night {night}" if night else None,
                          on_run_created=lambda _run_id: checkpoint("mlflow"))


def scheduled_date_of_run() -> dt.date:
    """The date this flow run was scheduled for (Prefect's expected start), else today (UTC)."""
    try:
        from prefect.runtime import flow_run

        start = flow_run.scheduled_start_time
        if start is not None:
            return dt.date(start.year, start.month, start.day)
    except Exception:  # not in a flow run
        pass
    return dt.datetime.now(dt.timezone.utc).date()
