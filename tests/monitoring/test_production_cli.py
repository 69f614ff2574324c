"""``specdec ingest metrics`` and ``specdec history`` with production rows, through the real CLI app,
against a real scripted vLLM exporter and a real SQLite file."""

from __future__ import annotations

import datetime as dt

import pytest
from typer.testing import CliRunner

from monitoring import history
from monitoring.db import connect
from tests.support.exporters import ScriptedExporter, histogram_counts, histogram_state
from tests.support.net import free_port
from tests.support.reports import make_report
from specdec.cli import app

K = 3
GOOD_A = [30, 30, 40, 50]


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    for v in ("SPECDEC_DB_URL", "SPECDEC_ALERT_CHANNELS", "SPECDEC_PRODUCTION_SOURCES", "SPECDEC_PRODUCTION_MAPPINGS"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(*args):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "250"})


def test_ingest_metrics_then_history_shows_both_sources(env):
    db = connect(url=f"sqlite:///{env / 'home' / 'history.db'}")
    rep = make_report(0.58, k=K)
    key = history.RunKey.build("pair-a", "1", rep.heldout_name, "1", rep.config, dt.date(2026, 11, 30))
    history.record_run(db, rep, key, history.Lineage(), alias="champion")
    states = [[histogram_state("tiny", "0", [GOOD_A] * i, K, 1000.0)] for i in range(3)]
    args = ["--engine", "vllm", "--source", "vllm-a", "--pair", "pair-a", "--version", "1", "--model", "tiny"]
    with ScriptedExporter(states) as ex:
        first = run("ingest", "metrics", "--url", ex.url, *args)
        second = run("ingest", "metrics", "--url", ex.url, *args, "--plot", str(env / "plots"))
    assert first.exit_code == 0 and "baseline" in first.output, first.output
    assert second.exit_code == 0, second.output
    drafts, tokens, accepted, _ = histogram_counts(GOOD_A, K)
    assert f"{accepted / tokens:.3f}" in second.output and "passed" in second.output
    assert (env / "plots" / "pair-a" / "acceptance_trend.png").exists()
    (row,) = history.list_runs(db, source="production")
    assert (row.num_drafts, row.num_draft_tokens, row.num_accepted_tokens) == (drafts, tokens, accepted)
    db.dispose()
    r = run("history", "--pair", "pair-a")
    assert r.exit_code == 0, r.output
    assert "production" in r.output and "nightly" in r.output and "vllm-a:tiny" in r.output
    assert "acceptance trend pair-a (production):" in r.output and "acceptance trend pair-a:" in r.output
    r = run("history", "--source", "production")
    assert r.exit_code == 0 and "spec-bench-mini" not in r.output and "vllm-a:tiny" in r.output
    assert run("history", "--source", "prod").exit_code == 2


def test_ingest_errors_are_clean_and_write_nothing(env):
    down = f"http://127.0.0.1:{free_port()}/metrics"
    r = run("ingest", "metrics", "--url", down, "--pair", "pair-a", "--version", "1")
    assert r.exit_code == 1 and "cannot scrape http://127.0.0.1" in r.output and "Traceback" not in r.output
    r = run("ingest", "prometheus", "--url", "http://127.0.0.1:1", "--end", "yesterday", "--pair", "p")
    assert r.exit_code == 2 and "not an ISO-8601 time" in r.output
    r = run("ingest", "prometheus", "--url", "http://127.0.0.1:1", "--selector", "job=vllm", "--pair", "p",
            "--version", "1")
    assert r.exit_code == 2 and "invalid label selector" in r.output
    r = run("ingest", "metrics", "--url", "ftp://x/metrics", "--pair", "p")
    assert r.exit_code == 2 and "must be http(s)" in r.output
    r = run("ingest", "metrics", "--url", down, "--engine", "tgi", "--pair", "p")
    assert r.exit_code == 2 and "unknown engine 'tgi'" in r.output
    db = connect(url=f"sqlite:///{env / 'home' / 'history.db'}")
    assert history.list_runs(db) == []
    db.dispose()


class _TrickleServer:
    """A real HTTP server on 127.0.0.1 whose ``/metrics`` answer arrives one byte per second (a wedged
    exporter: every read succeeds, the body never completes in useful time)."""

    def __init__(self) -> None:
        import http.server
        import threading
        import time

        body = b"# TYPE vllm:spec_decode_num_drafts counter\n" * 100

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server API)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    for b in body:
                        self.wfile.write(bytes([b]))
                        self.wfile.flush()
                        time.sleep(1.0)
                except OSError:  # the client gave up
                    pass

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"

    def __enter__(self) -> "_TrickleServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_wedged_exporter_sending_one_byte_per_second_ends_at_the_deadline(env):
    """issue 32, item 5: before, ``ingest metrics`` kept reading forever (httpx's timeout is per read)."""
    import os
    import subprocess
    import sys

    child_env = {**os.environ, "SPECDEC_HOME": str(env / "home"), "SPECDEC_PRODUCTION_TIMEOUT_S": "3",
                 "COLUMNS": "250"}
    with _TrickleServer() as srv:
        try:
            p = subprocess.run([sys.executable, "-m", "specdec.cli", "ingest", "metrics", "--url", srv.url,
                                "--pair", "pair-a", "--version", "1"], env=child_env, capture_output=True,
                               text=True, timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail("ingest metrics still reading a one-byte-per-second exporter after 120 s")
    out = p.stdout + p.stderr
    assert p.returncode == 1 and "cannot scrape http://127.0.0.1" in out and "deadline" in out, out[-2000:]
    assert "Traceback" not in out, out[-2000:]
    db = connect(url=f"sqlite:///{env / 'home' / 'history.db'}")
    assert history.list_runs(db) == []
    db.dispose()
