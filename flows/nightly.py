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
7. tag the pair version (``validation_status``; done by the MLflow logging step);
8. ungated promotions: ``@champion`` moved outside specdec to a version that did not pass the gate
   is noticed before validating, validated first (champion before challenger) and alerted
   (:mod:`flows.ungated`).

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

from flows.recovery import checkpoint
from flows.tasks import NightlyResult, log_to_mlflow, report_dir_for, resolve_pair_version, scheduled_date_of_run
from flows.ungated import check_ungated, report_ungated, version_link


def _logger():
    try:
        return get_run_logger()
    except Exception:  # outside a run context
        return logging.getLogger("flows.nightly")


@task(task_run_name="validate {pv.name}@v{pv.version}", retries=1, retry_delay_seconds=30)
def run_validation(pv, heldout: str, limit: int | None, device: str, dtype: str,
                   out_dir: str, seed: int = 0, batch_size: int = 1, method: str = "decode",
                   decode_fraction: float = 0.25):
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
        checkpoint("validation")

    config = build_validation_config(pv.config, limit=limit, seed=seed, batch_size=batch_size)
    if method == "decode":
        report = validate_pair(cached_target(tkey), cached_drafter(dkey), load_heldout(heldout), config,
                               target_ref=pv.target_uri, progress=progress)
    else:  # replay every prompt (cached target continuations), decode a stratified subsample
        from specdec.validation.replay_report import validate_replay

        def phase(name: str, done: int, total: int) -> None:
            log.info("%s v%s: %s %d/%d", pair, version, name, done, total)
            checkpoint("validation")

        [report] = validate_replay(cached_target(tkey), [cached_drafter(dkey)], load_heldout(heldout), config,
                                   method=method, decode_fraction=decode_fraction, target_ref=pv.target_uri,
                                   progress=phase)
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
            run_id = log_to_mlflow.fn(row.pair_name, row.pair_version, str(rdir), extra, key.key_id(),
                                      key.scheduled_date.isoformat())
        except RegistryUnavailable as e:
            log.warning("MLflow still unreachable (%s); %s run(s) stay pending", e, "these")
            break
        except Exception as e:  # noqa: BLE001 (one bad row must not stop tonight's validation)
            log.error("history run %s: MLflow logging failed again (%s: %s); it stays pending", row.id,
                      type(e).__name__, e)
            continue
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
        from registry.describe import ML_VIEW

        return f"{uri.rstrip('/')}/#/experiments/{exp}/runs/{run_id}{ML_VIEW}"
    return f"runs:/{run_id} (mlflow ui --backend-store-uri {uri})"


def _finish(pair: str, alias: str, version: str, key, claim, report, report_dir: Path,
            champion_version: str | None, target_hash: str | None, draft_hash: str | None,
            log_task=None) -> NightlyResult:
    """Steps 4-7 for one validated pair version, in the flow process (serial, cheap), through the
    tested :func:`monitoring.pipeline.record_and_evaluate` path.

    The history row, the drift rules and the alert always happen; the Evidently report, the
    MLflow run (with its plots and artifacts) are best-effort: an error there is logged and the
    alert still goes out. Needs nothing from MLflow before the history row is written, so an MLflow
    outage loses nothing (the row stays pending and is logged on the next run).
    """
    import monitoring
    from monitoring.pipeline import record_and_evaluate

    log = _logger()
    log_task = log_task or log_to_mlflow
    db = monitoring.connect()
    lineage = monitoring.Lineage.from_report(report, target_hash=target_hash, draft_hash=draft_hash)
    mlflow_run: dict[str, str] = {}

    def log_mlflow(run_id: int, ev, drift, links: dict[str, str]) -> None:  # 5 + 7, best-effort
        from monitoring import history

        extra = [str(drift.html_path), str(drift.json_path)] if drift is not None else []
        try:
            mlflow_run_id = log_task(pair, version, str(report_dir), extra, key.key_id(), key.scheduled_date.isoformat())
        except Exception as e:  # noqa: BLE001 (RegistryError or anything else: the alert goes out)
            log.error("MLflow logging failed (%s: %s): history run %s kept, logged on the next run",
                      type(e).__name__, e, run_id)
            links["Report (file on the worker)"] = str(report_dir / "report.json")  # no MLflow run to link
            return
        history.mark_mlflow_logged(db, run_id, mlflow_run_id)
        mlflow_run["id"] = mlflow_run_id
        try:
            links["MLflow run"] = _mlflow_link(mlflow_run_id)
        except Exception:  # noqa: BLE001
            links["MLflow run"] = f"runs:/{mlflow_run_id}"
        links["Pair version"] = version_link(pair, version)

    checkpoint("history")
    out = record_and_evaluate(db, report, key, lineage, claim=claim, alias=alias,  # 4 history first, 6 rules
                              champion_version=champion_version, links={},
                              before_alert=log_mlflow, evidently_dir=report_dir / "evidently")
    ev, drift = out.evaluation, out.drift
    o = report.overall
    return NightlyResult(
        pair=pair, alias=alias, version=version, status=ev.verdict, history_run_id=out.run_id,
        mlflow_run_id=mlflow_run.get("id"), acceptance_rate=o.acceptance_rate,
        acceptance_rate_ci=list(o.acceptance_rate_ci), alert_transition=out.alert.transition,
        root_cause_hint=ev.root_cause_hint, report_dir=str(report_dir),
        evidently_html=str(drift.html_path) if drift is not None else None,
        message="; ".join(r.message for r in ev.firing) if ev.firing else "",
    )


def _broken(db, pair: str, alias: str, version: str | None, error: BaseException, what: str) -> NightlyResult:
    """One clear log line and one alert for a (pair, alias) that could not be validated."""
    from monitoring.pipeline import alert_broken

    msg = f"{pair}@{alias}" + (f" v{version}" if version else "") + f": {what}: {type(error).__name__}: {error}"
    _logger().error("%s (the other aliases are still validated)", msg)
    transition = None
    try:
        transition = alert_broken(db, pair, alias, msg, version=version).transition
    except Exception as e:  # noqa: BLE001
        _logger().error("%s@%s: the alert for this error could not be queued: %s: %s", pair, alias, type(e).__name__, e)
    return NightlyResult(pair, alias, version, "error", message=msg, alert_transition=transition)


@flow(name="nightly-validation", log_prints=True, task_runner=ThreadPoolTaskRunner(max_workers=1))
def nightly_validation_flow(
    pairs: list[str] = ["specdec-pair"],  # noqa: B006 (Prefect parameters must be JSON defaults)
    aliases: tuple[str, ...] = ("champion", "challenger"),
    heldout: str = "spec_bench",
    limit: int | None = 192,
    device: str = "auto",
    dtype: str = "auto",
    scheduled_date: dt.date | None = None,
    seed: int = 0,
    batch_size: int = 1,
    method: str = "both",
    decode_fraction: float = 0.25,
    versions: list[str] | None = None,
    revert_ungated: bool = False,
    fail_on_failure: bool = False,
) -> list[NightlyResult]:
    """Validate every (pair, alias) and alert on drift. See the module docstring for the steps.

    Args:
        pairs: pair registered-model names.
        aliases: which aliases to validate; a version behind two aliases is validated once.
        heldout: held-out set name or JSONL path (:func:`specdec.validation.heldout.load_heldout`).
        limit: stratified subset size over all six Spec-Bench categories (None = the whole set); 192 by
            default: the replay makes every prompt cheap, and 25% of 192 are decoded (as many as the
            48-prompt decode-only nightly decoded).
        method: ``both`` (default: replay every prompt from the cached target continuation, decode a
            stratified ``decode_fraction`` subsample, compare them), ``replay`` or ``decode``
            (:func:`specdec.validation.replay_report.validate_replay`; docs/metrics.md "Replay").
        decode_fraction: share of the prompts decoded with ``method="both"`` (at least 2 per category).
        versions: pair versions to validate as well, by number (``specdec pair watch`` validates exactly
            the version a registry event named; recorded under the alias ``challenger``).
        revert_ungated: an ungated ``@champion`` that fails tonight is moved back to the last version
            that passed the gate (``specdec pair watch --revert``); the alert says so.
        fail_on_failure: the flow run fails (:class:`flows.summary.ValidationsFailed`) when a validation
            failed or could not run (deployments set it; a summary artifact is published either way).
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
        ValueError: ``batch_size`` < 1, or an alias not in ``SPECDEC_ALIASES``.
    """
    import monitoring
    from flows.recovery import Heartbeat, NightlyLease, forget_claim, holder_dead
    from monitoring import history
    from monitoring.history import RunAlreadyClaimed
    from registry import RegistryUnavailable, get_pair_version
    from specdec.validation.heldout import load_heldout

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if scheduled_date is not None and not isinstance(scheduled_date, dt.date):
        # also keeps `dt` among the globals cloudpickle sends with a served flow (`flow.serve()` runs it
        # in a spawned process; the annotation `dt.date` must resolve there)
        raise ValueError(f"scheduled_date must be a date, got {scheduled_date!r}")
    from registry.promotion import check_alias_name

    for a in aliases:  # a typo in a deployment's parameters fails the run instead of validating nothing
        check_alias_name(a)
    log = _logger()
    night = scheduled_date or scheduled_date_of_run()
    held = load_heldout(heldout)
    settings = monitoring.get_settings()
    db = monitoring.connect()
    home = settings.home
    lease = NightlyLease.mine(home)
    try:
        from prefect.runtime import flow_run

        lease.flow_run_id = flow_run.id
        lease.save()
    except Exception:  # noqa: BLE001 (outside a flow run)
        pass
    retry_pending_mlflow_logging()
    results: list[NightlyResult] = []
    jobs = []
    seen: dict[tuple[str, str], str] = {}
    dead = holder_dead(home)
    beat = Heartbeat(db, settings.claim_stale_after_s / 10)
    ungated = {}
    for pair in pairs:
        try:  # before validating: was champion moved outside specdec?
            ungated[pair] = check_ungated(pair, aliases)
        except RegistryUnavailable:
            raise
        except Exception as e:  # noqa: BLE001 (a broken alias is reported below, per alias)
            log.warning("%s: ungated-promotion check skipped: %s: %s", pair, type(e).__name__, e)
        try:
            champion = resolve_pair_version(pair, "champion")
        except RegistryUnavailable:
            raise
        except Exception as e:  # noqa: BLE001 (a broken champion must not hide the challenger)
            results.append(_broken(db, pair, "champion", None, e, "cannot resolve the alias"))
            champion = None
            aliases_left = [a for a in aliases if a != "champion"]
        else:
            aliases_left = list(aliases)
        for alias, fixed in [(a, None) for a in aliases_left] + [("challenger", str(v)) for v in versions or []]:
            version = None
            try:
                version = fixed or (champion if alias == "champion" else resolve_pair_version(pair, alias))
                if version is None:
                    results.append(NightlyResult(pair, alias, None, "skipped", message=f"no @{alias}"))
                    continue
                if (pair, version) in seen:
                    results.append(NightlyResult(pair, alias, version, "skipped",
                                                 message=f"same version as @{seen[(pair, version)]}"))
                    continue
                pv = get_pair_version(pair, version, download=False)
            except RegistryUnavailable:
                raise
            except Exception as e:  # noqa: BLE001 (one bad alias does not hide the rest)
                results.append(_broken(db, pair, alias, version, e, "cannot resolve the pair version"))
                continue
            seen[(pair, version)] = alias
            cfg = {**pv.config.to_dict(), "drafter_kind": pv.drafter_kind, "limit": limit, "seed": seed}
            if batch_size != 1:  # absent at 1: keys of runs made before batching stay the same
                cfg["batch_size"] = batch_size
            if method != "decode":  # absent for decode: keys of runs made before replay stay the same
                cfg.update(method=method, decode_fraction=decode_fraction)
            key = history.RunKey.build(pair, version, held.name, held.version, cfg, night)
            try:
                claim = history.claim_run(db, key, alias=alias, stale_after_s=settings.claim_stale_after_s,
                                          holder_dead=dead)
            except RunAlreadyClaimed as e:
                log.warning("%s@%s v%s: %s; leaving it to that run", pair, alias, version, e)
                results.append(NightlyResult(pair, alias, version, "already-running", message=str(e)))
                continue
            if claim.previous_status and claim.previous_status.startswith("running"):
                log.warning("%s@%s v%s: took over history run %s (%s)", pair, alias, version, claim.run_id,
                            claim.previous_status)
            lease.add_claim(claim.run_id, claim.token)
            forget_claim(home, claim.run_id)
            beat.add(claim)
            out = report_dir_for(home, key)
            args = (pv, heldout, limit, device, dtype, str(out), seed, batch_size, method, decode_fraction)
            fut = _Inline.run(run_validation, args) if _serial() else run_validation.submit(*args)
            hashes = (pv.target_weights_sha256, pv.draft_weights_sha256)
            jobs.append((pair, alias, version, key, claim, out, champion, hashes, fut))

    with beat:
        for pair, alias, version, key, claim, out, champion, hashes, fut in jobs:
            try:
                report = fut.result()
            except Exception as e:  # noqa: BLE001 (validation failed: record it, free the key, alert)
                beat.remove(claim.run_id)
                history.mark_error(db, claim, f"{type(e).__name__}: {e}")
                lease.drop_claim(claim.run_id)
                results.append(_broken(db, pair, alias, version, e, "validation failed"))
                continue
            beat.remove(claim.run_id)
            try:
                res = _finish(pair, alias, version, key, claim, report, out, champion, *hashes)
            except RunAlreadyClaimed as e:  # taken over while we were slow: the other run records it
                log.warning("%s@%s v%s: %s", pair, alias, version, e)
                results.append(NightlyResult(pair, alias, version, "already-running", message=str(e)))
                continue
            except Exception as e:  # noqa: BLE001 (e.g. the history store failed: say so, go on)
                history.mark_error(db, claim, f"{type(e).__name__}: {e}")
                results.append(_broken(db, pair, alias, version, e, "recording the validation failed"))
                continue
            finally:
                lease.drop_claim(claim.run_id)
            log.info("%s@%s v%s: %s, acceptance %.3f [%.3f, %.3f]%s", pair, alias, version, res.status,
                     res.acceptance_rate, *res.acceptance_rate_ci,
                     f", alert: {res.alert_transition}" if res.alert_transition else "")
            results.append(res)
    report_ungated(db, ungated, results, revert=revert_ungated)  # after the champion's validation: alert with tonight's verdict
    from flows.summary import finish_run

    return finish_run(results, fail_on_failure)


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
