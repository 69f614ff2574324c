"""Keep secrets (webhook URLs, DB passwords) out of logs, reprs and error messages."""

from __future__ import annotations

import logging
import re

from specdec.redact import MaskUserinfoFilter, MaskUserinfoFormatter, mask_userinfo, redact_url  # noqa: F401 (re-exported)

# "…" ends a match so already-redacted text ("https://host/…)") keeps what follows it
_URL_RE = re.compile(r"https?://[^\s'\"<>…]+…?")


def redact_text(text: str) -> str:
    """Replace every http(s) URL inside ``text`` with :func:`redact_url` of it (scheme and host), and
    mask the user info of a URL of any other scheme."""
    return mask_userinfo(_URL_RE.sub(lambda m: redact_url(m.group(0)), str(text)))


def redact_db_url(url: str) -> str:
    """A SQLAlchemy URL with its password masked (``***``)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError, TypeError):  # unparsable: show nothing of it
        return "<redacted>"


class RedactUrlsFilter(logging.Filter):
    """A logging filter that rewrites http(s) URLs in a record to scheme + host.

    Installed on the ``httpx`` and ``httpcore`` loggers by :func:`install_log_redaction`, because
    httpx logs every request URL at INFO level (``HTTP Request: POST https://...``).
    """

    def filter(self, record: logging.LogRecord) -> bool:  # noqa: A003 (logging API name)
        try:
            msg = record.getMessage()
        except (TypeError, ValueError, KeyError):  # msg % args failed (malformed record): leave it to logging
            return True
        red = redact_text(msg)
        if red != msg:
            record.msg, record.args = red, None
        return True


_INSTALLED = False
# filters on a logger do not apply to its children's records, so every logger is listed
_LOGGERS = (
    "httpx", "httpcore", "httpcore.connection", "httpcore.http11", "httpcore.http2",
    "httpcore.proxy", "httpcore.socks", "monitoring.alerts", "monitoring.channels", "monitoring.cli",
)


def install_log_redaction() -> None:
    """Attach :class:`RedactUrlsFilter` to the httpx/httpcore and alert loggers (idempotent)."""
    global _INSTALLED
    if _INSTALLED:
        return
    for name in _LOGGERS:
        logging.getLogger(name).addFilter(RedactUrlsFilter())
    _INSTALLED = True
