"""``specdec pair watch``: react to the MLflow registry in minutes (the nightly stays the safety net).

A small Starlette app served by uvicorn (both ship with MLflow and Prefect) receives MLflow's registry
webhooks (:mod:`registry.webhooks`) and, for a watched pair, starts the validation of exactly the
version an event names through the Prefect deployment of the nightly flow (``run_deployment``, from a
worker thread: the request is answered before anything slow happens):

============================================  ===============================================
event                                         effect
============================================  ===============================================
``model_version.created``                     validate that version now
``model_version_alias.created`` challenger    validate that version now (once per version)
``model_version_alias.created`` champion      validate the champion now; unless it passes the gate,
                                              the flow raises the "Ungated promotion" alert (and with
                                              ``--revert`` moves @champion back to the last version
                                              that passed)
``model_version_tag.set`` ``specdec.validate``  validate that version now (a request from the UI)
anything else                                 recorded, nothing done
============================================  ===============================================

Every delivery is verified first (HMAC-SHA256 signature, timestamp within ``window_s``): a bad one
gets 401 and one log line. Accepted deliveries go to the history store's ``webhook_deliveries``
table (:mod:`monitoring.deliveries`): a duplicate delivery id, or a second event about a version
already triggered, changes nothing. The webhook secret is read from the environment and never logged.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from typing import Callable, Sequence

log = logging.getLogger("flows.watch")

#: the deployment the watcher starts (``<flow name>/<deployment name>``, prefect.yaml)
DEFAULT_DEPLOYMENT = "nightly-validation/nightly-validation"
VALIDATED_ALIAS, GATED_ALIAS = "challenger", "champion"


@dataclass(frozen=True)
class WatchJob:
    """One validation to start: ``action`` is ``validate`` (exactly ``version``) or ``gate-champion``."""

    pair: str
    version: str
    action: str
    row_id: int | None = None
    delivery_id: str = ""


def decide(ev, pairs: Sequence[str]) -> tuple[str, str | None]:
    """What a verified :class:`registry.webhooks.RegistryEvent` asks for.

    Returns:
        ``(action, trigger_key)``: action ``validate`` (key unique per pair version) /
        ``gate-champion`` (key unique per alias move: version and the event's own timestamp), or
        ``ignored: <why>`` with None.
    """
    from registry.webhooks import VALIDATE_REQUEST_TAG

    if ev.name not in pairs:
        return f"ignored: {ev.name} is not watched", None
    if not ev.version:
        return f"ignored: {ev.event} names no version", None
    if ev.event == "model_version.created":
        return "validate", f"validate:{ev.name}:{ev.version}"
    if ev.event == "model_version_alias.created" and ev.alias == VALIDATED_ALIAS:
        return "validate", f"validate:{ev.name}:{ev.version}"
    if ev.event == "model_version_alias.created" and ev.alias == GATED_ALIAS:
        return "gate-champion", f"gate-champion:{ev.name}:{ev.version}:{ev.sent_at}"  # once per move
    if ev.event == "model_version_tag.set" and ev.key == VALIDATE_REQUEST_TAG:
        return "validate", f"request:{ev.name}:{ev.version}:{(ev.value or '')[:100]}"
    return f"ignored: {ev.event}" + (f" @{ev.alias}" if ev.alias else f" {ev.key}" if ev.key else ""), None


class Watcher:
    """Verifies, records and queues deliveries; a worker thread starts the validations.

    Args:
        pairs: pair registered models to act on. secret: the webhook secret (kept in memory only).
        db: :class:`monitoring.db.Database` (the history store). start: ``WatchJob -> flow run id``
            (:func:`deployment_starter`), called from the worker thread. window_s: timestamp window.
    """

    def __init__(self, pairs: Sequence[str], secret: str, db, start: Callable[[WatchJob], str | None],
                 window_s: int = 300) -> None:
        self.pairs, self._secret, self.db, self.start, self.window_s = list(pairs), secret, db, start, window_s
        self.jobs: "queue.Queue[WatchJob | None]" = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="specdec-watch-worker", daemon=True)

    def __repr__(self) -> str:  # never the secret
        return f"Watcher(pairs={self.pairs!r})"

    def handle(self, headers, body: bytes) -> tuple[int, dict]:
        """One POST: ``(status, json body)``. 401 for a delivery that fails verification."""
        from monitoring.deliveries import record_delivery
        from registry.webhooks import DeliveryRefused, verify_delivery

        try:
            ev = verify_delivery(headers, body, self._secret, window_s=self.window_s)
        except DeliveryRefused as e:
            log.warning("webhook delivery refused (401): %s", e.reason)
            return 401, {"error": "unauthorized"}
        action, key = decide(ev, self.pairs)
        rec = record_delivery(self.db, ev.delivery_id, event=ev.event, model_name=ev.name, version=ev.version,
                              action=action, trigger_key=key)
        if rec.outcome != "new" or key is None:
            log.info("delivery %s (%s %s v%s): %s", ev.delivery_id, ev.event, ev.name, ev.version,
                     action if rec.outcome == "new" else rec.outcome)
            return 200, {"outcome": rec.outcome if rec.outcome != "new" else "ignored", "action": action}
        self.jobs.put(WatchJob(ev.name, ev.version, action, rec.row_id, ev.delivery_id))
        log.info("delivery %s: %s %s v%s queued", ev.delivery_id, action, ev.name, ev.version)
        return 202, {"outcome": "queued", "action": action}

    def _work(self) -> None:
        from monitoring.deliveries import release_trigger, set_flow_run

        while (job := self.jobs.get()) is not None:
            try:
                run_id = self.start(job)
            except Exception as e:  # noqa: BLE001 (one failed start must not stop the watcher)
                log.error("%s %s v%s: could not start the validation: %s: %s", job.action, job.pair, job.version,
                          type(e).__name__, e)
                if job.row_id is not None:
                    release_trigger(self.db, job.row_id, f"{type(e).__name__}: {e}")
                continue
            if run_id and job.row_id is not None:
                set_flow_run(self.db, job.row_id, run_id)

    def __enter__(self) -> "Watcher":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.jobs.put(None)
        self._thread.join(timeout=30)


def make_app(watcher: Watcher):
    """The receiver: ``POST /webhook`` (MLflow deliveries), ``GET /health``."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def webhook(request: Request) -> JSONResponse:
        body = await request.body()
        status, doc = await run_in_threadpool(watcher.handle, dict(request.headers), body)
        return JSONResponse(doc, status_code=status)

    async def health(_request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "pairs": watcher.pairs})

    return Starlette(routes=[Route("/webhook", webhook, methods=["POST"]), Route("/health", health, methods=["GET"])])


def deployment_starter(deployment: str = DEFAULT_DEPLOYMENT, *, registry, db, settings, gate, revert: bool = False,
                       limit: int | None = None) -> Callable[[WatchJob], str | None]:
    """``WatchJob -> flow run id``: a run of the nightly deployment for exactly that version.

    ``validate`` passes ``versions=[v]`` and no aliases; ``gate-champion`` passes ``aliases=["champion"]``
    (and ``revert_ungated``) after checking that @champion still points at the version (an
    out-of-order delivery about an older move starts nothing). ``limit`` (``pair watch --limit``) overrides
    the deployment's subset size; its other parameters (held-out set, device) stay as deployed.
    ``registry`` / ``db`` / ``settings`` / ``gate``: the watcher's MLflow service, history store, monitoring section
    and :class:`registry.gate.GateConfig`.
    """

    def start(job: WatchJob) -> str | None:
        from prefect.deployments import run_deployment

        from registry import resolve_alias

        if job.action == "gate-champion":
            now = resolve_alias(job.pair, GATED_ALIAS, registry=registry)
            if now != job.version:
                log.info("%s@%s is v%s now, not v%s: that move has its own delivery", job.pair, GATED_ALIAS, now, job.version)
                return None
            if not _ungated(job.pair, registry, db, settings, gate):
                return None
            params = {"pairs": [job.pair], "aliases": [GATED_ALIAS], "versions": [], "revert_ungated": revert}
        else:
            params = {"pairs": [job.pair], "aliases": [], "versions": [job.version]}
        if limit is not None:
            params["limit"] = limit
        fr = run_deployment(deployment, parameters=params, timeout=0,
                            flow_run_name=f"watch {job.action} {job.pair} v{job.version}",
                            tags=["specdec", "watch"])
        log.info("%s %s v%s: flow run %s (%s) started", job.action, job.pair, job.version, fr.name, fr.id)
        return str(fr.id)

    return start


def _ungated(pair: str, registry, db, settings, gate) -> bool:
    """Is ``pair@champion`` ungated now? If not (moved by specdec, or to a version whose latest
    validation passes the gate), an open ungated-promotion incident is resolved here and nothing runs."""
    from flows.ungated import check_ungated, report_ungated

    check = check_ungated(pair, [GATED_ALIAS], registry, gate)
    if check["finding"] is not None or not check["checked"]:
        return True
    log.info("%s@%s is gated (moved by specdec or passes the gate): nothing to validate", pair, GATED_ALIAS)
    report_ungated(db, {pair: check}, [], registry=registry, settings=settings, gate=gate)
    return False


def check_deployment(deployment: str, api_url: str | None) -> None:
    """Raise ``ValueError`` (one line) when the Prefect API (``api_url``, ``PREFECT_API_URL``) or the
    deployment is missing."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    if not api_url:
        raise ValueError("PREFECT_API_URL is not set: the watcher starts validations on a Prefect server "
                         "(`prefect server start`, then deploy prefect.yaml)")
    with get_client(sync_client=True) as c:
        try:
            c.read_deployment_by_name(deployment)
        except ObjectNotFound:
            raise ValueError(f"Prefect deployment {deployment!r} not found (deploy prefect.yaml: `prefect deploy --all`)") from None
        except Exception as e:  # noqa: BLE001 (unreachable server: one line)
            raise ValueError(f"Prefect API at {api_url} is unreachable: {type(e).__name__}") from None


def serve(pairs: Sequence[str], secret: str, *, host: str, port: int, db, registry, settings, gate,
          deployment: str = DEFAULT_DEPLOYMENT, revert: bool = False, window_s: int = 300,
          limit: int | None = None) -> None:
    """Run the receiver until interrupted (blocks). ``registry``: the watcher's MLflow service;
    ``settings``: its monitoring section; ``gate``: its :class:`registry.gate.GateConfig`; ``limit``: see
    :func:`deployment_starter`."""
    import uvicorn

    starter = deployment_starter(deployment, registry=registry, db=db, settings=settings, gate=gate, revert=revert,
                                 limit=limit)
    with Watcher(pairs, secret, db, starter, window_s=window_s) as w:
        uvicorn.Server(uvicorn.Config(make_app(w), host=host, port=port, log_level="warning",
                                      access_log=False)).run()
