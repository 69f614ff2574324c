"""A scripted llama.cpp-shaped engine on 127.0.0.1 that misbehaves in one way at a time (no mocks: a real
HTTP server the real engine client talks to).

It serves llama-server's endpoints: ``GET /props``, ``/v1/models``, ``/slots``, ``/metrics`` and
``POST /completion`` (``return_tokens``: ``tokens`` and ``timings.draft_n`` / ``draft_n_accepted``).
Healthy answers come from ``answer(prompt_ids, n_predict) -> (tokens, draft_n, draft_n_accepted)``;
one fault at a time replaces them:

* ``hang``: the request is accepted and never answered;
* ``drip``: the answer's headers, then one byte every ``drip_interval_s`` seconds, for ever;
* ``body``: the raw bytes given (``b"null"``, ``b"[1, 2]"``, a JSON object with string tokens, ...);
* ``json``: the JSON object given, as is.

``/metrics`` sums the counters the healthy answers reported (llama.cpp's names), or serves ``metrics``
when given (impossible counters); ``props`` / ``models`` override what ``/props`` / ``/v1/models`` say.
``completions`` counts the ``/completion`` requests received.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from tests.support.net import free_port

Answer = Callable[[list[int], int], tuple[list[int], int, int]]


def llamacpp_props(model_path: str = "/models/target.gguf", **over: Any) -> dict[str, Any]:
    """A ``/props`` answer shaped like llama-server's (``tools/server/server-context.cpp``, ``get_res_props``)."""
    props = {"default_generation_settings": {"params": {}, "n_ctx": 2048}, "total_slots": 1,
             "model_alias": "target", "model_ftype": "Q4_1", "model_path": model_path, "bos_token": "<s>",
             "eos_token": "</s>", "build_info": "b0-scripted", "endpoint_metrics": True}
    props.update(over)
    return props


def llamacpp_metrics(drafts: int, draft_tokens: int, accepted: int, per_position: list[int]) -> str:
    """llama-server's speculative counters (``--metrics``) as text exposition."""
    lines = [f"llamacpp:spec_decode_num_drafts_total {drafts}",
             f"llamacpp:spec_decode_num_draft_tokens_total {draft_tokens}",
             f"llamacpp:spec_decode_num_accepted_tokens_total {accepted}"]
    lines += [f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {v}'
              for i, v in enumerate(per_position)]
    return "\n".join(["# TYPE llamacpp:spec_decode_num_drafts_total counter", *lines]) + "\n"


class ScriptedEngine:
    """The engine (module docstring); a context manager. ``url`` is ``http://127.0.0.1:<port>``."""

    def __init__(self, answer: Answer | None = None, *, fault: str | None = None, payload: Any = None,
                 props: dict[str, Any] | None = None, models: dict[str, Any] | None = None,
                 metrics: str | None = None, vocab_size: int = 103, drip_interval_s: float = 0.5) -> None:
        self.answer, self.fault, self.payload = answer, fault, payload
        self.props = props or llamacpp_props()
        self.models = models or {"object": "list", "data": [{"id": "target", "meta": {"n_vocab": vocab_size}}]}
        self.metrics, self.drip_interval_s = metrics, drip_interval_s
        self.completions = 0
        self.counted = [0, 0, 0]  # drafts, draft tokens, accepted over the healthy answers
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", free_port()), self._handler())
        self._server.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def _metrics_text(self) -> str:
        if self.metrics is not None:
            return self.metrics
        d, t, a = self.counted
        return llamacpp_metrics(d, t, a, [])

    def _handler(self):
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802 (http.server API)
                routes = {"/props": lambda: json.dumps(engine.props).encode(),
                          "/v1/models": lambda: json.dumps(engine.models).encode(),
                          "/slots": lambda: json.dumps([{"id": 0, "speculative": True}]).encode(),
                          "/health": lambda: b'{"status":"ok"}'}
                if self.path == "/metrics":
                    self._send(200, engine._metrics_text().encode(), "text/plain; version=0.0.4")
                elif self.path in routes:
                    self._send(200, routes[self.path]())
                else:
                    self._send(404, b'{"error":"not found"}')

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with engine._lock:
                    engine.completions += 1
                if engine.fault == "hang":
                    engine._stop.wait()
                    return
                if engine.fault == "drip":
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", "1000000")
                    self.end_headers()
                    while not engine._stop.wait(engine.drip_interval_s):
                        try:
                            self.wfile.write(b" ")
                            self.wfile.flush()
                        except OSError:
                            return
                    return
                if engine.fault == "body":
                    self._send(200, engine.payload)
                    return
                if engine.fault == "json":
                    self._send(200, json.dumps(engine.payload).encode())
                    return
                self._send(200, json.dumps(engine._complete(body)).encode())

            def log_message(self, *args) -> None:
                pass

        return Handler

    def _complete(self, body: dict[str, Any]) -> dict[str, Any]:
        tokens, draft_n, accepted = self.answer(list(body["prompt"]), int(body["n_predict"]))
        with self._lock:
            self.counted[0] += (draft_n + 3) // 4
            self.counted[1] += draft_n
            self.counted[2] += accepted
        return {"content": "", "tokens": tokens, "stop_type": "limit" if len(tokens) >= body["n_predict"] else "eos",
                "timings": {"predicted_n": len(tokens), "predicted_ms": 10.0 * len(tokens), "prompt_ms": 1.0,
                            "draft_n": draft_n, "draft_n_accepted": accepted}}

    def __enter__(self) -> "ScriptedEngine":
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        time.sleep(0.05)
        self._server.shutdown()
        self._server.server_close()
