"""A real webhook endpoint on 127.0.0.1: the demo's alert receiver, and the one public helper for
your own alert tests (``from monitoring.receiver import WebhookReceiver``).

``WebhookReceiver`` is a ``ThreadingHTTPServer`` in a thread that records every POST (path,
headers, JSON body) and answers with scripted statuses (e.g. ``[500, 500]`` then 200, or a
:class:`Reply` with ``Retry-After`` or a delay), so a channel's retries and deduplication can be
checked against a real socket. The project's own test helpers (tiny models, report builders, MLflow
and Prometheus servers) live under ``tests/support/`` and are not part of the package.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterable


@dataclass(frozen=True)
class Reply:
    """A scripted answer: ``status`` with extra ``headers`` (e.g. ``{"Retry-After": "1"}``), sent
    after ``delay_s`` seconds (a delay longer than the client's timeout is a receiver that hangs:
    the request arrived and was recorded, the answer never reaches the client in time)."""

    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()
    delay_s: float = 0.0


@dataclass
class ReceivedRequest:
    """One POST the receiver got, and the status it answered."""

    path: str
    headers: dict[str, str]
    body: Any
    status: int


class WebhookReceiver:
    """A real webhook endpoint on ``127.0.0.1`` (threaded), for tests and the demo.

    Args:
        statuses: statuses (ints or :class:`Reply`) to answer, in order, before falling back to
            ``default_status``.
        default_status: status once the script is exhausted (200).
        port: 0 for an ephemeral port, or a fixed one (e.g. to come back up where a run failed).
    Use as a context manager; ``url(path)`` gives the endpoint, ``requests`` what arrived,
    ``accepted`` the bodies answered 2xx.
    """

    def __init__(self, statuses: Iterable[int | Reply] = (), default_status: int | Reply = 200,
                 port: int = 0) -> None:
        self._script = list(statuses)
        self.default_status = default_status
        self.requests: list[ReceivedRequest] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw or b"null")
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                with receiver._lock:
                    reply = receiver._script.pop(0) if receiver._script else receiver.default_status
                    reply = reply if isinstance(reply, Reply) else Reply(int(reply))
                    status = reply.status
                    receiver.requests.append(ReceivedRequest(self.path, dict(self.headers), body, status))
                if reply.delay_s:
                    receiver._stop.wait(reply.delay_s)
                payload = b"ok" if status < 400 else b"error"
                self.send_response(status)
                for name, value in reply.headers:
                    self.send_header(name, value)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                try:
                    self.wfile.write(payload)
                except OSError:  # the client gave up (timeout) before the answer
                    pass

            def log_message(self, *args) -> None:  # keep test output (and URLs) quiet
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread: threading.Thread | None = None

    def url(self, path: str = "/hook") -> str:
        """The endpoint URL for ``path``."""
        return f"http://127.0.0.1:{self.port}{path}"

    def script(self, statuses: Iterable[int | Reply]) -> None:
        """Queue statuses to answer next."""
        with self._lock:
            self._script.extend(statuses)

    @property
    def accepted(self) -> list[ReceivedRequest]:
        """Requests answered with a 2xx status."""
        with self._lock:
            return [r for r in self.requests if 200 <= r.status < 300]

    def start(self) -> "WebhookReceiver":
        """Serve in a daemon thread."""
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release the port."""
        self._stop.set()  # release handlers that are hanging on purpose
        if self._thread is not None:
            self.server.shutdown()
            self._thread.join(5)
            self._thread = None
        self.server.server_close()

    def __enter__(self) -> "WebhookReceiver":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


__all__ = ["WebhookReceiver", "ReceivedRequest", "Reply"]
