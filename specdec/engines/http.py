"""One HTTP request read whole within one overall deadline (the engine check's requests, ``/metrics`` scrapes).

httpx's timeouts apply per connect and per read, so a server that sends one byte per second never
trips them. :func:`read_within` bounds the whole request: each read waits at most the time left, each
chunk is checked against the deadline, and a timer closes the response at the deadline, so the call
returns or raises within the deadline plus a fraction of a second whatever the server does.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import httpx

__all__ = ["MAX_BODY_BYTES", "Deadline", "Fetched", "read_within", "engine_root", "join_url"]

MAX_BODY_BYTES = 64 << 20  # an answer larger than this is refused, not read forever


def engine_root(url: str) -> str:
    """The root URL of an engine from the base URL a user gives: ``http://host:8000``, ``http://host:8000/`` and
    the OpenAI base URL ``http://host:8000/v1`` all give ``http://host:8000`` (the engine's own paths, ``/v1/models``,
    ``/metrics``, ``/props``, are under the root); a proxy's path prefix is kept (``http://gw/llama/v1/`` gives
    ``http://gw/llama``). Query and fragment are dropped. Raises ValueError for a URL that does not parse."""
    parts = urlsplit(str(url).strip())
    parts.port  # noqa: B018 (raises ValueError for a port that is not a number)
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def join_url(root: str, path: str) -> str:
    """``path`` (``/v1/models``, ``/server_info?config_format=json``) under the engine root ``root``
    (:func:`engine_root`) as a URL: ``http://gw/llama`` + ``/v1/models`` is ``http://gw/llama/v1/models``; the
    root's own query is not kept, the path's is."""
    base, rel = urlsplit(root), urlsplit(path)
    joined = base.path.rstrip("/") + "/" + rel.path.lstrip("/")
    return urlunsplit((base.scheme, base.netloc, joined, rel.query, ""))


@dataclass(frozen=True)
class Deadline:
    """A point in time (``time.monotonic()`` seconds) that work must finish by, and what set it.

    Attributes:
        at: the monotonic deadline.
        seconds: the budget it was made with (for messages).
        what: what it bounds and how to change it (for messages), e.g. ``"the engine check
            (SPECDEC_ENGINE_CHECK_TIMEOUT_S)"``.
    """

    at: float
    seconds: float
    what: str = "the request"

    @classmethod
    def after(cls, seconds: float, what: str = "the request") -> "Deadline":
        """A deadline ``seconds`` from now (``seconds`` > 0)."""
        return cls(time.monotonic() + float(seconds), float(seconds), what)

    def remaining(self) -> float:
        """Seconds left (<= 0: passed)."""
        return self.at - time.monotonic()

    def expired(self) -> bool:
        return self.remaining() <= 0

    def within(self, seconds: float, what: str) -> "Deadline":
        """The earlier of this deadline and one ``seconds`` from now (that one named ``what``)."""
        other = Deadline.after(seconds, what)
        return other if other.at < self.at else self

    def message(self) -> str:
        """``<what> did not finish within its overall deadline of <seconds> s``."""
        return f"{self.what} did not finish within its overall deadline of {self.seconds:g} s"


@dataclass
class Fetched:
    """A whole HTTP answer read within the deadline: status, content type and body text."""

    status_code: int
    content_type: str
    text: str


def read_within(client: httpx.Client, method: str, url: str, *, timeout_s: float | None = None,
                deadline: Deadline | None = None, **kw) -> Fetched:
    """``method url`` (``kw`` as ``httpx.Client.stream``: ``json=``, ``headers=``) read whole by the deadline.

    Args:
        timeout_s: the overall budget in seconds (used when ``deadline`` is None).
        deadline: the overall :class:`Deadline` (takes precedence).
    Raises:
        httpx.HTTPError: from httpx (unreachable, protocol errors).
        TimeoutError: the answer was not complete by the deadline (its message says so, with the bytes
            read), or exceeded :data:`MAX_BODY_BYTES`.
    """
    dl = deadline or Deadline.after(float(timeout_s or 0.0))
    left = dl.remaining()
    if left <= 0:
        raise TimeoutError(_late(dl, 0))
    size, closed = 0, threading.Event()
    try:
        with client.stream(method, url, timeout=left, **kw) as resp:
            timer = threading.Timer(max(dl.remaining(), 0.0), lambda: (closed.set(), resp.close()))
            timer.daemon = True
            timer.start()
            try:
                chunks = []
                for chunk in resp.iter_bytes():
                    chunks.append(chunk)
                    size += len(chunk)
                    if dl.expired():
                        raise TimeoutError(_late(dl, size))
                    if size > MAX_BODY_BYTES:
                        raise TimeoutError(f"the answer exceeds {MAX_BODY_BYTES >> 20} MiB")
            finally:
                timer.cancel()
            if closed.is_set():
                raise TimeoutError(_late(dl, size))
            body = b"".join(chunks)
            return Fetched(resp.status_code, resp.headers.get("content-type", ""),
                           body.decode(resp.encoding or "utf-8", errors="replace"))
    except (httpx.HTTPError, RuntimeError) as e:
        if closed.is_set() or isinstance(e, httpx.TimeoutException):  # every httpx timeout here is the time left
            raise TimeoutError(_late(dl, size)) from None
        if isinstance(e, httpx.HTTPError):
            raise
        raise httpx.ReadError(str(e)) from None


def _late(dl: Deadline, size: int) -> str:
    return f"the answer was not complete after {dl.seconds:g} s (overall deadline; {size} bytes read)"
