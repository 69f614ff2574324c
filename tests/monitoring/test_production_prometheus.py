"""A real Prometheus (Debian package ``prometheus``, started here on 127.0.0.1 with a temporary config)
scrapes a real scripted vLLM exporter whose counters restart half-way; windows read back through the
Prometheus HTTP query API equal hand-computed values, and the production rules fire and resolve once
(alerts to a real webhook receiver). ``specdec ingest prometheus`` runs one window as a subprocess."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from monitoring import history
from monitoring.db import PRODUCTION, Incident, connect
from monitoring.production.engines import DRAFTS, ENGINES
from monitoring.production.ingest import ingest_window
from monitoring.production.settings import ProductionMapping, ProductionSettings, ProductionSource
from monitoring.production.sources import ProductionSourceError, query_raw_series
from tests.support.exporters import PrometheusServer, ScriptedExporter, histogram_state, prometheus_binary
from monitoring.receiver import WebhookReceiver
from tests.support.net import free_port

sys.path.insert(0, str(Path(__file__).parent))
from test_production_ingest import GOOD_A, GOOD_B, K, LOW_A, LOW_B, LOW_C, add, hand, seed_nightly, settings_for  # noqa: E402

if prometheus_binary() is None:
    pytest.skip("the prometheus binary is not installed (Debian: apt-get install prometheus; .ci/run installs it "
                "when it runs as root): the real-Prometheus tests cannot run", allow_module_level=True)

pytestmark = pytest.mark.server
REPO = Path(__file__).resolve().parents[2]
UTC = dt.timezone.utc
STEPS = [[], [GOOD_A], [GOOD_A, GOOD_B],                                         # s0..s2, created 1000
         [LOW_A], [LOW_A, LOW_B], [LOW_A, LOW_B, LOW_C],                         # s3..s5: restarted at 5000
         [LOW_A, LOW_B, LOW_C, GOOD_A], [LOW_A, LOW_B, LOW_C, GOOD_A, GOOD_B]]  # s6, s7
STATES = [[histogram_state("tiny-llm", "0", h, K, 1000.0 if i < 3 else 5000.0)] for i, h in enumerate(STEPS)]


@pytest.fixture(scope="module")
def scraped():
    """Prometheus has scraped every scripted state (one per scrape, 1 s apart)."""
    with ScriptedExporter(STATES) as ex, PrometheusServer([ex.target], scrape_interval_s=1.0) as prom:
        deadline = time.time() + 90
        while time.time() < deadline and len(ex.served) < len(STATES) + 1:
            time.sleep(0.25)
        assert len(ex.served) >= len(STATES) + 1, f"prometheus scraped {len(ex.served)} times: {prom.log_tail()}"
        t = [ex.first_served(i) for i in range(len(STATES))]
        # window bounds halfway between scrapes: b[i] separates state i from state i+1
        b = [(t[i] + t[i + 1]) / 2 for i in range(len(t) - 1)] + [t[-1] + 0.5]
        when = [dt.datetime.fromtimestamp(x, UTC) for x in b]
        end = when[-1]
        while time.time() < deadline:  # the last sample is queryable
            got = query_raw_series(prom.url, ENGINES["vllm"], when[0], end)
            drafts = [s for s in got if s.role == DRAFTS]
            if drafts and max(p[0] for p in drafts[0].samples) >= b[-1] - 1.0:
                break
            time.sleep(0.25)
        yield prom, when


def _source(prom) -> tuple[ProductionSource, ProductionSettings]:
    src = ProductionSource(name="prom-vllm", kind="prometheus", url=prom.url, engine="vllm", selector='job="vllm"')
    return src, ProductionSettings(sources=[src], mappings=[
        ProductionMapping(source="prom-vllm", model="tiny-llm", pair="pair-a", alias="champion", version="1")])


def test_raw_samples_and_whole_range_with_the_restart_equal_hand_values(scraped, tmp_path):
    prom, b = scraped
    ms = settings_for(tmp_path)
    db = connect(ms)
    src, ps = _source(prom)
    (o,) = ingest_window(db, src, b[0], b[-1], settings=ps, monitoring_settings=ms, alert=False)
    d, t, a, rate, ci = hand(add(*STEPS[2], *STEPS[7]))  # everything before and after the restart
    assert (o.num_drafts, o.num_draft_tokens, o.resets) == (d, t, 6)
    assert o.acceptance_rate == pytest.approx(rate, abs=1e-12)
    assert o.acceptance_rate_ci == pytest.approx(list(ci), abs=1e-6)
    assert (d, t, a) == (300 + 800, 3300, 520 + 146 + 86 + 520)  # GOOD_A+GOOD_B, LOW_A+LOW_B, LOW_C, GOOD_A+GOOD_B
    # a selector that matches nothing yields no series; a PromQL error is reported, not swallowed
    assert query_raw_series(prom.url, ENGINES["vllm"], b[0], b[-1], selector='job="nope"') == []
    with pytest.raises(ProductionSourceError, match="cannot query Prometheus"):
        query_raw_series(f"http://127.0.0.1:{free_port()}", ENGINES["vllm"], b[0], b[-1])
    db.dispose()


def test_windows_fire_one_alert_and_resolve_once(scraped, tmp_path):
    prom, b = scraped
    src, ps = _source(prom)
    windows = [(b[0], b[2]), (b[2], b[4]), (b[4], b[5]), (b[5], b[7])]
    want = [add(*STEPS[2]), add(LOW_A, LOW_B), LOW_C, add(GOOD_A, GOOD_B)]
    with WebhookReceiver() as rx:
        ms = settings_for(tmp_path, rx)
        db = connect(ms)
        seed_nightly(db, ms, 0.58, per_token=0.71)  # nightly champion agrees with healthy traffic (0.578; 0.71 per token)
        out = []
        for (start, end), hist in zip(windows, want):
            (o,) = ingest_window(db, src, start, end, settings=ps, monitoring_settings=ms)
            d, t, a, rate, ci = hand(hist)
            assert (o.num_drafts, o.num_draft_tokens) == (d, t)
            assert o.acceptance_rate == pytest.approx(rate, abs=1e-12)
            assert o.acceptance_rate_ci == pytest.approx(list(ci), abs=1e-6)
            out.append(o)
        events = [(r.body["event"], [x["rule"] for x in r.body["rules"]]) for r in rx.accepted]
    assert [o.resets for o in out] == [0, 6, 0, 0]
    assert [o.status for o in out] == ["passed", "failed", "failed", "passed"]
    assert [o.health_transition for o in out] == [None, "fire", None, "resolve"]
    assert [o.representativeness for o in out] == ["ok", "firing", "firing", "ok"]
    assert [o.representativeness_transition for o in out] == [None, "fire", None, "resolve"]
    with db.session() as s:
        scopes = {i.id: i.scope for i in s.scalars(select(Incident))}
    assert sorted(scopes.values()) == ["production:prom-vllm", "representativeness:prom-vllm"]
    health_fire = [e for e in events if e[0] == "fire" and "absolute" in e[1]]
    assert len(health_fire) == 1 and sum(1 for e in events if e[0] == "resolve") == 2
    assert len(events) == 4  # health fire + resolve, representativeness fire + resolve
    rows = history.list_runs(db, source=PRODUCTION)
    assert len(rows) == 4 and all(r.window_end is not None for r in rows)
    db.dispose()


def test_specdec_ingest_prometheus_cli_one_window(scraped, tmp_path):
    prom, b = scraped
    db_url = f"sqlite:///{tmp_path / 'cli.db'}"
    minutes = (b[2] - b[0]).total_seconds() / 60
    env = {**os.environ, "SPECDEC_HOME": str(tmp_path / "home"), "SPECDEC_ALERT_CHANNELS": "[]",
           "COLUMNS": "250"}
    env.pop("SPECDEC_PRODUCTION_MAPPINGS", None)
    cmd = [sys.executable, "-m", "specdec.cli", "ingest", "prometheus", "--url", prom.url, "--engine", "vllm",
           "--source", "prom-vllm", "--selector", 'job="vllm"', "--end", b[2].isoformat(), "--window", repr(minutes), "--pair", "pair-a",
           "--version", "1", "--model", "tiny-llm", "--db-url", db_url]
    r = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    d, t, a, rate, _ = hand(add(*STEPS[2]))
    assert f"{rate:.3f}" in r.stdout and str(t) in r.stdout and "passed" in r.stdout
    db = connect(url=db_url)
    (row,) = history.list_runs(db, source=PRODUCTION)
    assert (row.num_drafts, row.num_draft_tokens, row.num_accepted_tokens) == (d, t, a)
    db.dispose()
    bad = subprocess.run(cmd[:6] + [f"http://127.0.0.1:{free_port()}"] + cmd[7:], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "cannot query Prometheus at http://127.0.0.1" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_compose_prometheus_config_is_valid_for_promtool():
    """docker/prometheus.yml (the compose profile `production`) passes Prometheus' own config check."""
    import shutil

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool (Debian package prometheus) not installed")
    r = subprocess.run([promtool, "check", "config", str(REPO / "docker" / "prometheus.yml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "SUCCESS" in r.stdout + r.stderr, r.stdout + r.stderr
