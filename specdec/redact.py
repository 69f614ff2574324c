"""Secrets out of messages: a webhook URL shown as its scheme and host only.

Used where settings refuse a bad alert channel URL (:mod:`specdec.settings.monitoring`) and by
:mod:`monitoring.redact`, which also masks database URLs and filters log records.
"""

from __future__ import annotations

from urllib.parse import urlsplit


def redact_url(url: str) -> str:
    """``https://hooks.slack.com/services/T0/B0/xyz`` -> ``https://hooks.slack.com/…``.

    Only scheme and host (and port) survive; user info, path, query and fragment are dropped.
    Anything unparsable becomes ``"<redacted>"``.
    """
    try:
        parts = urlsplit(str(url))
        host = parts.hostname or ""
        if parts.port:
            host = f"{host}:{parts.port}"
    except ValueError:
        return "<redacted>"
    if not parts.scheme or not host:
        return "<redacted>"
    return f"{parts.scheme}://{host}/…"
