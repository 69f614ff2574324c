"""Alert channels: render a message for Slack or a generic JSON webhook, POST it with retries.

Delivery uses httpx with tenacity: connection errors, timeouts, HTTP 5xx and 429 are retried with
exponential backoff (``DeliverySettings``); other 4xx fail at once. Every request carries an
``Idempotency-Key`` header (the outbox key), so a receiver can drop a duplicate after a crash
between "sent" and "marked delivered".

Webhook URLs are secrets: they appear nowhere in logs, results or exception text; only the
channel id and ``scheme://host/…`` do.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import httpx
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from monitoring.redact import install_log_redaction, redact_text
from monitoring.settings import ChannelConfig, DeliverySettings

log = logging.getLogger(__name__)
install_log_redaction()

EMOJI = {"fire": ":rotating_light:", "remind": ":warning:", "resolve": ":white_check_mark:", "test": ":test_tube:"}


class _TransientHTTP(Exception):
    def __init__(self, status: int) -> None:
        self.status = status
        super().__init__(f"HTTP {status}")


class _PermanentHTTP(Exception):
    def __init__(self, status: int) -> None:
        self.status = status
        super().__init__(f"HTTP {status}")


@dataclass
class SendResult:
    """Outcome of one delivery attempt series.

    Attributes:
        ok: the receiver answered 2xx. status_code: last HTTP status (``None`` if no answer).
        attempts: HTTP requests made. error: redacted error description (never the URL).
    """

    ok: bool
    status_code: int | None
    attempts: int
    error: str | None = None


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, (_TransientHTTP, httpx.TransportError))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, (_TransientHTTP, _PermanentHTTP)):
        return str(exc)
    # transport errors: class name plus the (redacted) reason, never the request URL
    return redact_text(f"{type(exc).__name__}: {exc}")[:500]


def render_slack(payload: dict[str, Any]) -> dict[str, Any]:
    """Slack incoming-webhook body: ``text`` (fallback/notification) plus Block Kit ``blocks``."""
    event = payload.get("event", "fire")
    title = f"{EMOJI.get(event.split('-')[0], '')} {payload.get('title', 'specdec alert')}".strip()
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": title[:150], "emoji": True}},
    ]
    fields = [f"*{k}*\n{v}" for k, v in (payload.get("facts") or {}).items() if v not in (None, "")]
    if fields:
        blocks.append({"type": "section",
                       "fields": [{"type": "mrkdwn", "text": f[:2000]} for f in fields[:10]]})
    for line in payload.get("lines") or []:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": line[:3000]}})
    links = payload.get("links") or {}
    if links:
        parts = [f"<{u}|{name}>" if str(u).startswith(("http://", "https://")) else f"{name}: `{u}`"
                 for name, u in links.items() if u]
        if parts:
            blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": " | ".join(parts)[:3000]}]})
    return {"text": payload.get("text") or title, "blocks": blocks[:50]}


def render_webhook(payload: dict[str, Any], idempotency_key: str) -> dict[str, Any]:
    """Generic JSON webhook body: the channel-neutral payload plus its idempotency key."""
    return {**payload, "idempotency_key": idempotency_key}


def send(
    channel: ChannelConfig, payload: dict[str, Any], idempotency_key: str, settings: DeliverySettings,
    *, client: httpx.Client | None = None,
) -> SendResult:
    """POST ``payload`` to ``channel`` with retries; never raises for delivery failures.

    Args:
        channel: where to send (type decides the body: Slack text+blocks or generic JSON).
        payload: the channel-neutral message (see :func:`monitoring.alerts.build_message`).
        idempotency_key: sent as the ``Idempotency-Key`` header (and in the generic JSON body).
        settings: timeout, attempts and backoff.
        client: an ``httpx.Client`` to reuse (one is created and closed otherwise).
    Returns:
        :class:`SendResult`; ``error`` is redacted (no URL).
    """
    body = render_slack(payload) if channel.type == "slack" else render_webhook(payload, idempotency_key)
    headers = {"Idempotency-Key": idempotency_key, "User-Agent": "specdec-monitoring"}
    own = client is None
    client = client or httpx.Client(timeout=settings.timeout_s)
    attempts = 0
    status: int | None = None
    retrying = Retrying(
        stop=stop_after_attempt(settings.max_attempts),
        wait=wait_exponential(multiplier=settings.backoff_initial_s, max=settings.backoff_max_s),
        retry=retry_if_exception(_transient),
        reraise=True,
    )
    try:
        for attempt in retrying:
            with attempt:
                attempts += 1
                status = None
                resp = client.post(channel.url.get_secret_value(), json=body, headers=headers,
                                   timeout=settings.timeout_s)
                status = resp.status_code
                if status >= 500 or status == 429:
                    log.warning("alert to %s: HTTP %d (attempt %d/%d)", channel.display, status,
                                attempts, settings.max_attempts)
                    raise _TransientHTTP(status)
                if status >= 400:
                    raise _PermanentHTTP(status)
        return SendResult(True, status, attempts)
    except (_TransientHTTP, _PermanentHTTP, httpx.HTTPError) as exc:
        err = _describe(exc)
        log.warning("alert to %s failed after %d attempt(s): %s", channel.display, attempts, err)
        return SendResult(False, status, attempts, err)
    finally:
        if own:
            client.close()
