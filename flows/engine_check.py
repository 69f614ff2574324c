"""The nightly's engine step: for each pair version that names an engine endpoint (pair-version tags
``engine_url`` and, optionally, ``engine_flags``: the command line the deployment runs the engine
with, as a JSON list), send tonight's held-out prompts to the running engine, compare its counters
with the core's for the same prompts (:func:`specdec.validation.validate`, method ``engine``), record a
history row with source ``engine`` and its ``engine`` (shown as ``engine:<engine>``), evaluate it and run
its incident lifecycle (:mod:`monitoring.engine_checks`).

The engine does the heavy work (for a large target: the team's own vLLM/llama.cpp deployment with
its tensor or data parallelism); the nightly sends prompts, reads counters and replays the draft.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from flows.tasks import NightlyResult

ENGINE_URL_TAG, ENGINE_FLAGS_TAG, ENGINE_CONCURRENCY_TAG = "engine_url", "engine_flags", "engine_concurrency"

log = logging.getLogger("specdec.nightly")


def engine_endpoint(pv, *, api_key: str | None) -> Any:
    """The :class:`~specdec.validation.engine_check.EngineEndpoint` a pair version names (asked with ``api_key``,
    the core section's ``engine_api_key``), or None."""
    from specdec.redact import redact_argv
    from specdec.validation.engine_check import EngineEndpoint

    tags = pv.tags or {}
    url = tags.get(ENGINE_URL_TAG)
    if not url:
        return None
    flags = tags.get(ENGINE_FLAGS_TAG)
    # a credential in flags tagged before `pair engine` redacted them never reaches the history (specdec.redact)
    return EngineEndpoint(url=url, engine=tags.get("engine"), api_key=api_key,  # no tag: the default engine
                          flags=tuple(redact_argv(json.loads(flags))) if flags else None)


def engine_continuations_for(pv):
    """The engine continuations of the engine ``pv`` names, with this flow run's core section (key, limits)."""
    from flows.settings import for_this_run
    from specdec.engines.profile import EngineLimits
    from specdec.validation.engine_continuations import connect_engine

    core = for_this_run().core
    ep = engine_endpoint(pv, api_key=core.engine_api_key)
    if ep is None:
        raise ValueError(f"{pv.name} v{pv.version} names no engine (tag engine_url): continuations='engine' needs "
                         "one (`specdec pair engine`)")
    return connect_engine(ep, EngineLimits.of(core))


def pair_identity(pv, target: Any) -> Any:
    """What a registered pair version says its engine must serve: the files its tags name
    (``<side>.serve_ref``, ``<side>.gguf_sha256``) and the loaded target's vocabulary and BOS/EOS."""
    from pathlib import Path

    from specdec.engines.profile import PairFiles, PairIdentity

    tags = pv.tags or {}

    def side(name: str) -> tuple[str | None, str | None]:
        ref = tags.get(f"{name}.serve_ref")
        return (Path(ref).name if ref and str(ref).endswith(".gguf") else None), tags.get(f"{name}.gguf_sha256")

    (t_file, t_sha), (d_file, d_sha) = side("target"), side("draft")
    files = PairFiles(target_file=t_file, target_sha256=t_sha, draft_file=d_file, draft_sha256=d_sha)
    return PairIdentity.of_loaded(target.tokenizer, target.model, files)


def run_engine_check(night, target, params) -> NightlyResult | None:
    """The engine step for one (pair, alias) target; None when its pair version names no engine.

    An engine that cannot be measured (unreachable, a malformed or impossible answer, past its deadline, a
    synthetic-acceptance mode: :class:`~specdec.engines.errors.EngineRequestError`) makes the target's engine
    row ``error`` with one log line and one alert of scope ``engine:<engine>``
    (:func:`monitoring.engine_checks.alert_engine_error`); nothing is recorded in the history.
    """
    from flows.loading import build_validation_config
    from monitoring import engine_checks
    from specdec.engines.client import safe_url
    from specdec.engines.errors import EngineRequestError

    pv = target.pv
    endpoint = engine_endpoint(pv, api_key=night.core.engine_api_key)
    if endpoint is None:
        return None
    config = build_validation_config(pv.config, limit=params.limit, seed=params.seed)
    where = f"{target.pair}@{target.alias} v{target.version} engine check ({endpoint.engine})"
    try:
        report = _check(night, pv, params, endpoint, config)
    except EngineRequestError as e:
        log.error("%s: %s", where, e)
        transition = engine_checks.alert_engine_error(
            night.db, pair=target.pair, version=target.version, alias=target.alias, engine=endpoint.engine,
            url=safe_url(endpoint.url or ""), message=f"{where}: {e}", settings=night.settings)
        return NightlyResult(target.pair, f"{target.alias} ({engine_checks.source_of(endpoint.engine)})", target.version,
                             "error", message=f"{where}: {e}", alert_transition=transition)
    run_id = engine_checks.record_engine_check(night.db, report, pair=target.pair, version=target.version,
                                               alias=target.alias, scheduled_date=night.date)
    ev = engine_checks.evaluate_engine_check(night.db, run_id, settings=night.settings)
    transition = engine_checks.alert_engine_check(night.db, ev, settings=night.settings)
    o = report.overall
    log.info("%s: %s, engine %.3f vs core %.3f (difference %+.3f [%+.3f, %+.3f])%s", where, ev.verdict,
             o.engine_acceptance_rate, o.core_acceptance_rate, o.difference, *o.difference_ci,
             f", alert: {transition}" if transition else "")
    mlflow_run_id = log_engine_check_run(night, target, report, run_id)
    return NightlyResult(target.pair, f"{target.alias} ({engine_checks.source_of(endpoint.engine)})", target.version,
                         ev.verdict, history_run_id=run_id, mlflow_run_id=mlflow_run_id,
                         acceptance_rate=o.engine_acceptance_rate,
                         acceptance_rate_ci=list(o.engine_acceptance_rate_ci), alert_transition=transition,
                         root_cause_hint=ev.root_cause_hint,
                         message="; ".join(r.message for r in ev.results if r.firing))


def _check(night, pv, params, endpoint, config) -> Any:
    """The engine check of ``pv`` through :func:`specdec.validation.validate` (method ``engine``). With
    ``params.continuations == "engine"`` the target stays in its engine here too: a served target (no weights
    read) and the engine's own target-only continuations, which the night's replay already cached (in the cache of
    the night's home, ``night.core.home``)."""
    from flows.loading import cached_drafter, cached_target, load_pair_models
    from specdec.engines.profile import EngineLimits
    from specdec.validation.api import ValidationRequest, validate
    from specdec.validation.continuation_cache import ContinuationCache
    from specdec.validation.engine_check import EngineCheck
    from specdec.validation.engine_continuations import connect_engine

    limits = EngineLimits.of(night.core)
    continuations = connect_engine(endpoint, limits) if params.continuations == "engine" else None
    try:
        tkey, dkey = load_pair_models(pv, device=params.device, dtype=params.dtype, served=continuations is not None)
        loaded = cached_target(tkey)
        check = EngineCheck(endpoint, concurrency=int((pv.tags or {}).get(ENGINE_CONCURRENCY_TAG, 1)),
                            limits=limits, pair=pair_identity(pv, loaded))
        extra = {"engine": continuations, "target_weights": pv.target_weights_sha256} if continuations else {}
        return validate(ValidationRequest(loaded, [cached_drafter(dkey)], night.held, config, method="engine",
                                          target_ref=pv.target_uri, engine_check=check,
                                          cache=ContinuationCache.in_home(night.core.home), **extra))[0].engine_check
    finally:
        if continuations is not None:
            continuations.close()


def log_engine_check_run(night, target, report, history_run_id: int) -> str | None:
    """Write ``engine_check.json`` under ``<home>/reports/<pair>/v<version>/<night>-engine`` and log it as an
    MLflow run (:func:`registry.engine_runs.log_engine_check`), then mark the history row logged.
    Best-effort, as a validation's MLflow run: a failure is logged with its reason (the row stays pending)
    and returns None."""
    from monitoring import engine_checks, history
    from registry.engine_runs import log_engine_check
    from specdec.validation.engine_cli import ENGINE_REPORT_FILE

    try:
        out_dir = night.home / "reports" / _safe(target.pair) / f"v{target.version}" / f"{night.date.isoformat()}-engine"
        out_dir.mkdir(parents=True, exist_ok=True)
        doc = report.to_dict()
        (out_dir / ENGINE_REPORT_FILE).write_text(json.dumps(doc, indent=2) + "\n")
        run_id = log_engine_check(target.pair, target.version, out_dir / ENGINE_REPORT_FILE, doc,
                                  source=engine_checks.source_of(report.engine), night=night.date.isoformat(),
                                  registry=night.registry)
        history.mark_mlflow_logged(night.db, history_run_id, run_id)
    except Exception as e:  # noqa: BLE001 (MLflow, its HTTP client, the disk: none may stop the night's other rows)
        log.error("%s@%s v%s engine check: MLflow logging failed (%s: %s); history run %s kept", target.pair,
                  target.alias, target.version, type(e).__name__, e, history_run_id)
        return None
    return run_id


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
