"""Production ingest from a real ``llama-server`` on 127.0.0.1 (the built engine, SmolLM2 Q4_1 target,
its Q4_0 requantization as the draft, k = 4): real requests, then ``specdec ingest`` reads the live
server's counters directly from its ``/metrics`` and through a real Prometheus scraping it, across a
real restart (plain counters, no ``_created``: the counters go down), and the ``production-acceptance``
flow ingests it as a configured source. Each window's drafted and accepted
tokens equal the sums of the engine's own per-request ``timings.draft_n`` / ``draft_n_accepted``, and
the CI comes from its per-position counters. Skipped with one line where the engine is not built."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from monitoring import history
from monitoring.db import PRODUCTION, connect
from monitoring.production.engines import DRAFTS, ENGINES
from monitoring.production.ingest import ingest_window
from monitoring.production.settings import ProductionMapping, ProductionSettings, ProductionSource
from monitoring.production.sources import parse_exposition, query_raw_series
from monitoring.settings import MonitoringSettings
from specdec.engines.client import EngineClient
from specdec.engines.llama_server import LlamaServer
from specdec.engines.llamacpp_build import EngineInstall
from tests.support.engine import engine_or_skip
from tests.support.exporters import PrometheusServer, prometheus_binary
from tests.support.llamacpp_traffic import CAPTURES, K, PROMPTS, Sent, captured, restart, send, spec_flags

pytestmark = pytest.mark.server
REPO = Path(__file__).resolve().parents[2]
UTC = dt.timezone.utc
LCPP = ENGINES["llamacpp"]
JOB = "llama-server"


@dataclass
class Live:
    """The module's one llama-server (``restart`` replaces the process, same port and flags)."""

    install: EngineInstall
    server: LlamaServer

    @property
    def metrics_url(self) -> str:
        return f"{self.server.url}/metrics"

    def restart(self) -> None:
        self.server = restart(self.server)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    install = engine_or_skip()
    server = LlamaServer(install.server, spec_flags(install), tmp_path_factory.mktemp("llama") / "llama-server.log")
    holder = Live(install, server.start())
    yield holder
    holder.server.stop()


@pytest.fixture(scope="module")
def prom(live):
    if prometheus_binary() is None:
        pytest.skip("the prometheus binary is not installed (Debian: apt-get install prometheus; .ci/run installs it)")
    with PrometheusServer([f"127.0.0.1:{live.server.port}"], scrape_interval_s=1.0, job=JOB) as p:
        yield p


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "SPECDEC_HOME": str(tmp_path / "home"), "SPECDEC_ALERT_CHANNELS": "[]", "COLUMNS": "250",
           "PYTHONPATH": os.pathsep.join(x for x in (str(REPO), os.environ.get("PYTHONPATH")) if x)}
    env.pop("SPECDEC_PRODUCTION_MAPPINGS", None)
    env.pop("SPECDEC_PRODUCTION_SOURCES", None)
    return {**env, **extra}


def _ingest(args: list[str], env: dict[str, str]) -> str:
    r = subprocess.run([sys.executable, "-m", "specdec.cli", "ingest", *args], env=env, cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def _check_row(row, sent: Sent) -> None:
    """The recorded window equals the engine's per-request sums, with the per-position CI."""
    assert (row.num_draft_tokens, row.num_accepted_tokens) == (sent.num_draft_tokens, sent.num_accepted_tokens)
    assert row.num_draft_tokens > 0 and row.num_speculative_tokens == K
    overall = row.overall
    pp = overall["accepted_per_position"]
    assert len(pp) == K and sum(pp) == sent.num_accepted_tokens and pp[0] <= row.num_drafts
    lo, hi = overall["acceptance_rate_ci"]
    assert lo < sent.num_accepted_tokens / sent.num_draft_tokens < hi and math.isfinite(lo) and hi - lo < 0.6


def _settings(tmp_path: Path, db_url: str) -> MonitoringSettings:
    return MonitoringSettings(db_url=db_url, home=tmp_path / "home", alert_channels=[])


def test_ingest_metrics_reads_the_live_server_directly_across_a_restart(live, tmp_path):
    db_url = f"sqlite:///{tmp_path / 'direct.db'}"
    args = ["metrics", "--url", live.metrics_url, "--engine", "llamacpp", "--source", "lcpp-live",
            "--pair", "pair-l", "--version", "1", "--db-url", db_url]
    env = _env(tmp_path)
    assert "baseline" in _ingest(args, env)
    first, _ = send(live.server.url, PROMPTS[0:3])
    _ingest(args, env)
    # the next windows in-process, from the same stored scrape (the CLI's own call, without its start-up cost)
    src = ProductionSource(name="lcpp-live", kind="metrics", url=live.metrics_url, engine="llamacpp")
    ps = ProductionSettings(sources=[src], mappings=[ProductionMapping(source="lcpp-live", pair="pair-l", version="1")])
    ms = _settings(tmp_path, db_url)
    db = connect(ms)
    live.restart()  # counters back to 0, the per-position series gone until the server drafts again
    (reset,) = ingest_window(db, src, settings=ps, monitoring_settings=ms, alert=False)
    second, _ = send(live.server.url, PROMPTS[3:4])
    (late,) = ingest_window(db, src, settings=ps, monitoring_settings=ms, alert=False)
    rows = sorted(history.list_runs(db, source=PRODUCTION), key=lambda r: r.window_end)
    db.dispose()
    assert (reset.num_draft_tokens, reset.resets, reset.status) == (0, 3, "inconclusive")
    assert (late.resets, late.num_draft_tokens) == (0, second.num_draft_tokens)
    assert len(rows) == 3
    _check_row(rows[0], first)
    _check_row(rows[2], second)  # the per-position counters appeared after the restart: counted from 0
    assert rows[0].window_end == rows[1].window_start and rows[1].window_end == rows[2].window_start


def _latest_drafts_sample(prom: PrometheusServer, after: float, timeout_s: float = 30.0) -> tuple[float, float]:
    """``(time, value)`` of the first stored drafts-counter sample scraped after ``after`` (unix s)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        now = dt.datetime.now(UTC)
        got = query_raw_series(prom.url, LCPP, now - dt.timedelta(seconds=60), now, selector=f'job="{JOB}"')
        pts = sorted(p for s in got if s.role == DRAFTS for p in s.samples if p[0] > after)
        if pts:
            return pts[0]
        time.sleep(0.3)
    raise AssertionError(f"prometheus stored no scrape of llama-server after {after}: {prom.log_tail()}")


def test_ingest_prometheus_reads_the_live_server_through_a_real_prometheus(live, prom, tmp_path):
    live.restart()  # a fresh server: no per-position series at the window's anchor
    _latest_drafts_sample(prom, time.time())  # a scrape of the idle server: the window's anchor
    start = dt.datetime.now(UTC)
    first, _ = send(live.server.url, PROMPTS[0:2])
    _latest_drafts_sample(prom, time.time())  # scraped before the restart (what a restart precedes unscraped is lost)
    live.restart()
    t_restart = time.time()
    assert _latest_drafts_sample(prom, t_restart)[1] == 0  # Prometheus saw the restarted server's zeros
    second, _ = send(live.server.url, PROMPTS[2:4])
    t_last, _ = _latest_drafts_sample(prom, time.time())
    end = dt.datetime.fromtimestamp(t_last + 0.01, UTC)
    sent = first + second
    # in-process: the outcome's reset count and the exact CI
    src = ProductionSource(name="lcpp-prom", kind="prometheus", url=prom.url, engine="llamacpp", selector=f'job="{JOB}"')
    mapping = ProductionMapping(source="lcpp-prom", pair="pair-l", version="1")  # no model label: model "*"
    ms = _settings(tmp_path, f"sqlite:///{tmp_path / 'inproc.db'}")
    db = connect(ms)
    (o,) = ingest_window(db, src, start, end, settings=ProductionSettings(sources=[src], mappings=[mapping]),
                         monitoring_settings=ms, alert=False)
    db.dispose()
    assert (o.model, o.num_draft_tokens, o.resets) == ("", sent.num_draft_tokens, 3 + K)  # every counter restarted
    assert o.acceptance_rate == pytest.approx(sent.num_accepted_tokens / sent.num_draft_tokens, abs=1e-12)
    # the CLI, with the source's mapping from SPECDEC_PRODUCTION_MAPPINGS (as docs/production.md configures it)
    db_url = f"sqlite:///{tmp_path / 'cli.db'}"
    env = _env(tmp_path, SPECDEC_PRODUCTION_MAPPINGS=json.dumps([mapping.model_dump()]))
    minutes = (end - start).total_seconds() / 60
    out = _ingest(["prometheus", "--url", prom.url, "--engine", "llamacpp", "--source", "lcpp-prom",
                   "--selector", f'job="{JOB}"', "--end", end.isoformat(), "--window", repr(minutes),
                   "--db-url", db_url], env)
    assert str(sent.num_draft_tokens) in out and f"{o.acceptance_rate:.3f}" in out
    db = connect(url=db_url)
    (row,) = history.list_runs(db, source=PRODUCTION)
    db.dispose()
    _check_row(row, sent)


def test_committed_capture_has_the_live_servers_format(live):
    """The fixture texts under tests/data/llamacpp are what this engine emits: same speculative-decoding
    sample names, labels and HELP/TYPE lines (values differ)."""
    send(live.server.url, PROMPTS[0:1])  # the per-position series exist once the server drafted
    client = EngineClient(live.server.url)
    try:
        text = client.metrics_text()
    finally:
        client.close()
    fixture = captured(CAPTURES[1][0])[0].decode()

    def shape(t: str) -> tuple[set, list[str]]:
        series = {(s["name"], tuple(sorted(s["labels"]))) for s in parse_exposition(t, LCPP)[0]}
        meta = [x for x in t.splitlines() if x.startswith(("# HELP", "# TYPE")) and "spec_decode" in x]
        return series, meta

    assert shape(text) == shape(fixture)
    assert {s["labels"].get("position") for s in parse_exposition(text, LCPP)[0]} == {None, *map(str, range(K))}


def test_production_flow_ingests_a_configured_llamacpp_source(live, tmp_path, monkeypatch, prefect_harness):
    """The ``production-acceptance`` flow, configured only by SPECDEC_PRODUCTION_SOURCES / _MAPPINGS."""
    from flows.production import production_acceptance_flow

    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SPECDEC_DB_URL", raising=False)
    monkeypatch.setenv("SPECDEC_ALERT_CHANNELS", "[]")
    monkeypatch.setenv("SPECDEC_PRODUCTION_SOURCES", json.dumps(
        [{"name": "lcpp-flow", "kind": "metrics", "url": live.metrics_url, "engine": "llamacpp"}]))
    monkeypatch.setenv("SPECDEC_PRODUCTION_MAPPINGS", json.dumps(
        [{"source": "lcpp-flow", "model": "*", "pair": "pair-l", "alias": "champion", "version": "1"}]))
    assert [o["status"] for o in production_acceptance_flow(plot=False)] == ["baseline"]
    sent, _ = send(live.server.url, PROMPTS[1:3])
    (o,) = production_acceptance_flow(plot=False)
    assert (o["source"], o["model"], o["pair"], o["num_draft_tokens"]) == ("lcpp-flow", "", "pair-l", sent.num_draft_tokens)
    assert o["acceptance_rate"] == pytest.approx(sent.num_accepted_tokens / sent.num_draft_tokens, abs=1e-12)
    assert len(o["acceptance_rate_ci"]) == 2
