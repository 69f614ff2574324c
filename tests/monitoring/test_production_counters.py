"""Reset-aware window deltas, the acceptance CI, and parsing real exposition text (prometheus_client;
llama.cpp: text captured from a live llama-server, tests/data/llamacpp)."""

from __future__ import annotations

import datetime as dt
import math

import pytest

from monitoring.production.counters import (
    WindowCounters,
    acceptance_rate_ci,
    counter_increase,
    pool_window,
    window_metrics,
)
from monitoring.production.counters import SeriesData
from monitoring.production.engines import DRAFTS, ENGINES, PER_POSITION, engine_metrics
from monitoring.production.restarts import infer_restarts
from monitoring.production.sources import Scrape, check_selector, parse_exposition, scrape_series
from tests.support.exporters import VllmCounters, histogram_state, render_vllm
from tests.support.llamacpp_traffic import CAPTURES, captured

S = [(0.0, 100.0), (10.0, 200.0), (20.0, 30.0), (30.0, 80.0)]  # a restart between t=10 and t=20


@pytest.mark.parametrize("start,end,want,resets", [
    (5, 30, 100 + 30 + 50, 1),  # anchor t=0: 0->10 (+100), 10->20 restart (+30), 20->30 (+50)
    (10, 30, 30 + 50, 1),       # anchor t=10 (a sample exactly at start belongs to the earlier window)
    (0, 10, 100, 0),
    (-5, 10, 0 + 100, 0),       # no anchor, creation unknown: the first sample is only the start point
    (25, 29, 0, 0),             # no sample inside
])
def test_counter_increase_hand_computed(start, end, want, resets):
    d = counter_increase(S, start, end)
    assert d.increase == want and d.resets == resets


def test_adjacent_windows_partition_the_increments_exactly():
    cuts = [-1, 3, 10, 15, 20, 26, 30]
    parts = [counter_increase(S, a, b).increase for a, b in zip(cuts, cuts[1:])]
    assert sum(parts) == counter_increase(S, -1, 30).increase == 100 + 30 + 50


def test_created_timestamp_reveals_a_restart_that_the_value_hides():
    s = [(0.0, 40.0), (10.0, 80.0)]  # restarted (created 5) and already past the old value
    assert counter_increase(s, 0, 10).increase == 40  # values alone: +40
    d = counter_increase(s, 0, 10, created={0.0: 1.0, 10.0: 5.0})
    assert d.increase == 80 and d.resets == 1
    # a series born inside the window counts from zero; one born before it does not
    assert counter_increase([(10.0, 7.0)], 5, 10, created={10.0: 6.0}).increase == 7
    assert counter_increase([(10.0, 7.0)], 5, 10, created={10.0: 4.0}).increase == 0
    with pytest.raises(ValueError):
        counter_increase(S, 10, 10)


def test_acceptance_ci_from_the_accepted_length_histogram_by_hand():
    # 300 drafts of k=3: accepted lengths 0,1,2,3 with counts 55,65,85,95
    drafts, tokens = 300, 900
    accepted = 65 + 2 * 85 + 3 * 95
    per_pos = [65 + 85 + 95, 85 + 95, 95]
    mean = accepted / drafts
    var = (65 + 4 * 85 + 9 * 95) / drafts - mean ** 2
    se = math.sqrt(var / drafts) / 3
    lo, hi = acceptance_rate_ci(drafts, tokens, accepted, per_pos, 3)
    assert accepted / tokens == pytest.approx(520 / 900)
    assert (lo, hi) == pytest.approx((520 / 900 - 1.959964 * se, 520 / 900 + 1.959964 * se), abs=1e-6)
    assert hi - lo == pytest.approx(2 * 1.959964 * 0.0210427, abs=1e-5)  # se by hand: 0.0210427
    # without per-position counts: the Bhatia-Davis bound m (k - m) is wider
    lo2, hi2 = acceptance_rate_ci(drafts, tokens, accepted, [], 3)
    assert hi2 - lo2 > hi - lo
    assert hi2 - lo2 == pytest.approx(2 * 1.959964 * math.sqrt(mean * (3 - mean) / drafts) / 3, abs=1e-9)
    assert all(math.isnan(x) for x in acceptance_rate_ci(1, 3, 1, [1, 0, 0], 3))
    assert all(math.isnan(x) for x in acceptance_rate_ci(300, 900, 520, [], None))


def test_window_metrics_follow_vllm_definitions():
    g = window_metrics(WindowCounters("m", 300, 900, 520, [245, 180, 95]))
    assert g.num_speculative_tokens == 3 and g.num_drafts == 300
    assert g.acceptance_rate == pytest.approx(520 / 900)
    assert g.mean_accepted_length == pytest.approx(1 + 520 / 300)
    assert g.per_position_acceptance == pytest.approx([245 / 300, 180 / 300, 95 / 300])
    assert g.draft_tokens_per_step == pytest.approx(3.0)
    assert g.alpha_hat == pytest.approx(520 / (520 + 300 - 95))  # rejected steps = drafts not fully accepted
    gauge = window_metrics(WindowCounters("m", gauge_acceptance_rate=0.55, gauge_accept_length=2.1, series=0))
    assert gauge.acceptance_rate == 0.55 and gauge.num_draft_tokens == 0
    assert all(math.isnan(x) for x in gauge.acceptance_rate_ci)


def _vllm_text(*counters: VllmCounters) -> str:
    return render_vllm(list(counters)).decode()


def test_parse_real_vllm_exposition_and_sum_engines_per_model():
    k = 3
    a0 = histogram_state("tiny", "0", [[30, 30, 40, 50]], k, created=1000.0)
    b0 = histogram_state("tiny", "1", [[10, 10, 10, 10]], k, created=1000.0)
    other = histogram_state("other", "0", [[5, 5, 5, 5]], k, created=1000.0)
    a1 = histogram_state("tiny", "0", [[30, 30, 40, 50], [25, 35, 45, 45]], k, created=1000.0)
    b1 = histogram_state("tiny", "1", [[20, 20, 20, 20]], k, created=2000.0)  # engine 1 restarted
    eng = ENGINES["vllm"]
    series, start = parse_exposition(_vllm_text(a0, b0, other), eng)
    assert start is None
    names = {s["name"] for s in series}
    assert names == {"vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                     "vllm:spec_decode_num_accepted_tokens_total",
                     "vllm:spec_decode_num_accepted_tokens_per_pos_total"}
    assert all(s["created"] == 1000.0 for s in series)
    t0 = dt.datetime(2026, 12, 1, 10, 0, tzinfo=dt.timezone.utc)
    prev = Scrape(t0, series)
    cur = Scrape(t0 + dt.timedelta(minutes=15), parse_exposition(_vllm_text(a1, b1, other), eng)[0])
    pooled = pool_window(scrape_series(prev, cur, eng), prev.at.timestamp(), cur.at.timestamp())
    tiny = pooled["tiny"]
    # engine 0: +150 drafts, +450 tokens, +260 accepted; engine 1 restarted: 80 drafts, 240, 120
    assert (tiny.num_drafts, tiny.num_draft_tokens, tiny.num_accepted_tokens) == (230, 690, 380)
    assert tiny.accepted_per_position == [125 + 60, 90 + 40, 45 + 20]
    # engine 1's restart shows only in _created (its counts grew past the old ones): 3 counters + 3 positions
    assert tiny.resets == 6 and tiny.series == 12
    assert pooled["other"].num_drafts == 0


def test_parse_sglang_gauges():
    sgl = ("# HELP sglang:spec_accept_rate x\n# TYPE sglang:spec_accept_rate gauge\n"
           'sglang:spec_accept_rate{model_name="m",tp_rank="0"} 0.62\n'
           "# HELP sglang:spec_accept_length x\n# TYPE sglang:spec_accept_length gauge\n"
           'sglang:spec_accept_length{model_name="m",tp_rank="0"} 2.9\n'
           "sglang:num_running_reqs{model_name=\"m\"} 3\n")
    series, _ = parse_exposition(sgl, engine_metrics("sglang"))
    assert {(s["role"], s["value"], s["gauge"]) for s in series} == {("rate_gauge", 0.62, True),
                                                                     ("length_gauge", 2.9, True)}
    with pytest.raises(ValueError, match="unknown serving engine"):
        engine_metrics("tgi")


def _lcpp(name: str) -> list[dict]:
    return parse_exposition(captured(name)[0].decode(), engine_metrics("llamacpp"))[0]


def test_parse_real_llama_server_exposition():
    """Text captured from a live llama-server (tests/data/llamacpp, provenance in each file's header)."""
    started, after = _lcpp(CAPTURES[0][0]), _lcpp(CAPTURES[1][0])
    # a fresh server: the three counters at 0, no per-position series yet, no _created, no process start
    assert {(s["role"], s["value"], s["created"]) for s in started} == {
        ("drafts", 0.0, None), ("draft_tokens", 0.0, None), ("accepted", 0.0, None)}
    sent = captured(CAPTURES[1][0])[1]
    by_role = {(s["role"], s["labels"].get("position")): s["value"] for s in after}
    assert by_role[("draft_tokens", None)] == sent.num_draft_tokens  # = sum of the requests' timings.draft_n
    assert by_role[("accepted", None)] == sent.num_accepted_tokens
    pp = [by_role[("per_position", str(i))] for i in range(4)]  # k = --spec-draft-n-max = 4 positions
    assert sum(pp) == sent.num_accepted_tokens and pp == sorted(pp, reverse=True) and pp[0] <= by_role[("drafts", None)]
    assert {s["labels"].get("position") for s in after} == {None, "0", "1", "2", "3"}  # no model label
    assert parse_exposition(captured(CAPTURES[1][0])[0].decode(), engine_metrics("llamacpp"))[1] is None


def _at(minute: int) -> dt.datetime:
    return dt.datetime(2026, 12, 1, 10, minute, tzinfo=dt.timezone.utc)


def test_llama_server_restart_without_created_restarts_every_counter_and_late_series_count_from_zero():
    eng = engine_metrics("llamacpp")
    s0, s1, s2, s3 = (Scrape(_at(i), _lcpp(n)) for i, (n, _) in enumerate(CAPTURES))

    def window(a: Scrape, b: Scrape) -> WindowCounters:
        return pool_window(scrape_series(a, b, eng), a.at.timestamp(), b.at.timestamp())[""]

    # the per-position series first appear after the baseline scrape: counted from 0, not lost
    w1 = window(s0, s1)
    assert (w1.num_draft_tokens, w1.num_accepted_tokens) == (79, 48) and sum(w1.accepted_per_position) == 48
    assert window(s1, s2).resets == 3  # restarted: the counters went down to 0 (the per-position ones are gone)
    w3 = window(s2, s3)
    assert (w3.num_draft_tokens, w3.num_accepted_tokens, w3.resets) == (38, 12, 0)
    assert sum(w3.accepted_per_position) == 12
    # a restart straight to traffic: the drafts counter fell (21 -> 10) while position 3 grew past its old
    # value (7 -> 9): one process, so every counter restarted and position 3 counts 9, not 9 - 7
    text = captured(CAPTURES[3][0])[0].decode().replace('per_pos_total{position="3"} 1', 'per_pos_total{position="3"} 9')
    grown = Scrape(_at(5), parse_exposition(text, eng)[0])
    w = window(s1, grown)
    assert w.resets == 7 and w.accepted_per_position[3] == 9 and w.num_drafts == 10


def test_late_and_restarted_series_in_prometheus_style_samples():
    """Raw samples as Prometheus stores them (one timestamp per scrape; a per-position series absent
    from the scrapes before the server drafted, and after its restart): the zeros and the restart are
    inferred per target (the labels without ``position``), not across targets."""
    drafts = SeriesData(DRAFTS, "", None, ((0.0, 0.0), (10.0, 21.0), (20.0, 0.0), (30.0, 10.0)))
    pos0 = SeriesData(PER_POSITION, "", 0, ((10.0, 16.0), (30.0, 8.0)))  # absent at 0 and after the restart
    other = SeriesData(PER_POSITION, "", 0, ((10.0, 5.0), (30.0, 9.0)))  # another target: no zeros, no restart
    got = infer_restarts([(("job", "a"), drafts), (("job", "a"), pos0), (("job", "b"), other)])
    assert got[1].samples == ((0.0, 0.0), (10.0, 16.0), (20.0, 0.0), (30.0, 8.0))
    assert got[1].created == {0.0: -math.inf, 10.0: -math.inf, 20.0: 10.0, 30.0: 10.0}
    assert got[2].samples == other.samples and set(got[2].created.values()) == {-math.inf}
    assert counter_increase(got[1].samples, -1, 30, got[1].created).increase == 16 + 8
    assert counter_increase(pos0.samples, -1, 30).increase == 8  # what the raw samples alone would give


def test_selector_validation():
    assert check_selector('job="vllm", instance=~"gpu-.*"') == 'job="vllm", instance=~"gpu-.*"'
    assert check_selector('{job="vllm"}') == 'job="vllm"'
    for bad in ('job=vllm', '} or vector(1) {', 'job="a"} or {x="y"'):
        with pytest.raises(ValueError):
            check_selector(bad)
