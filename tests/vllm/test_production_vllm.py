"""Production ingest from a live ``vllm serve`` on 127.0.0.1 (the real target, the bf16 draft, k = 4; skipped with
one line where vLLM is not installed): real requests, then ``specdec``'s ingest reads the live server's
``/metrics`` directly and through a real Prometheus scraping it. Each window's drafts, drafted and accepted
tokens and per-position counts equal the engine's own per-request counts (vLLM's ``metrics.speculative_decoding``
of each answer), which equal its counter deltas."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field

import pytest

from monitoring import history
from monitoring.db import PRODUCTION, connect
from monitoring.production.engines import DRAFTS, ENGINES
from monitoring.production.ingest import ingest_window
from monitoring.production.settings import ProductionMapping, ProductionSettings, ProductionSource
from monitoring.production.sources import query_raw_series
from monitoring.settings import MonitoringSettings
from specdec.engines.vllm import per_position_of
from specdec.engines.vllm_server import VllmClient
from specdec.validation.heldout import prompt_token_ids
from tests.support.exporters import PrometheusServer, prometheus_binary
from tests.support.vllm import K, MAX_TOKENS

pytestmark = [pytest.mark.server, pytest.mark.slow]
UTC = dt.timezone.utc
VLLM = ENGINES["vllm"]
JOB = "vllm"


@dataclass
class Sent:
    """The engine's own per-request counts of some requests, summed."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_position: list[int] = field(default_factory=lambda: [0] * K)


def _send(url: str, prompts: list[list[int]]) -> Sent:
    client, sent = VllmClient(url, timeout_s=300.0), Sent()
    try:
        for ids in prompts:
            out = client.complete(ids, max_tokens=MAX_TOKENS, temperature=0.0)
            hist = out.per_request["acceptance_histogram"]
            sent.drafts += sum(hist)
            sent.draft_tokens += out.per_request["num_draft_tokens"]
            sent.accepted += out.per_request["num_accepted_draft_tokens"]
            sent.per_position = [a + b for a, b in zip(sent.per_position, per_position_of(hist))]
    finally:
        client.close()
    assert sent.draft_tokens > 0
    return sent


def _check(o, row, sent: Sent) -> None:
    assert (o.num_drafts, o.num_draft_tokens) == (sent.drafts, sent.draft_tokens)
    assert o.acceptance_rate == pytest.approx(sent.accepted / sent.draft_tokens, abs=1e-12)
    assert (row.num_drafts, row.num_draft_tokens, row.num_accepted_tokens) == (sent.drafts, sent.draft_tokens, sent.accepted)
    assert row.overall["accepted_per_position"] == sent.per_position and row.num_speculative_tokens == K
    lo, hi = row.overall["acceptance_rate_ci"]
    assert lo <= sent.accepted / sent.draft_tokens <= hi


@pytest.fixture(scope="module")
def prompts(real_pair, short_heldout):
    tok = real_pair[0].tokenizer
    return [prompt_token_ids(p, tok) for p in short_heldout.prompts[:4]]


def test_ingest_reads_the_live_vllm_metrics_directly(serve_draft, prompts, tmp_path):
    src = ProductionSource(name="vllm-live", kind="metrics", url=f"{serve_draft.url}/metrics", engine="vllm")
    ps = ProductionSettings(sources=[src], mappings=[ProductionMapping(source="vllm-live", model="target",
                                                                       pair="smol-bf16", version="1")])
    ms = MonitoringSettings(db_url=f"sqlite:///{tmp_path / 'direct.db'}", home=tmp_path / "home", alert_channels=[])
    db = connect(ms)
    (first,) = ingest_window(db, src, settings=ps, monitoring_settings=ms, alert=False)
    sent = _send(serve_draft.url, prompts[:2])
    (o,) = ingest_window(db, src, settings=ps, monitoring_settings=ms, alert=False)
    rows = sorted(history.list_runs(db, source=PRODUCTION), key=lambda r: r.window_end)
    db.dispose()
    assert first.status == "baseline" and o.model == "target" and o.resets == 0
    _check(o, rows[-1], sent)


def _latest_drafts_sample(prom: PrometheusServer, after: float, timeout_s: float = 60.0) -> tuple[float, float]:
    """``(time, value)`` of the first stored drafts-counter sample scraped after ``after`` (unix s)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        now = dt.datetime.now(UTC)
        got = query_raw_series(prom.url, VLLM, now - dt.timedelta(seconds=120), now, selector=f'job="{JOB}"')
        pts = sorted(p for s in got if s.role == DRAFTS for p in s.samples if p[0] > after)
        if pts:
            return pts[0]
        time.sleep(0.3)
    raise AssertionError(f"prometheus stored no scrape of vllm serve after {after}: {prom.log_tail()}")


def test_ingest_reads_the_live_vllm_through_a_real_prometheus(serve_draft, prompts, tmp_path):
    if prometheus_binary() is None:
        pytest.skip("the prometheus binary is not installed (Debian: apt-get install prometheus; .ci/run installs it)")
    with PrometheusServer([f"127.0.0.1:{serve_draft.port}"], scrape_interval_s=1.0, job=JOB) as prom:
        t_anchor, _ = _latest_drafts_sample(prom, time.time())  # a scrape of the idle server: the window's anchor
        start = dt.datetime.fromtimestamp(t_anchor - 0.01, UTC)
        sent = _send(serve_draft.url, prompts[2:4])
        t_last, _ = _latest_drafts_sample(prom, time.time())
        end = dt.datetime.fromtimestamp(t_last + 0.01, UTC)
        src = ProductionSource(name="vllm-prom", kind="prometheus", url=prom.url, engine="vllm", selector=f'job="{JOB}"')
        ps = ProductionSettings(sources=[src], mappings=[ProductionMapping(source="vllm-prom", model="target",
                                                                           pair="smol-bf16", version="1")])
        ms = MonitoringSettings(db_url=f"sqlite:///{tmp_path / 'prom.db'}", home=tmp_path / "home", alert_channels=[])
        db = connect(ms)
        (o,) = ingest_window(db, src, start, end, settings=ps, monitoring_settings=ms, alert=False)
        (row,) = history.list_runs(db, source=PRODUCTION)
        db.dispose()
    assert o.model == "target" and o.resets == 0
    _check(o, row, sent)
