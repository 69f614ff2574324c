"""Secrets out of messages: a webhook URL shown as its scheme and host only.

Used where settings refuse a bad alert channel URL (:mod:`monitoring.settings`) and by
:mod:`monitoring.redact`, which also masks database URLs and filters log records.
"""

from __future__ import annotations

import logging
import re
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


def shown_url(url: str, limit: int = 80) -> str:
    """An endpoint URL as an error message may show it, so the user sees what was wrong with it
    (``notaurl``, ``htp://host``, ``http://[::1``): the user info masked (``***@``), the query and fragment
    dropped (where tokens go), at most ``limit`` characters. For an engine's base URL, which carries no secret
    in its path; a webhook URL (a secret path) is shown with :func:`redact_url`."""
    text = mask_userinfo(str(url)).split("?", 1)[0].split("#", 1)[0]
    if "://" not in text and "@" in text:  # user:password@host without a scheme
        text = "***@" + text.rsplit("@", 1)[1]
    return text if len(text) <= limit else text[: limit - 1] + "…"


# the user info of a URL of any scheme (http://user:password@host, postgresql://user:password@host)
_USERINFO_RE = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)[^\s/@'\"<>]*@")


def mask_userinfo(text: str) -> str:
    """Mask the user info (``user:password@``) of every URL inside ``text`` as ``***@``; the rest of
    each URL is kept (a log line still says which host and path was asked)."""
    return _USERINFO_RE.sub(r"\1***@", str(text))


class MaskUserinfoFormatter(logging.Formatter):
    """A formatter whose whole output (message, traceback, stack) goes through :func:`mask_userinfo`.

    On a handler it covers the records of every logger, any library's included (a filter on a logger
    covers only that logger's own records): :mod:`specdec.terminal` puts it on the log file (httpx
    wrote the tracking URI's password with each request URL)."""

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


# options whose value is a credential, in the engines' own spelling (vLLM, llama-server, SGLang, TGI); any option
# whose last word ends in one of _SECRET_WORDS counts too (--openai-api-key, --auth-token), in any case and with
# vLLM's underscore spellings (--api_key, --HF_TOKEN=x)
SECRET_OPTIONS = frozenset({"--api-key", "--hf-token", "-hft", "--token", "--ssl-keyfile-password", "--password",
                            "--admin-api-key"})
_SECRET_WORDS = ("key", "token", "secret", "password", "passwd", "credentials")
# an environment assignment (VLLM_API_KEY=..., HF_TOKEN=...) before the program or after `env` / `-e`
_ENV_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.S)


def _secret_word(name: str, sep: str) -> bool:
    """Whether the last word of ``name`` (split at ``sep``) ends in a credential word (``API_KEY``, ``hf-token``)."""
    last = name.lower().strip(sep).rsplit(sep, 1)[-1]
    return last.endswith(_SECRET_WORDS)


def secret_option(name: str) -> bool:
    """Whether the option ``name`` (``--api-key``, ``--api_key``, ``--HF-TOKEN``, ``-hft``) takes a credential."""
    norm = name.lower().replace("_", "-")
    return norm in SECRET_OPTIONS or (norm.startswith("--") and _secret_word(norm[2:], "-"))


def _redact_word(a: str) -> tuple[str, bool]:
    """One word of a command line redacted, and whether the next word is the value of a credential option."""
    name, eq, value = a.partition("=")
    if name.startswith("-"):
        if secret_option(name):
            return (f"{name}=***", False) if eq else (a, True)
        return (f"{name}={_redact_word(value)[0]}" if eq else mask_userinfo(a)), False  # --env=HF_TOKEN=...
    env = _ENV_RE.fullmatch(a)
    if env and _secret_word(env.group(1), "_"):
        return f"{env.group(1)}=***", False
    return mask_userinfo(a), False


def redact_argv(args: list[str] | tuple[str, ...]) -> list[str]:
    """A command line (``["VLLM_API_KEY=s3cret", "vllm", "serve", ..., "--api_key", "s3cret"]``) with every
    credential replaced by ``***``: the value of each credential option (:func:`secret_option`: ``--api-key VALUE``
    or ``--API_KEY=VALUE``; a value-less ``--hf-token`` followed by a ``--`` option leaves that option as it is), each
    environment assignment whose name ends in a credential word (``HF_TOKEN=...``, ``OPENAI_API_KEY=...``; also
    after ``env`` or docker's ``-e``), and the user info of every URL (:func:`mask_userinfo`). Idempotent."""
    out: list[str] = []
    hide_next = False
    for a in map(str, args):
        if hide_next and not a.startswith("--"):
            out.append("***")
            hide_next = False
            continue
        word, hide_next = _redact_word(a)
        out.append(word)
    return out


def strip_userinfo(url: str) -> tuple[str, bool]:
    """``url`` without its user info (``http://user:pw@host:8080/x`` -> ``http://host:8080/x``) and
    whether it had any. Raises ValueError for a URL that does not parse (e.g. an unclosed IPv6 host)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    parts.port  # noqa: B018 (raises ValueError for a port that is not a number or out of range)
    if "@" not in parts.netloc:
        return url, False
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2])), True
