"""Small Prefect tasks of the nightly validation. Each wraps one call into registry, monitoring or
specdec, with retries declared where a failure is transient (a server that is briefly down).

Plain data crosses task boundaries (PairVersion, ValidationReport, ids, paths), never models: the
models stay in the worker's :mod:`flows.model_cache`. The tasks that talk to MLflow take the night's
registry service (:class:`registry.service.Registry`, required) and are never
cached (``NO_CACHE``: they read or write the registry, and a service is no cache key).
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from registry.errors import RegistryUnavailable

log = logging.getLogger(__name__)


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
    per_token_acceptance: float | None = None  # the floor's metric (docs/metrics.md "Per-token acceptance")
    per_token_acceptance_ci: list[float] = field(default_factory=list)
    num_speculative_tokens: int | None = None
    alert_transition: str | None = None
    root_cause_hint: str | None = None
    report_dir: str | None = None
    evidently_html: str | None = None
    message: str = ""
    speedup: float | None = None  # measured, x (median of paired per-prompt ratios); None when not measured
    speedup_ci: list[float] = field(default_factory=list)
    ungated_promotion: str | None = None  # champion only: flows.ungated (the alert's message)
    ungated_alert: str | None = None  # its transition: fire | remind-<n> | resolve


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:80]


def report_dir_for(home: Path, key) -> Path:
    """Deterministic directory of a run's report, from its idempotency key (so MLflow logging can
    be retried later from disk); a keyed alias is part of it (two aliases' runs of one day never share one)."""
    alias = f"-{_safe(key.alias)}" if getattr(key, "alias", "") else ""
    return (home / "reports" / _safe(key.pair_name) / f"v{key.pair_version}"
            / f"{key.scheduled_date}-{key.heldout_version[:12]}-{key.config_hash[:12]}{alias}")


def run_logger(fallback: str):
    """Prefect's run logger inside a flow or task run, else the standard logger ``fallback``."""
    from prefect import get_run_logger

    try:
        return get_run_logger()
    except Exception:  # noqa: BLE001 (prefect raises its own MissingContextError outside a run; any failure means "no run logger")
        return logging.getLogger(fallback)


def retry_when(*errors: type[BaseException]):
    """A Prefect ``retry_condition_fn`` that retries a task only when it failed with one of ``errors``."""

    def condition(task, task_run, state) -> bool:
        try:
            state.result()
        except errors:
            return True
        except Exception:  # noqa: BLE001 (a retry classifier: every other error of the task means "do not retry")
            return False
        return False

    return condition


#: retry only when MLflow was unreachable (not a missing pair)
retry_if_transient = retry_when(RegistryUnavailable)


@task(retries=3, retry_delay_seconds=[5, 15, 45], retry_condition_fn=retry_if_transient,
      task_run_name="resolve {pair}@{alias}", cache_policy=NO_CACHE)
def resolve_pair_version(pair: str, alias: str, registry) -> str | None:
    """The pair version ``alias`` points at now (read from MLflow, so UI promotions count); ``registry``: the
    night's MLflow service.

    Returns None when the pair has no such alias (e.g. no challenger tonight).
    Raises:
        registry.PairNotFound: the pair is not registered (not retried).
    """
    from registry import AliasNotFound, resolve_alias

    try:
        return resolve_alias(pair, alias, registry=registry)
    except AliasNotFound as e:
        log.warning("%s", e)
        return None


@dataclass(frozen=True)
class MlflowLogging:
    """What one nightly MLflow run is made of (plain data, so the task can be retried).

    Attributes:
        pair, version: the pair version validated. report_dir: holds ``report.json`` + ``prompts.csv``.
        extra: more files to attach (the Evidently HTML/JSON; missing ones are skipped).
        run_key: the history key's :meth:`~monitoring.history.RunKey.key_id`: one finished MLflow run
            per nightly key, even after a crash mid-logging.
        night: ``YYYY-MM-DD``, the key's scheduled date: the run is named ``<pair> v<N> night <night>``,
            so a run re-done or logged late keeps the date of the night it belongs to.
        trend: the pair's past trend points from the history store (:func:`monitoring.history.trend_points`),
            the one source of the trend plot.
        verdict: the night's verdict word (the history row's status), the run's ``validation_status``.
    """

    pair: str
    version: str
    report_dir: str
    extra: list[str]
    run_key: str
    night: str
    trend: list[dict]
    verdict: str | None = None


@task(retries=3, retry_delay_seconds=[5, 15, 45], retry_condition_fn=retry_if_transient, cache_policy=NO_CACHE)
def log_to_mlflow(job: MlflowLogging, registry, gate) -> str:
    """Log the validation run (metrics, report, plots, Evidently files) and tag the pair version; the
    descriptions are the nightly's last step (:func:`describe_version`). ``registry``: the night's MLflow
    service; ``gate``: its :class:`registry.gate.GateConfig`.

    Retried on transient failures; the caller keeps the history row pending if it still fails.
    Returns the MLflow run id.
    """
    from registry import log_validation
    from specdec.validation.report import ValidationReport

    report = ValidationReport.read(job.report_dir)
    return log_validation(job.pair, job.version, report, job.report_dir,
                          extra_artifacts=[p for p in job.extra if Path(p).exists()], history=job.trend,
                          run_key=job.run_key, run_name=f"{job.pair} v{job.version} night {job.night}", describe=False,
                          gate=gate, registry=registry, verdict=job.verdict)


@task(retries=2, retry_delay_seconds=[5, 20], retry_condition_fn=retry_if_transient, cache_policy=NO_CACHE)
def describe_version(pair: str, version: str, mlflow_run_id: str, registry) -> None:
    """The pair version's and the run's one-line descriptions in MLflow (:func:`registry.runs.describe_validation`);
    ``registry``: the night's MLflow service."""
    from registry.runs import describe_validation

    describe_validation(pair, version, mlflow_run_id, registry=registry)


def scheduled_date_of_run() -> dt.date:
    """The date this flow run was scheduled for (Prefect's expected start), else today (UTC)."""
    try:
        from prefect.runtime import flow_run

        start = flow_run.scheduled_start_time
        if start is not None:
            return dt.date(start.year, start.month, start.day)
    except Exception:  # noqa: BLE001 (prefect.runtime outside a flow run raises its own types; fall back to today)
        pass
    return dt.datetime.now(dt.timezone.utc).date()
