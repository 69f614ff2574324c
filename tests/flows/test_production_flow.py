"""The ``production-acceptance`` Prefect flow (under ``prefect_test_harness``) against a real scripted
vLLM ``/metrics`` exporter, and its deployment in prefect.yaml."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.support.exporters import ScriptedExporter, histogram_counts, histogram_state

REPO = Path(__file__).resolve().parents[2]
K = 3
GOOD_A, GOOD_B = [30, 30, 40, 50], [25, 35, 45, 45]


def test_deployment_in_prefect_yaml_and_default_cron():
    from flows.production import production_acceptance_flow
    from monitoring.production.settings import ProductionSettings

    deps = {d["name"]: d for d in yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]}
    dep = deps["production-acceptance"]
    assert dep["entrypoint"] == "flows/production.py:production_acceptance_flow"
    assert [s["cron"] for s in dep["schedules"]] == ["{{ $SPECDEC_PRODUCTION_CRON }}"]
    assert production_acceptance_flow.name == "production-acceptance"
    assert ProductionSettings().cron == "*/15 * * * *" and ProductionSettings().window_minutes == 15


def test_flow_ingests_windows_and_draws_both_sources(tmp_path, monkeypatch, prefect_harness):
    from flows.production import production_acceptance_flow
    from monitoring import history, pipeline
    from monitoring.db import connect
    from monitoring.history import trend_points
    from specdec.core.stats import DecodingStats
    from tests.support.reports import make_report

    states = [[histogram_state("tiny", "0", [GOOD_A] * i, K, 1000.0)] for i in range(3)]
    home = tmp_path / "home"
    monkeypatch.setenv("SPECDEC_HOME", str(home))
    monkeypatch.delenv("SPECDEC_DB_URL", raising=False)
    monkeypatch.setenv("SPECDEC_ALERT_CHANNELS", "[]")
    monkeypatch.setenv("SPECDEC_PRODUCTION_SOURCES", "[]")
    assert production_acceptance_flow() == []  # nothing configured: nothing to do, no failure
    from monitoring.settings import get_settings

    db = connect(get_settings())
    d0, t0, a0, _ = histogram_counts(GOOD_A, K)  # the nightly agrees with traffic on the floor's per-token metric
    rep = make_report(0.58, ci_half=0.03, num_draft_tokens=2000, k=K, hat_half=0.03,
                      alpha_hat=DecodingStats(K, num_drafts=d0, num_draft_tokens=t0, num_accepted_tokens=a0).per_token_acceptance)
    key = history.RunKey.build("pair-a", "1", rep.heldout_name, rep.heldout_version, rep.config, "2026-11-30")
    pipeline.evaluate_run(db, history.record_run(db, rep, key, history.Lineage(), alias="champion"),
                          settings=get_settings())
    with ScriptedExporter(states) as ex:
        monkeypatch.setenv("SPECDEC_PRODUCTION_SOURCES", json.dumps(
            [{"name": "vllm-test", "kind": "metrics", "url": ex.url, "engine": "vllm"}]))
        monkeypatch.setenv("SPECDEC_PRODUCTION_MAPPINGS", json.dumps(
            [{"source": "vllm-test", "model": "tiny", "pair": "pair-a", "alias": "champion", "version": "1"}]))
        first = production_acceptance_flow()
        second = production_acceptance_flow()
        third = production_acceptance_flow()
    assert [o["status"] for o in first] == ["baseline"]
    drafts, tokens, accepted, _ = histogram_counts(GOOD_A, K)
    for out in (second, third):
        (o,) = out
        assert (o["status"], o["pair"], o["version"], o["representativeness"]) == ("passed", "pair-a", "1", "ok")
        assert (o["num_drafts"], o["num_draft_tokens"]) == (drafts, tokens)
        assert o["acceptance_rate"] == pytest.approx(accepted / tokens)
    pts = trend_points(db, "pair-a")
    assert [p["source"] for p in pts] == ["nightly", "production", "production"]
    png = home / "reports" / "production" / "pair-a" / "acceptance_trend.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    db.dispose()


def test_trend_of_both_sources_plots(tmp_path):
    import datetime as dt

    from registry.plots import plot_trend

    t0 = dt.datetime(2026, 12, 1, 2, 0, tzinfo=dt.timezone.utc)
    nightly = [{"time": t0 + dt.timedelta(days=d), "acceptance_rate": 0.6, "acceptance_rate_ci_low": 0.57,
                "pair_version": "1"} for d in range(2)]
    prod = [{"time": t0 + dt.timedelta(hours=h), "acceptance_rate": 0.3 if h == 5 else 0.58,
             "acceptance_rate_ci_low": 0.55, "source": "production", "pair_version": "1"} for h in range(1, 30, 4)]
    pts = sorted([{**p, "source": "nightly"} for p in nightly] + prod, key=lambda p: p["time"])
    out = plot_trend(pts, tmp_path / "trend.png", threshold=0.4, estimator="pooled")
    assert out.read_bytes()[:4] == b"\x89PNG"
