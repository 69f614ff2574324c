"""What one validation task of the nightly asks :func:`specdec.validation.validate`: the pair version's models
from the worker's cache, tonight's parameters, where the continuations come from, and its progress callback
(shared by the one-process validation, :func:`flows.nightly.run_validation`, and the shards,
:mod:`flows.sharding`)."""

from __future__ import annotations

from specdec import stopping
from flows.loading import build_validation_config, cached_drafter, cached_target, load_pair_models
from flows.tasks import run_logger
from specdec import events


def worth_retrying(task, task_run, state) -> bool:
    """A broken model (non-finite logits, :class:`specdec.core.finite.BrokenModel`) fails the same way
    again, and an engine that failed a request (:class:`specdec.engines.client.EngineRequestError`) is the
    serving team's to restart: not retried (the continuations it gave stay cached for the next night).
    Anything else (a worker lost its cache, a transient I/O error) is."""
    from specdec.core.finite import BrokenModel
    from specdec.engines.client import EngineRequestError

    try:
        state.result()
    except (BrokenModel, EngineRequestError):
        return False
    except Exception:  # noqa: BLE001 (any other failure is retried once)
        return True
    return True


def validation_progress(pv):
    """The progress callback of a validation of ``pv``: a log line, a step event, the stop check."""
    log = run_logger("flows.nightly")
    pair, version = pv.name, pv.version

    def progress(p) -> None:
        if p.rows:  # a decoded prompt
            row = p.rows[0]
            acc = f"acceptance {row.acceptance_rate:.2f}" if row.status == "ok" else f"skipped: {row.skip_reason}"
            log.info("%s v%s: prompt %d/%d (%s) %s", pair, version, p.done, p.total, row.category, acc)
        else:
            log.info("%s v%s: %s %d/%d", pair, version, p.phase, p.done, p.total)
        events.announce("validation", pair=pair, version=str(version), done=p.done, total=p.total)
        stopping.check()

    return progress


def validation_request(pv, params, progress=None, **extra):
    """The :class:`specdec.validation.ValidationRequest` of pair version ``pv`` with tonight's ``params``
    (:class:`flows.nightly.ValidationParams`): its models from this worker's cache; with
    ``params.continuations == "engine"`` the continuations come from the engine the pair version names (tag
    ``engine_url``; the target served, :func:`load_pair_models`); replay's continuations go to the cache of the
    flow run's home (:func:`flows.settings.for_this_run`, a worker's own). ``extra``: further request fields.

    Raises:
        ValueError: engine continuations for a pair version that names no engine; as :func:`load_pair_models`.
        specdec.engines.client.EngineRequestError: the engine is unreachable.
    """
    from flows.settings import for_this_run
    from specdec.validation import ValidationRequest
    from specdec.validation.continuation_cache import ContinuationCache
    from specdec.validation.heldout import load_heldout

    engine = None
    if params.continuations == "engine":
        from flows.engine_check import engine_continuations_for

        engine = engine_continuations_for(pv)
        extra.setdefault("target_weights", pv.target_weights_sha256)
    extra.setdefault("cache", ContinuationCache.in_home(for_this_run().core.home))
    tkey, dkey = load_pair_models(pv, device=params.device, dtype=params.dtype, served=engine is not None)
    config = build_validation_config(pv.config, limit=params.limit, seed=params.seed, batch_size=params.batch_size)
    return ValidationRequest(cached_target(tkey), [cached_drafter(dkey)], load_heldout(params.heldout), config,
                             method=params.method, decode_fraction=params.decode_fraction, target_ref=pv.target_uri,
                             progress=progress, engine=engine, **extra)


def validate_and_write(request, out_dir: str):
    """:func:`specdec.validation.validate` of a one-drafter ``request`` (its engine closed after), the report
    written to ``out_dir`` and returned."""
    from specdec.validation import validate

    try:
        [report] = validate(request)
    finally:
        if request.engine is not None:
            request.engine.close()
    report.write(out_dir)
    return report
