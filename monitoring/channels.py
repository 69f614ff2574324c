"""Alert channels: render a message for Slack or a generic JSON webhook, POST it with retries.

Delivery uses httpx with tenacity. Within one call, failures where the request certainly did not
reach the receiver (connection refused or timed out while connecting) and answers saying it was
not accepted (HTTP 5xx, 429) are retried with exponential backoff (``DeliverySettings``); a 429's
``Retry-After`` is waited for when it is at most ``backoff_max_s``, else the call gives up and the
outbox retries on the next run. Only 2xx is a delivery. A redirect is followed only when it keeps
the POST (307/308, RFC 9110 section 15.4) and its target is https, at most ``MAX_REDIRECTS`` hops;
any other redirect (301/302/303 would turn the POST into a GET and drop the body; a target that is
plain http) is a permanent failure naming the status and the redacted target. A 4xx other than
408/425/429 is permanent (``SendResult.permanent``): the outbox marks the row ``failed`` once
instead of re-sending it every run. A request that was sent but got no answer
(read/write timeout, connection dropped) *may have been delivered*: it is never retried within
the call (``SendResult.maybe_delivered``); the outbox allows one more attempt on a later run, so a
receiver sees at most one duplicate per message. Every request carries an ``Idempotency-Key``
header (the outbox key), so a receiver can drop that duplicate.

Webhook URLs are secrets: they appear nowhere in logs, results or exception text; only the
channel id and ``scheme://host/…`` do.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import httpx
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from monitoring.redact import install_log_redaction, redact_text, redact_url
from monitoring.settings import ChannelConfig, DeliverySettings

log = logging.getLogger(__name__)
install_log_redaction()

EMOJI = {"fire": ":rotating_light:", "remind": ":warning:", "resolve": ":white_check_mark:", "test": ":test_tube:"}


class _TransientHTTP(Exception):
    def __init__(self, status: int, retry_after: float | None = None) -> None:
        self.status, self.retry_after = status, retry_after
        super().__init__(f"HTTP {status}" + (f" (Retry-After {retry_after:.0f} s)" if retry_after is not None else ""))


class _RetryAfterTooLong(Exception):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        super().__init__(f"HTTP 429 with Retry-After {seconds:.0f} s: left for the next run")


class _PermanentHTTP(Exception):
    def __init__(self, status: int, detail: str = "") -> None:
        self.status = status
        super().__init__(f"HTTP {status}" + (f" {detail}" if detail else "") + " (permanent: not retried)")


MAX_REDIRECTS = 3
_FOLLOW = (307, 308)  # the redirects that keep method and body
_TRANSIENT_4XX = (408, 425, 429)


def _redirect_target(resp: httpx.Response) -> str | None:
    """The absolute target of a 3xx answer (``Location`` resolved against the request URL)."""
    loc = resp.headers.get("Location")
    if not loc:
        return None
    try:
        return str(resp.request.url.join(loc))
    except Exception:  # noqa: BLE001 (a malformed Location is reported, not followed)
        return None


def _follows(status: int, target: str | None, hops: int) -> bool:
    return status in _FOLLOW and target is not None and target.startswith("https://") and hops < MAX_REDIRECTS


def _redirect_error(status: int, target: str | None, hops: int) -> _PermanentHTTP:
    where = f"to {redact_url(target)}" if target else "without a usable Location"
    why = ("too many redirects" if hops >= MAX_REDIRECTS and status in _FOLLOW else
           "not followed: only a 307/308 to an https URL keeps the POST"
           if status in _FOLLOW or status in (301, 302, 303) else "not followed")
    return _PermanentHTTP(status, f"redirect {where} ({why}); update the channel URL")


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
    maybe_delivered: bool = False
    permanent: bool = False


MAYBE_DELIVERED = "may have been delivered"
# the request never left: safe to repeat at once
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, (_TransientHTTP, *_NOT_SENT))


def _ambiguous(exc: BaseException) -> bool:
    """Sent, but no answer: the receiver may have it (read/write timeout, dropped connection)."""
    return isinstance(exc, httpx.TransportError) and not isinstance(exc, _NOT_SENT)


def retry_after_s(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date); ``None`` if absent or
    unparseable; never negative."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        import email.utils
        import time as _time

        when = email.utils.parsedate_to_datetime(value)
        return max(when.timestamp() - _time.time(), 0.0)
    except (TypeError, ValueError, OverflowError):
        return None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, (_TransientHTTP, _PermanentHTTP, _RetryAfterTooLong)):
        return str(exc)
    # transport errors: class name plus the (redacted) reason, never the request URL
    return redact_text(f"{type(exc).__name__}: {exc}")[:500]


# visible ASCII but "%": kept as is in a header value; anything else is percent-encoded (UTF-8)
_HEADER_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")


def header_value(text: str) -> str:
    """``text`` as an HTTP header value: unchanged when it is visible ASCII without ``%``, else
    percent-encoded UTF-8 (RFC 3986 style). The outbox key holds the channel's name, which may be
    any Unicode (a non-ASCII name made httpx raise ``UnicodeEncodeError``, and the
    row stayed pending for ever); the JSON body's ``idempotency_key`` keeps the key as it is."""
    from urllib.parse import quote

    return quote(text, safe=_HEADER_SAFE)


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
        :class:`SendResult`; ``error`` is redacted (no URL). ``maybe_delivered`` is True when the
        last request was sent but not answered (see the module docstring). Any exception (a bug in
        rendering included) becomes a failed result: the caller's outbox row stays retryable.
    """
    attempts = 0
    status: int | None = None
    own = client is None
    try:
        body = render_slack(payload) if channel.type == "slack" else render_webhook(payload, idempotency_key)
        headers = {"Idempotency-Key": header_value(idempotency_key), "User-Agent": "specdec-monitoring"}
        client = client or httpx.Client(timeout=settings.timeout_s)
        backoff = wait_exponential(multiplier=settings.backoff_initial_s, max=settings.backoff_max_s)

        def wait(state) -> float:  # a 429's Retry-After wins over the exponential backoff
            exc = state.outcome.exception()
            if isinstance(exc, _TransientHTTP) and exc.retry_after is not None:
                return exc.retry_after
            return backoff(state)

        retrying = Retrying(stop=stop_after_attempt(settings.max_attempts), wait=wait,
                            retry=retry_if_exception(_transient), reraise=True)
        for attempt in retrying:
            with attempt:
                attempts += 1
                status = None
                url, hops = channel.url.get_secret_value(), 0
                while True:
                    resp = client.post(url, json=body, headers=headers, timeout=settings.timeout_s,
                                       follow_redirects=False)
                    status = resp.status_code
                    if not 300 <= status < 400:
                        break
                    target = _redirect_target(resp)
                    if not _follows(status, target, hops):
                        raise _redirect_error(status, target, hops)
                    log.info("alert to %s: HTTP %d, following to %s", channel.display, status, redact_url(target))
                    url, hops = target, hops + 1
                if status >= 500 or status in _TRANSIENT_4XX:
                    log.warning("alert to %s: HTTP %d (attempt %d/%d)", channel.display, status,
                                attempts, settings.max_attempts)
                    after = retry_after_s(resp.headers.get("Retry-After")) if status == 429 else None
                    if after is not None and after > settings.backoff_max_s:
                        raise _RetryAfterTooLong(after)
                    raise _TransientHTTP(status, after)
                if not 200 <= status < 300:
                    raise _PermanentHTTP(status)
        return SendResult(True, status, attempts)
    except Exception as exc:  # noqa: BLE001 (never raises: the outbox row must stay retryable)
        maybe = _ambiguous(exc)
        err = _describe(exc)
        if maybe:
            err = f"{err} ({MAYBE_DELIVERED}: sent, no answer; not repeated in this run)"
        elif not isinstance(exc, (_TransientHTTP, _PermanentHTTP, _RetryAfterTooLong, httpx.HTTPError)):
            log.error("alert to %s: unexpected %s at send time", channel.display, type(exc).__name__,
                      exc_info=True)
        log.warning("alert to %s failed after %d attempt(s): %s", channel.display, attempts, err)
        return SendResult(False, status, attempts, err, maybe_delivered=maybe,
                          permanent=isinstance(exc, _PermanentHTTP))
    finally:
        if own and client is not None:
            client.close()
