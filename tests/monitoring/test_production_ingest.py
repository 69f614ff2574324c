"""Direct /metrics scraping of a real scripted vLLM exporter (and of /metrics texts captured from a live
llama-server) into a real SQLite history, with the drift rules, the representativeness rule and alerts
to a real webhook receiver on 127.0.0.1."""

from __future__ import annotations

import datetime as dt
import math

import pytest
from sqlalchemy import select

from monitoring import history, pipeline
from monitoring.db import PRODUCTION, Incident, ProductionScrape, connect
from monitoring.production.ingest import ingest_window
from monitoring.production.settings import ProductionMapping, ProductionSettings, ProductionSource
from monitoring.production.engines import ENGINES
from monitoring.production.sources import ProductionSourceError, parse_exposition
from tests.support.exporters import ScriptedExporter, histogram_counts, histogram_state
from tests.support.llamacpp_traffic import CAPTURES, captured
from specdec.core.stats import iid_alpha
from monitoring.settings import ChannelConfig, DeliverySettings, MonitoringSettings
from monitoring.receiver import WebhookReceiver
from tests.support.net import free_port
from tests.support.reports import make_report

K = 3
FAST = DeliverySettings(max_attempts=2, backoff_initial_s=0.01, backoff_max_s=0.05, timeout_s=5)
GOOD_A, GOOD_B = [30, 30, 40, 50], [25, 35, 45, 45]  # accepted-length histograms (0..3 of k=3)
# low: per-token acceptance (the floor's metric) 0.31, 0.35 and 0.31, the rate 0.14-0.17 at k=3
LOW_A, LOW_B, LOW_C = [70, 20, 7, 3], [130, 45, 17, 8], [140, 40, 14, 6]


def hand(hist):
    """(drafts, tokens, accepted, acceptance, 95% CI) of pooled drafts with accepted-length histogram."""
    d, t, a, _ = histogram_counts(hist, K)
    mean = a / d
    var = sum(j * j * n for j, n in enumerate(hist)) / d - mean ** 2
    half = 1.959964 * math.sqrt(var / d) / (t / d)
    return d, t, a, a / t, (a / t - half, a / t + half)


def add(*hists):
    return [sum(x) for x in zip(*hists)]


def settings_for(tmp_path, receiver=None) -> MonitoringSettings:
    ch = [ChannelConfig(type="webhook", url=receiver.url("/hook"), name="ops")] if receiver else []
    return MonitoringSettings(db_url=f"sqlite:///{tmp_path / 'history.db'}", home=tmp_path, alert_channels=ch,
                              delivery=FAST)


def seed_nightly(db, ms, acceptance, *, per_token, day=dt.date(2026, 11, 30)) -> int:
    """A nightly champion run of pair-a v1 (k=3, 2000 draft tokens, CIs +-0.03), evaluated; ``per_token``
    is its per-token acceptance (the floor's and the representativeness rule's metric: traffic from
    GOOD_A/GOOD_B has 0.67-0.72)."""
    rep = make_report(acceptance, ci_half=0.03, num_draft_tokens=2000, k=K, alpha_hat=per_token, hat_half=0.03)
    key = history.RunKey.build("pair-a", "1", rep.heldout_name, rep.heldout_version, rep.config, day)
    run_id = history.record_run(db, rep, key, history.Lineage("t", "d", "1", "0.1.0"), alias="champion")
    pipeline.evaluate_run(db, run_id, settings=ms)
    return run_id


def prod_settings(url) -> tuple[ProductionSource, ProductionSettings]:
    src = ProductionSource(name="vllm-test", kind="metrics", url=url, engine="vllm")
    return src, ProductionSettings(sources=[src], mappings=[
        ProductionMapping(source="vllm-test", model="tiny", pair="pair-a", alias="champion", version="1")])


def run_all(db, src, ps, ms, n):
    return [ingest_window(db, src, settings=ps, monitoring_settings=ms) for _ in range(n)]


def test_windows_with_a_restart_equal_hand_computed_values(tmp_path):
    e0 = [[], [GOOD_A], [GOOD_A, GOOD_B]]
    states = [[histogram_state("tiny", "0", e0[i], K, 1000.0),
               histogram_state("tiny", "1", [[10, 10, 10, 10]] if i else [], K, 1000.0)] for i in range(2)]
    # engine 1 restarts before the third scrape and is already past its old counts
    states.append([histogram_state("tiny", "0", e0[2], K, 1000.0),
                   histogram_state("tiny", "1", [[20, 20, 20, 20]], K, 2000.0)])
    ms = settings_for(tmp_path)
    db = connect(ms)
    seed_nightly(db, ms, 0.56, per_token=0.71)
    with ScriptedExporter(states) as ex:
        src, ps = prod_settings(ex.url)
        first, w1, w2 = run_all(db, src, ps, ms, 3)
    assert [o.status for o in first] == ["baseline"]
    for got, hist, resets in ((w1, add(GOOD_A, [10, 10, 10, 10]), 0), (w2, add(GOOD_B, [20, 20, 20, 20]), 6)):
        (o,) = got
        d, t, a, rate, ci = hand(hist)
        assert (o.num_drafts, o.num_draft_tokens, o.resets) == (d, t, resets)
        assert o.acceptance_rate == pytest.approx(rate, abs=1e-12)
        assert o.acceptance_rate_ci == pytest.approx(list(ci), abs=1e-6)
        assert o.mean_accepted_length == pytest.approx(1 + a / d)
        assert (o.status, o.representativeness, o.pair, o.version) == ("passed", "ok", "pair-a", "1")
    assert (w1[0].num_drafts, w1[0].num_draft_tokens) == (190, 570)  # 150 + 40 drafts; 3 tokens each
    assert (w2[0].num_drafts, w2[0].num_draft_tokens) == (230, 690)  # 150 + 80 (engine 1 after its restart)
    rows = history.list_runs(db, source=PRODUCTION)
    assert [r.id for r in rows] == [w2[0].run_id, w1[0].run_id]
    r2 = rows[0]
    assert r2.window_start == w1[0].end and r2.window_end == w2[0].end and r2.alias == "champion"
    assert (r2.production_source, r2.engine, r2.heldout_name) == ("vllm-test", "vllm", "tiny")  # columns, no prefixes
    assert r2.num_speculative_tokens == K
    assert r2.baseline_run_id == w1[0].run_id  # relative/collapse rules compare with the previous passing window
    assert {x["rule"] for x in r2.rule_results} >= {"absolute", "relative", "collapse", "representativeness"}
    assert len(history.list_runs(db, source="nightly")) == 1
    assert [r.source for r in history.runs_pending_mlflow(db)] == ["nightly"]  # production is never logged to MLflow
    db.dispose()


def test_drop_below_40_percent_fires_one_alert_and_resolves_once(tmp_path):
    hists = [[], [GOOD_A], [GOOD_A, GOOD_B]]
    states = [[histogram_state("tiny", "0", h, K, 1000.0)] for h in hists]
    states += [[histogram_state("tiny", "0", h, K, 5000.0)]  # restart, then low acceptance
               for h in ([LOW_A, LOW_B], [LOW_A, LOW_B, LOW_C], [LOW_A, LOW_B, LOW_C, LOW_C])]
    states += [[histogram_state("tiny", "0", [LOW_A, LOW_B, LOW_C, LOW_C] + h, K, 5000.0)]
               for h in ([GOOD_A, GOOD_B], [GOOD_A, GOOD_B, GOOD_A])]
    with WebhookReceiver() as rx, ScriptedExporter(states) as ex:
        ms = settings_for(tmp_path, rx)
        db = connect(ms)
        src, ps = prod_settings(ex.url)
        out = [o for step in run_all(db, src, ps, ms, len(states)) for o in step]
    assert [o.status for o in out] == ["baseline", "passed", "passed", "failed", "failed", "failed",
                                       "passed", "passed"]
    assert [o.health_transition for o in out[1:]] == [None, None, "fire", None, None, "resolve", None]
    low = out[3]  # the window across the restart: GOOD_B before it is not part of it, LOW_A+LOW_B after it
    d, t, a, rate, ci = hand(add(LOW_A, LOW_B))
    assert (low.num_drafts, low.num_draft_tokens, low.resets) == (d, t, 6)
    assert low.acceptance_rate == pytest.approx(rate) and ci[1] < 0.40
    bodies = [r.body for r in rx.accepted]
    assert [b["event"] for b in bodies] == ["fire", "resolve"]
    assert "absolute" in {r["rule"] for r in bodies[0]["rules"]}
    assert "production vllm-test" in bodies[0]["facts"]["Held-out"]
    with db.session() as s:
        inc = s.scalars(select(Incident)).all()
    assert [(i.scope, i.status) for i in inc] == [("production:vllm-test", "resolved")]
    db.dispose()


def test_representativeness_fires_on_a_mismatch_and_stays_quiet_on_a_match(tmp_path):
    states = [[histogram_state("tiny", "0", [GOOD_A] * i, K, 1000.0)] for i in range(4)]
    with WebhookReceiver() as rx, ScriptedExporter(states) as ex:
        ms = settings_for(tmp_path, rx)
        db = connect(ms)
        seed_nightly(db, ms, 0.85, per_token=0.95)  # the held-out set says 0.95 per token; traffic gives ~0.70
        src, ps = prod_settings(ex.url)
        out = [o for step in run_all(db, src, ps, ms, 3) for o in step]
        seed_nightly(db, ms, 0.58, per_token=0.71, day=dt.date(2026, 12, 1))  # a newer nightly run agrees with traffic
        out += ingest_window(db, src, settings=ps, monitoring_settings=ms)
    assert [o.status for o in out] == ["baseline", "passed", "passed", "passed"]  # production itself is healthy
    assert [o.representativeness for o in out[1:]] == ["firing", "firing", "ok"]
    assert [o.representativeness_transition for o in out[1:]] == ["fire", None, "resolve"]
    assert [o.health_transition for o in out[1:]] == [None, None, None]
    fire, resolve = (r.body for r in rx.accepted)
    assert (fire["event"], resolve["event"]) == ("fire", "resolve")
    assert "held-out set or serving stack differs from traffic" in fire["text"]
    assert [r["rule"] for r in fire["rules"]] == ["representativeness"]
    db.dispose()


def test_first_scrape_is_a_baseline_and_an_unreachable_source_writes_nothing(tmp_path):
    ms = settings_for(tmp_path)
    db = connect(ms)
    src, ps = prod_settings(f"http://127.0.0.1:{free_port()}/metrics")
    with pytest.raises(ProductionSourceError, match=r"cannot scrape http://127\.0\.0\.1:\d+/…"):
        ingest_window(db, src, settings=ps, monitoring_settings=ms)
    with db.session() as s:
        assert s.scalars(select(ProductionScrape)).all() == []
    states = [[histogram_state("other-model", "0", [GOOD_A] * i, K, 1000.0)] for i in range(2)]
    with ScriptedExporter(states) as ex:
        src, ps = prod_settings(ex.url)
        first, second = run_all(db, src, ps, ms, 2)
    assert [o.status for o in first] == ["baseline"]
    assert [(o.model, o.status) for o in second] == [("other-model", "unmapped")]  # no mapping: no row
    assert history.list_runs(db, source=PRODUCTION) == []
    db.dispose()


def _text(*lines: str) -> bytes:
    return ("\n".join(lines) + "\n").encode()


def test_sglang_gauges_are_recorded_but_never_alert(tmp_path):
    sgl = [_text("# TYPE sglang:spec_accept_rate gauge", f'sglang:spec_accept_rate{{model_name="m"}} {r}',
                 "# TYPE sglang:spec_accept_length gauge", f'sglang:spec_accept_length{{model_name="m"}} {n}')
           for r, n in ((0.7, 3.1), (0.2, 1.6))]
    with WebhookReceiver() as rx, ScriptedExporter(sgl) as s_ex:
        ms = settings_for(tmp_path, rx)
        db = connect(ms)
        s_src = ProductionSource(name="sgl", kind="metrics", url=s_ex.url, engine="sglang")
        ps = ProductionSettings(sources=[s_src], mappings=[ProductionMapping(source="sgl", pair="pair-s", version="1")])
        assert [o.status for o in ingest_window(db, s_src, settings=ps, monitoring_settings=ms)] == ["baseline"]
        (s,) = ingest_window(db, s_src, settings=ps, monitoring_settings=ms)
    # SGLang: the gauge value (0.2, below 40%) is recorded, but without token counts there is no evidence
    assert (s.model, s.acceptance_rate, s.mean_accepted_length, s.num_draft_tokens) == ("m", 0.2, 1.6, None)
    assert s.status == "inconclusive" and s.acceptance_rate_ci == [] and s.health_transition is None
    assert rx.accepted == []
    db.dispose()


def exact_ci(drafts: int, tokens: int, per_pos: list[int]) -> list[float]:
    """The acceptance CI by hand from per-position counts (drafts that accepted exactly j = reach[j] - reach[j+1])."""
    reach = [drafts] + per_pos + [0]
    exactly = [reach[j] - reach[j + 1] for j in range(len(per_pos) + 1)]
    mean = sum(per_pos) / drafts
    var = sum(j * j * n for j, n in enumerate(exactly)) / drafts - mean ** 2
    half = 1.959964 * math.sqrt(var / drafts) / (tokens / drafts)
    return [sum(per_pos) / tokens - half, sum(per_pos) / tokens + half]


def test_captured_llama_server_windows_equal_its_per_request_counts(tmp_path):
    """The /metrics texts of a live llama-server (tests/data/llamacpp: started, 3 requests, restarted, 1
    request), served in order: each window equals the engine's own per-request timings, with the exact
    CI from its per-position counters, and the restart (counters down to 0, no _created) is one reset."""
    texts = [captured(name) for name, _ in CAPTURES]
    ms = settings_for(tmp_path)
    db = connect(ms)
    with ScriptedExporter([t for t, _ in texts]) as ex:
        src = ProductionSource(name="lcpp", kind="metrics", url=ex.url, engine="llamacpp")
        ps = ProductionSettings(sources=[src], mappings=[ProductionMapping(source="lcpp", pair="pair-l", version="1")])
        first, w1, w2, w3 = run_all(db, src, ps, ms, 4)
    assert [o.status for o in first] == ["baseline"]
    (w1,), (w2,), (w3,) = w1, w2, w3
    for o, (text, sent) in ((w1, texts[1]), (w3, texts[3])):
        series = {(s["role"], s["labels"].get("position")): int(s["value"])
                  for s in parse_exposition(text.decode(), ENGINES["llamacpp"])[0]}
        drafts, pp = series[("drafts", None)], [series[("per_position", str(i))] for i in range(4)]
        assert (o.model, o.pair, o.num_draft_tokens, o.resets) == ("", "pair-l", sent.num_draft_tokens, 0)
        assert o.acceptance_rate == pytest.approx(sent.num_accepted_tokens / sent.num_draft_tokens, abs=1e-12)
        assert o.num_drafts == drafts and o.mean_accepted_length == pytest.approx(1 + sent.num_accepted_tokens / drafts)
        assert o.acceptance_rate_ci == pytest.approx(exact_ci(drafts, sent.num_draft_tokens, pp), abs=1e-6)
        # the floor's per-token acceptance from the live server's counters: the nightly's estimator
        per_token = iid_alpha(sent.num_accepted_tokens / drafts, sent.num_draft_tokens / drafts)
        assert o.per_token_acceptance == pytest.approx(per_token, abs=1e-12)
        lo, hi = (iid_alpha(x * sent.num_draft_tokens / drafts, sent.num_draft_tokens / drafts) for x in o.acceptance_rate_ci)
        assert o.per_token_acceptance_ci == pytest.approx([lo, hi], abs=1e-9) and lo < per_token < hi
    assert (w2.num_draft_tokens, w2.resets, w2.acceptance_rate) == (0, 3, None)  # the restart, nothing drafted yet
    rows = {r.id: r for r in history.list_runs(db, source=PRODUCTION)}
    row = rows[w3.run_id]
    assert (row.num_speculative_tokens, row.num_accepted_tokens) == (4, texts[3][1].num_accepted_tokens)
    db.dispose()
