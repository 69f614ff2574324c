"""Real parts for tests (no mocks): a scripted vLLM ``/metrics`` exporter on 127.0.0.1 and
a Prometheus server process (the Debian ``prometheus`` binary) scraping it.

:class:`ScriptedExporter` serves vLLM's speculative-decoding counters, rendered by
``prometheus_client`` itself (``_total`` and ``_created`` samples, labels ``model_name``, ``engine``,
``position``), from a script of cumulative states: each GET serves the next state (the last one
repeats). A server restart is a state with a new ``created`` time and counters starting again.
:func:`histogram_state` builds consistent counters from accepted-length histograms.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Sequence

import httpx
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from tests.support.net import free_port


@dataclass(frozen=True)
class VllmCounters:
    """Cumulative vLLM counters of one (model, engine) series set at one moment.

    ``created``: the counters' creation time (unix seconds; changes on a restart).
    """

    model: str
    engine: str
    drafts: int
    draft_tokens: int
    accepted: int
    per_position: tuple[int, ...]
    created: float


def histogram_counts(hist: Sequence[int], k: int) -> tuple[int, int, int, tuple[int, ...]]:
    """``(drafts, draft_tokens, accepted, per_position)`` of drafts whose accepted lengths have
    histogram ``hist`` (``hist[j]`` drafts accepted exactly j of k tokens; every draft proposes k)."""
    drafts = sum(hist)
    accepted = sum(j * n for j, n in enumerate(hist))
    per_pos = tuple(sum(hist[j] for j in range(i + 1, len(hist))) for i in range(k))
    return drafts, drafts * k, accepted, per_pos


def histogram_state(model: str, engine: str, hists: Sequence[Sequence[int]], k: int, created: float) -> VllmCounters:
    """Cumulative counters after the steps ``hists`` (each an accepted-length histogram) since ``created``."""
    d = t = a = 0
    pp = [0] * k
    for h in hists:
        dd, tt, aa, p = histogram_counts(h, k)
        d, t, a = d + dd, t + tt, a + aa
        pp = [x + y for x, y in zip(pp, p)]
    return VllmCounters(model, engine, d, t, a, tuple(pp), created)


def render_vllm(state: Sequence[VllmCounters]) -> bytes:
    """The text exposition (format 0.0.4) vLLM's prometheus_client counters produce for ``state``."""

    class _Collector:
        def collect(self):
            fams = {
                "drafts": CounterMetricFamily("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.",
                                              labels=["model_name", "engine"]),
                "draft_tokens": CounterMetricFamily("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.",
                                                    labels=["model_name", "engine"]),
                "accepted": CounterMetricFamily("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.",
                                                labels=["model_name", "engine"]),
            }
            pos = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                      "Accepted tokens per draft position.", labels=["model_name", "engine", "position"])
            for c in state:
                for name, fam in fams.items():
                    fam.add_metric([c.model, c.engine], getattr(c, name), created=c.created)
                for i, v in enumerate(c.per_position):
                    pos.add_metric([c.model, c.engine, str(i)], v, created=c.created)
            yield from fams.values()
            yield pos
            up = GaugeMetricFamily("vllm:num_requests_running", "Number of requests in model execution batches.",
                                   labels=["model_name", "engine"])
            for c in state:
                up.add_metric([c.model, c.engine], 1)
            yield up

    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Collector())
    return generate_latest(reg)


class ScriptedExporter:
    """A real ``/metrics`` endpoint on 127.0.0.1 serving ``states`` one per GET (the last repeats).

    Args:
        states: each a list of :class:`VllmCounters` (one per model/engine), or raw exposition bytes.
    Attributes:
        served: ``(unix time, state index)`` of every GET, in order.
    """

    def __init__(self, states: Sequence[Sequence[VllmCounters] | bytes], port: int = 0) -> None:
        self.states = list(states)
        self.served: list[tuple[float, int]] = []
        self._lock = threading.Lock()
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server API)
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                with exporter._lock:
                    i = min(len(exporter.served), len(exporter.states) - 1)
                    exporter.served.append((time.time(), i))
                st = exporter.states[i]
                body = st if isinstance(st, bytes) else render_vllm(st)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The ``/metrics`` URL."""
        return f"http://127.0.0.1:{self.port}/metrics"

    @property
    def target(self) -> str:
        """``127.0.0.1:<port>`` for a Prometheus ``static_configs`` target."""
        return f"127.0.0.1:{self.port}"

    def first_served(self, index: int) -> float | None:
        """When state ``index`` was first served (unix seconds), or ``None``."""
        with self._lock:
            return next((t for t, i in self.served if i == index), None)

    def __enter__(self) -> "ScriptedExporter":
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def prometheus_binary() -> str | None:
    """Path of the ``prometheus`` binary (Debian package ``prometheus``), or ``None``."""
    return shutil.which("prometheus") or next(
        (p for p in ("/usr/bin/prometheus", "/usr/local/bin/prometheus") if Path(p).exists()), None)


@dataclass
class PrometheusServer:
    """A real Prometheus on 127.0.0.1 with a temporary config and TSDB, scraping ``targets``.

    Use as a context manager; ``url`` is the base URL for the HTTP API. The process is started
    with the Prometheus binary found by :func:`prometheus_binary` and terminated on exit.
    """

    targets: list[str]
    scrape_interval_s: float = 1.0
    job: str = "vllm"
    binary: str | None = None
    port: int = field(default_factory=free_port)
    startup_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        self.url = f"http://127.0.0.1:{self.port}"
        self._dir: tempfile.TemporaryDirectory | None = None
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> "PrometheusServer":
        binary = self.binary or prometheus_binary()
        if binary is None:
            raise FileNotFoundError("prometheus binary not found (Debian: apt-get install prometheus)")
        self._dir = tempfile.TemporaryDirectory(prefix="specdec-prom-")
        d = Path(self._dir.name)
        iv = f"{int(self.scrape_interval_s * 1000)}ms"
        targets = ", ".join(f'"{t}"' for t in self.targets)
        (d / "prometheus.yml").write_text(
            f"global:\n  scrape_interval: {iv}\n  scrape_timeout: {iv}\n"
            f"scrape_configs:\n  - job_name: {self.job}\n    static_configs:\n      - targets: [{targets}]\n")
        self._log = open(d / "prometheus.log", "wb")
        self._proc = subprocess.Popen(
            [binary, f"--config.file={d / 'prometheus.yml'}", f"--storage.tsdb.path={d / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.time() + self.startup_timeout_s
        while time.time() < deadline:
            if self._proc.poll() is not None:
                self.__exit__()
                raise RuntimeError(f"prometheus exited with {self._proc.returncode}: {self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.__exit__()
        raise TimeoutError(f"prometheus not ready after {self.startup_timeout_s}s: {self.log_tail()}")

    def log_tail(self, n: int = 2000) -> str:
        """The end of the server's log."""
        try:
            return (Path(self._dir.name) / "prometheus.log").read_text(errors="replace")[-n:]
        except Exception:
            return ""

    def __exit__(self, *exc) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)
        if getattr(self, "_log", None):
            self._log.close()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None
