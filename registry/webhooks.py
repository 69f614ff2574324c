"""MLflow registry webhooks: subscribe a receiver to a pair's events, verify and parse a delivery.

MLflow 3.3+ (``mlflow/webhooks/delivery.py``) POSTs ``{"entity", "action", "timestamp", "data"}`` with
the headers ``X-MLflow-Delivery-Id`` (a UUID), ``X-MLflow-Timestamp`` (Unix seconds) and, when the
webhook has a secret, ``X-MLflow-Signature: v1,<base64 HMAC-SHA256(secret, "<id>.<timestamp>.<body>")>``.
It retries on 429/5xx. Webhooks are server-wide (no per-model filter), so :func:`parse_event` keeps
the model name and the receiver ignores models it does not watch.

By default MLflow delivers only to ``https`` URLs on public addresses; a receiver on 127.0.0.1 or a
compose network needs the *server* started with ``MLFLOW_WEBHOOK_ALLOWED_SCHEMES=http,https`` and
``MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS=true`` (``mlflow/webhooks/ssrf.py``).

The secret never leaves this module's callers except into MLflow's webhook record (MLflow stores it
to sign deliveries; it is not readable back through the API) and is never logged.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from dataclasses import dataclass
from typing import Mapping

from registry.errors import RegistryError
from registry.service import Registry, mlflow_errors
from specdec.redact import redact_url

#: the registry events the watcher subscribes to
WATCH_EVENTS = ("model_version.created", "model_version_alias.created", "model_version_alias.deleted",
                "model_version_tag.set")
#: a delivery older (or newer) than this many seconds is refused as a replay
DEFAULT_WINDOW_S = 300
#: setting this version tag (any value) in the MLflow UI asks the watcher to validate that version now
VALIDATE_REQUEST_TAG = "specdec.validate"
SIGNATURE_HEADER = "X-MLflow-Signature"
TIMESTAMP_HEADER = "X-MLflow-Timestamp"
DELIVERY_ID_HEADER = "X-MLflow-Delivery-Id"


class DeliveryRefused(RegistryError):
    """A webhook delivery failed verification (bad or missing signature, stale timestamp, bad body).

    ``reason`` is safe to log: it never contains the secret or the signature."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


@dataclass(frozen=True)
class RegistryEvent:
    """One verified registry event.

    Attributes:
        delivery_id: MLflow's delivery UUID (the same on MLflow's retries of one delivery).
        timestamp: the signed Unix time (seconds). event: ``"<entity>.<action>"``.
        name: registered model. version: the model version (None for ``alias.deleted``).
        alias: for alias events. key / value: for tag events.
        sent_at: the body's ``timestamp`` (ISO-8601), the same on every copy of one event.
    """

    delivery_id: str
    timestamp: int
    event: str
    name: str
    version: str | None = None
    alias: str | None = None
    key: str | None = None
    value: str | None = None
    sent_at: str = ""


def sign(secret: str, delivery_id: str, timestamp: str, body: str) -> str:
    """MLflow's signature of a delivery: ``v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">``."""
    mac = hmac.new(secret.encode(), f"{delivery_id}.{timestamp}.{body}".encode(), hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def _header(headers: Mapping[str, str], name: str) -> str:
    low = name.lower()
    for k, v in headers.items():
        if k.lower() == low:
            return v
    return ""


def verify_delivery(headers: Mapping[str, str], body: bytes, secret: str, *, now: float | None = None,
                    window_s: int = DEFAULT_WINDOW_S) -> RegistryEvent:
    """Check a delivery's signature and timestamp, then parse it.

    Args:
        headers: the request headers (any case). body: the raw request body (bytes, as signed).
        secret: the webhook secret. now: injected clock (Unix seconds). window_s: accepted clock skew.
    Returns:
        :class:`RegistryEvent`.
    Raises:
        DeliveryRefused: missing headers, a signature that does not match (compared in constant
        time), a timestamp outside ``now ± window_s``, or a body that is not an MLflow event.
    """
    delivery_id, ts, sig = (_header(headers, h) for h in (DELIVERY_ID_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER))
    if not (delivery_id and ts and sig):
        raise DeliveryRefused("missing delivery id, timestamp or signature header")
    try:
        text = body.decode("utf-8")
        stamp = int(ts)
    except (UnicodeDecodeError, ValueError):
        raise DeliveryRefused("timestamp is not an integer or body is not UTF-8") from None
    if not hmac.compare_digest(sign(secret, delivery_id, ts, text).encode(), sig.strip().encode()):
        raise DeliveryRefused(f"signature does not match (delivery {delivery_id[:64]})")
    skew = (time.time() if now is None else now) - stamp
    if abs(skew) > window_s:
        raise DeliveryRefused(f"timestamp {stamp} is {skew:+.0f} s from now (window {window_s} s): replay refused")
    return parse_event(delivery_id, stamp, text)


def parse_event(delivery_id: str, timestamp: int, body: str) -> RegistryEvent:
    """The :class:`RegistryEvent` of an MLflow webhook body (``{entity, action, timestamp, data}``).

    Raises:
        DeliveryRefused: not JSON, or no ``entity`` / ``action`` / ``data.name``.
    """
    try:
        doc = json.loads(body)
        data = doc["data"]
        event, name = f"{doc['entity']}.{doc['action']}", str(data["name"])
    except (ValueError, KeyError, TypeError):
        raise DeliveryRefused("body is not an MLflow webhook event") from None
    opt = {k: (None if data.get(k) is None else str(data[k])) for k in ("version", "alias", "key", "value")}
    return RegistryEvent(delivery_id=delivery_id, timestamp=timestamp, event=event, name=name,
                         sent_at=str(doc.get("timestamp") or "")[:64], **opt)


def webhook_name(pairs: list[str]) -> str:
    """The name of the watcher's webhook for these pairs (one webhook per watcher)."""
    return ("specdec-watch-" + "-".join(sorted(pairs)))[:255]


def subscribe(pairs: list[str], url: str, secret: str, *, registry: Registry, replace: bool = False) -> str:
    """Create (or update in place) the webhook that sends :data:`WATCH_EVENTS` to ``url``.

    A webhook for the same pairs that sends elsewhere belongs to another watcher: it is only taken
    over with ``replace=True`` (before, a second ``pair watch`` silently rewrote it and the first
    watcher received nothing). The same URL (a restarted watcher) is updated in place.

    Args:
        pairs: the pair registered models the receiver acts on (they need not exist yet: a watcher
            may start before the first registration).
        url: the receiver's URL as the MLflow *server* reaches it. secret: HMAC secret (not logged).
    Returns:
        the webhook id.
    Raises:
        RegistryError: MLflow refused the URL (e.g. http or a private address without the server
        switches; the message says which); another watcher's webhook exists and ``replace`` is False.
        RegistryUnavailable.
    """
    from mlflow.exceptions import MlflowException

    if not secret:
        raise RegistryError("a webhook secret is required (SPECDEC_WATCH_SECRET)")
    client = registry.client
    name = webhook_name(pairs)
    with mlflow_errors(client.tracking_uri):
        try:
            existing = [w for w in _all_webhooks(client) if w.name == name]
            if existing and existing[0].url != url and not replace:
                raise RegistryError(
                    f"a webhook for {', '.join(pairs)} already sends to {redact_url(existing[0].url)} (another "
                    f"pair watch, webhook {existing[0].webhook_id}); stop that watcher, or pass --replace to take "
                    "its events over")
            if existing:
                hook = client.update_webhook(existing[0].webhook_id, url=url, events=list(WATCH_EVENTS),
                                             secret=secret, status="ACTIVE")
            else:
                hook = client.create_webhook(name, url, list(WATCH_EVENTS), secret=secret,
                                             description=f"specdec pair watch: {', '.join(pairs)}")
        except MlflowException as e:
            raise RegistryError(f"MLflow refused the webhook for {url}: {e.message.splitlines()[0]} "
                                "(an http or private-address receiver needs the MLflow server started with "
                                "MLFLOW_WEBHOOK_ALLOWED_SCHEMES=http,https and MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS=true)") from None
    return hook.webhook_id


def _all_webhooks(client) -> list:
    out, token = [], None
    while True:
        page = client.list_webhooks(max_results=100, page_token=token)
        out.extend(page)
        token = page.token
        if not token:
            return out
