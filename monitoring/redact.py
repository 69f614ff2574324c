"""Keep secrets (webhook URLs, DB passwords) out of logs, reprs and error messages."""

from __future__ import annotations

import logging
import re

from specdec.redact import redact_url

# "…" ends a match so already-redacted text ("https://host/…)") keeps what follows it
_URL_RE = re.compile(r"https?://[^\s'\"<>…]+…?")


# the user info of a URL of any scheme (http://user:password@host, postgresql://user:password@host)
_USERINFO_RE = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)[^\s/@'\"<>]*@")


def mask_userinfo(text: str) -> str:
    """Mask the user info (``user:password@``) of every URL inside ``text`` as ``***@``; the rest of
    each URL is kept (a log line still says which host and path was asked)."""
    return _USERINFO_RE.sub(r"\1***@", str(text))


def redact_text(text: str) -> str:
    """Replace every http(s) URL inside ``text`` with :func:`redact_url` of it (scheme and host), and
    mask the user info of a URL of any other scheme."""
    return mask_userinfo(_URL_RE.sub(lambda m: redact_url(m.group(0)), str(text)))


class MaskUserinfoFormatter(logging.Formatter):
    """A formatter whose whole output (message, traceback, stack) goes through :func:`mask_userinfo`.

    On a handler it covers the records of every logger, any library's included (a filter on a logger
    covers only that logger's own records): :mod:`flows.terminal` puts it on the log file (issue 32,
    item 6: httpx wrote the tracking URI's password with each request URL)."""

    def format(self, record: logging.LogRecord) -> str:  # noqa: A003 (logging API name)
        return mask_userinfo(super().format(record))


class MaskUserinfoFilter(logging.Filter):
    """The same for a handler whose formatter is not ours (a terminal handler a library configured):
    the record's message is rewritten before it is formatted."""

    def filter(self, record: logging.LogRecord) -> bool:  # noqa: A003 (logging API name)
        try:
            msg = record.getMessage()
        except (TypeError, ValueError, KeyError):  # msg % args failed (malformed record): leave it to logging
            return True
        masked = mask_userinfo(msg)
        if masked != msg:
            record.msg, record.args = masked, None
        return True


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
