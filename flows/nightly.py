"""The nightly validation flow: validate what ``champion`` and ``challenger`` point at, record
history, log to MLflow, alert on drift.

Per (pair, alias):

1. resolve the pair version from MLflow (aliases are read at run time, so a promotion done by hand
   in the MLflow UI is what gets validated);
2. load the models, cached on the worker;
3. validate with :mod:`specdec` (the same core that serves);
4. write history first (SQL; the idempotency key makes a retried night update its own row);
5. log the MLflow run with its artifacts and the Evidently report;
6. evaluate the drift rules and send alerts (one per incident, a reminder at most daily, one
   resolve message);
7. tag the pair version (``validation_status``; done by the MLflow logging step).

If MLflow is down, the history row keeps ``mlflow_logged = false`` and the next run logs it first.
Validation itself (the heavy part) goes through the flow's task runner, so
``parallel=True`` spreads pair versions over a Dask cluster (see :func:`nightly_flow_for`).
"""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.task_runners import ThreadPoolTaskRunner

from flows.tasks import NightlyResult, log_to_mlflow, report_dir_for, resolve_pair_version, scheduled_date_of_run


def _logger():
    try:
        return get_run_logger()
    except Exception:  # outside a run context
        return logging.getLogger("flows.nightly")


@task(task_run_name="validate {pv.name}@v{pv.version}", retries=1, retry_delay_seconds=30)
def run_validation(pv, heldout: str, limit: int | None, device: str, dtype: str,
                   out_dir: str, seed: int = 0, batch_size: int = 1):
    """Load the pair's models (worker cache) and validate them on the held-out set.

    ``pv`` is the :class:`registry.PairVersion` the flow already read (its models and its
    :class:`specdec.SpeculativeConfig`); nothing is fetched again.

    Returns:
        :class:`specdec.validation.report.ValidationReport`, also written to ``out_dir``.
    """
    from flows.loading import build_validation_config, cached_drafter, cached_target, load_pair_models
    from specdec.validation.heldout import load_heldout
    from specdec.validation import validate_pair

    log = _logger()
    pair, version = pv.name, pv.version
    tkey, dkey = load_pair_models(pv, device=device, dtype=dtype)

    def progress(done: int, total: int, row) -> None:
        acc = f"acceptance {row.acceptance_rate:.2f}" if row.status == "ok" else f"skipped: {row.skip_reason}"
        log.info("%s v%s: prompt %d/%d (%s) %s", pair, version, done, total, row.category, acc)

    report = validate_pair(cached_target(tkey), cached_drafter(dkey), load_heldout(heldout),
                           build_validation_config(pv.config, limit=limit, seed=seed, batch_size=batch_size),
                           target_ref=pv.target_uri,
                           progress=progress)
    report.write(out_dir)
    return report


@task(retries=2, retry_delay_seconds=[5, 20])
def retry_pending_mlflow_logging() -> list[str]:
    """Log to MLflow the history rows whose logging failed on an earlier night (oldest first).

    Returns the MLflow run ids logged now. Rows whose report directory is gone are reported and left.
    """
    import monitoring
    from monitoring import history
    from registry import RegistryUnavailable

    log = _logger()
    db = monitoring.connect()
    home = monitoring.get_settings().home
    done = []
    for row in history.runs_pending_mlflow(db):
        key = history.RunKey(row.pair_name, row.pair_version, row.heldout_name, row.heldout_version,
                             row.config_hash, row.scheduled_date)
        rdir = report_dir_for(home, key)
        if not (rdir / "report.json").exists():
            log.warning("history run %s: report %s is missing; cannot log it to MLflow", row.id, rdir)
            continue
        extra = [p for p in (row.evidently_html, row.evidently_json) if p]
        try:
            run_id = log_to_mlflow.fn(row.pair_name, row.pair_version, str(rdir), extra)
        except RegistryUnavailable as e:
            log.warning("MLflow still unreachable (%s); %s run(s) stay pending", e, "these")
            break
        history.mark_mlflow_logged(db, row.id, run_id)
        log.info("logged pending history run %s to MLflow run %s", row.id, run_id)
        done.append(run_id)
    return done


def _mlflow_link(run_id: str) -> str:
    from registry.settings import get_client, resolve_tracking_uri

    uri = resolve_tracking_uri()
    try:
        exp = get_client(uri, check=False).get_run(run_id).info.experiment_id
    except Exception:
        exp = "0"
    if uri.startswith("http"):
        return f"{uri.rstrip('/')}/#/experiments/{exp}/runs/{run_id}"
    return f"runs:/{run_id} (mlflow ui --backend-store-uri {uri})"


def _finish(pair: str, alias: str, version: str, key, claim, report, report_dir: Path,
            champion_version: str | None, target_hash: str | None, draft_hash: str | None,
            log_task=None) -> NightlyResult:
    """Steps 4-7 for one validated pair version, in the flow process (serial, cheap).

    Needs nothing from MLflow before the history row is written, so an MLflow outage loses nothing.
    """
    import monitoring
    from monitoring import history
    from registry import RegistryError

    log = _logger()
    log_task = log_task or log_to_mlflow
    db = monitoring.connect()
    lineage = monitoring.Lineage.from_report(report, target_hash=target_hash, draft_hash=draft_hash)
    run_id = history.record_run(db, report, key, lineage, claim=claim, alias=alias)  # 4. history first
    ev = monitoring.evaluate_run(db, run_id, champion_version=champion_version)
    drift = monitoring.drift_report(db, ev, out_dir=report_dir / "evidently")
    extra = [str(drift.html_path), str(drift.json_path)] if drift is not None else []
    links: dict[str, str] = {"Report": str(report_dir / "report.json")}
    if drift is not None:
        links["Evidently report"] = str(drift.html_path)
    mlflow_run_id = None
    try:  # 5 + 7: MLflow run, artifacts, pair-version tags
        mlflow_run_id = log_task(pair, version, str(report_dir), extra)
        history.mark_mlflow_logged(db, run_id, mlflow_run_id)
        links["MLflow run"] = _mlflow_link(mlflow_run_id)
    except RegistryError as e:
        log.error("MLflow logging failed (%s): history run %s kept, retried on the next run", e, run_id)
    outcome = monitoring.alert(db, ev, links=links)  # 6. drift rules -> incident lifecycle
    o = report.overall
    return NightlyResult(
        pair=pair, alias=alias, version=version, status=ev.verdict, history_run_id=run_id,
        mlflow_run_id=mlflow_run_id, acceptance_rate=o.acceptance_rate, acceptance_rate_ci=list(o.acceptance_rate_ci),
        alert_transition=outcome.transition, root_cause_hint=ev.root_cause_hint, report_dir=str(report_dir),
        evidently_html=str(drift.html_path) if drift is not None else None,
        message="; ".join(r.message for r in ev.firing) if ev.firing else "",
    )


@flow(name="nightly-validation", log_prints=True, task_runner=ThreadPoolTaskRunner(max_workers=1))
def nightly_validation_flow(
    pairs: list[str] = ["specdec-pair"],  # noqa: B006 (Prefect parameters must be JSON defaults)
    aliases: tuple[str, ...] = ("champion", "challenger"),
    heldout: str = "spec_bench",
    limit: int | None = 48,
    device: str = "auto",
    dtype: str = "auto",
    scheduled_date: dt.date | None = None,
    seed: int = 0,
    batch_size: int = 1,
) -> list[NightlyResult]:
    """Validate every (pair, alias) and alert on drift. See the module docstring for the steps.

    Args:
        pairs: pair registered-model names.
        aliases: which aliases to validate; a version behind two aliases is validated once.
        heldout: held-out set name or JSONL path (:func:`specdec.validation.heldout.load_heldout`).
        limit: stratified subset size (None = the whole set).
        device / dtype: ``auto`` picks CUDA + bf16 where a GPU exists, else CPU + fp32.
        scheduled_date: the night this run belongs to (default: the flow run's scheduled date);
            part of the idempotency key, so a retry of the same night updates the same row.
        seed: subset and sampling seed.
        batch_size: prompts decoded together (>= 1); speed metrics are measured at this batch
            size, so a value other than 1 is part of the run's config hash (drift baselines
            compare runs with the same config).
    Returns:
        one :class:`flows.tasks.NightlyResult` per (pair, alias).
    Raises:
        ValueError: ``batch_size`` < 1.
    """
    import monitoring
    from monitoring import history
    from monitoring.history import RunAlreadyClaimed
    from registry import get_pair_version
    from specdec.validation.heldout import load_heldout

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    log = _logger()
    night = scheduled_date or scheduled_date_of_run()
    retry_pending_mlflow_logging()
    held = load_heldout(heldout)
    db = monitoring.connect()
    home = monitoring.get_settings().home
    results: list[NightlyResult] = []
    jobs = []
    seen: dict[tuple[str, str], str] = {}
    for pair in pairs:
        champion = resolve_pair_version(pair, "champion")
        for alias in aliases:
            version = champion if alias == "champion" else resolve_pair_version(pair, alias)
            if version is None:
                results.append(NightlyResult(pair, alias, None, "skipped", message=f"no @{alias}"))
                continue
            if (pair, version) in seen:
                results.append(NightlyResult(pair, alias, version, "skipped",
                                             message=f"same version as @{seen[(pair, version)]}"))
                continue
            seen[(pair, version)] = alias
            pv = get_pair_version(pair, version, download=False)
            cfg = {**pv.config.to_dict(), "drafter_kind": pv.drafter_kind, "limit": limit, "seed": seed}
            if batch_size != 1:  # absent at 1: keys of runs made before batching stay the same
                cfg["batch_size"] = batch_size
            key = history.RunKey.build(pair, version, held.name, held.version, cfg, night)
            try:
                claim = history.claim_run(db, key, alias=alias,
                                          stale_after_s=monitoring.get_settings().claim_stale_after_s)
            except RunAlreadyClaimed as e:
                log.warning("%s@%s v%s: %s; leaving it to that run", pair, alias, version, e)
                results.append(NightlyResult(pair, alias, version, "already-running", message=str(e)))
                continue
            out = report_dir_for(home, key)
            args = (pv, heldout, limit, device, dtype, str(out), seed, batch_size)
            fut = _Inline.run(run_validation, args) if _serial() else run_validation.submit(*args)
            hashes = (pv.target_weights_sha256, pv.draft_weights_sha256)
            jobs.append((pair, alias, version, key, claim, out, champion, hashes, fut))

    for pair, alias, version, key, claim, out, champion, hashes, fut in jobs:
        try:
            report = fut.result()
        except Exception as e:  # validation failed: record it, free the key for a retry
            history.mark_error(db, claim, f"{type(e).__name__}: {e}")
            log.error("%s@%s v%s: validation failed: %s", pair, alias, version, e)
            results.append(NightlyResult(pair, alias, version, "error", message=str(e)))
            continue
        res = _finish(pair, alias, version, key, claim, report, out, champion, *hashes)
        log.info("%s@%s v%s: %s, acceptance %.3f [%.3f, %.3f]%s", pair, alias, version, res.status,
                 res.acceptance_rate, *res.acceptance_rate_ci,
                 f", alert: {res.alert_transition}" if res.alert_transition else "")
        results.append(res)
    return results


def _serial() -> bool:
    """True when the flow runs with its default one-worker thread pool: validations then run in the
    flow's own thread (the main thread of ``specdec nightly run``), since the speed it measures
    depends on it. bf16 matmuls (oneDNN) run about 2x slower from a worker thread's OpenMP team
    than from the main thread (measured on this machine: 114 vs 59 us per 1x576x1536 linear), which
    would make a bf16 draft look far costlier than it serves."""
    try:
        from prefect.context import get_run_context

        return isinstance(get_run_context().task_runner, ThreadPoolTaskRunner)
    except Exception:  # noqa: BLE001 (outside a flow run: submit as usual)
        return False


class _Inline:
    """The outcome of a task called in the flow's thread, with the ``.result()`` of a future."""

    def __init__(self, value=None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error

    @classmethod
    def run(cls, task_obj, args) -> "_Inline":
        try:
            return cls(task_obj(*args))
        except Exception as e:  # noqa: BLE001 (re-raised by result(), as a future would)
            return cls(error=e)

    def result(self):
        if self.error is not None:
            raise self.error
        return self.value


def nightly_flow_for(parallel: bool = False, dask_workers: int = 2, dask_address: str | None = None):
    """The nightly flow with a task runner: threads (default, one at a time) or Dask.

    ``parallel=True`` validates pair versions concurrently on a Dask cluster through
    ``prefect-dask``: a local cluster of ``dask_workers`` single-threaded processes, or an existing
    scheduler at ``dask_address`` (e.g. one ``dask worker`` per GPU, each with its own
    ``CUDA_VISIBLE_DEVICES``).
    """
    if not parallel:
        return nightly_validation_flow
    from prefect_dask import DaskTaskRunner

    if dask_address:
        runner = DaskTaskRunner(address=dask_address)
    else:
        runner = DaskTaskRunner(cluster_kwargs={"n_workers": dask_workers, "threads_per_worker": 1,
                                                "processes": True, "dashboard_address": None})
    return nightly_validation_flow.with_options(task_runner=runner)
