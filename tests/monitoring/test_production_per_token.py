"""Production windows compute the floor's per-token acceptance from per-position counters, the same
estimator the nightly computes from its step counters (issue 30), for vLLM- and llama.cpp-format scrapes."""

from __future__ import annotations

import datetime as dt

import pytest

from monitoring.production.counters import pool_window, window_metrics
from monitoring.production.engines import ACCEPTED, DRAFT_TOKENS, DRAFTS, ENGINES, PER_POSITION, EngineMetrics
from monitoring.production.sources import Scrape, parse_exposition, scrape_series
from specdec.core.stats import DecodingStats, iid_alpha
from tests.support.exporters import histogram_state, render_vllm

K = 4
#: accepted-length histograms of two scrape intervals: hist[j] = drafts that accepted exactly j of K
BEFORE, DURING = [40, 25, 15, 10, 10], [120, 70, 40, 30, 20]

def _llamacpp_engine() -> EngineMetrics:
    return ENGINES["llamacpp"]


#: llama-server's counter names (tools/server, December 2026), as the engine mapping knows them
LLAMACPP_UPSTREAM = dict(ENGINES["llamacpp"].counters)


def _llamacpp_text(state) -> str:
    """llama-server's hand-written /metrics text (HELP/TYPE lines carry the ``_total`` name)."""
    out = []
    for role, value in ((DRAFT_TOKENS, state.draft_tokens), (ACCEPTED, state.accepted), (DRAFTS, state.drafts)):
        name = LLAMACPP_UPSTREAM[role] + "_total"
        out += [f"# HELP {name} Speculative counter", f"# TYPE {name} counter", f"{name} {value}"]
    name = LLAMACPP_UPSTREAM[PER_POSITION] + "_total"
    out += [f"# HELP {name} Accepted tokens per draft position", f"# TYPE {name} counter"]
    out += [f'{name}{{position="{i}"}} {v}' for i, v in enumerate(state.per_position)]
    return "\n".join(out) + "\n"


def _nightly_stats(hist) -> DecodingStats:
    """What the nightly's decoder counts for the same steps (every step proposes K)."""
    st = DecodingStats(num_speculative_tokens=K)
    for j, n in enumerate(hist):
        for _ in range(n):
            st.record_step(K, j, rejected=j < K)
    return st


@pytest.mark.parametrize("fmt", ["vllm", "llamacpp"])
def test_window_per_token_acceptance_equals_the_nightly_estimator(fmt):
    s0 = histogram_state("m", "0", [BEFORE], K, created=1000.0)
    s1 = histogram_state("m", "0", [BEFORE, DURING], K, created=1000.0)
    if fmt == "vllm":
        eng, text = ENGINES["vllm"], (lambda s: render_vllm([s]).decode())
    else:
        eng, text = _llamacpp_engine(), _llamacpp_text
    t0 = dt.datetime(2026, 12, 1, 10, 0, tzinfo=dt.timezone.utc)
    prev = Scrape(t0, parse_exposition(text(s0), eng)[0])
    cur = Scrape(t0 + dt.timedelta(minutes=15), parse_exposition(text(s1), eng)[0])
    [wc] = pool_window(scrape_series(prev, cur, eng), prev.at.timestamp(), cur.at.timestamp()).values()
    g = window_metrics(wc)
    nightly = _nightly_stats(DURING)
    assert g.num_speculative_tokens == K and wc.num_drafts == sum(DURING)
    # the floor's per-token acceptance: the nightly's estimator on the same steps, from the engine's counters
    assert g.per_token_acceptance == pytest.approx(nightly.per_token_acceptance, abs=1e-12)
    assert g.alpha_hat == pytest.approx(nightly.alpha_hat, abs=1e-12)  # and the MLE, from the per-position counters
    assert g.acceptance_rate == pytest.approx(nightly.acceptance_rate, abs=1e-12)
    lo, hi = g.per_token_acceptance_ci
    assert lo < g.per_token_acceptance < hi and hi - lo < 0.1
    # the interval is the window's interval of accepted per draft, mapped through the same function
    per_draft = [x * K for x in g.acceptance_rate_ci]
    assert (lo, hi) == pytest.approx((iid_alpha(per_draft[0], K), iid_alpha(per_draft[1], K)))


def test_iid_alpha_by_hand():
    # k=2: alpha + alpha^2 = 0.75 -> alpha = 0.5; fractional proposal lengths interpolate the last term
    assert iid_alpha(0.75, 2.0) == pytest.approx(0.5, abs=1e-12)
    assert iid_alpha(0.5 + 0.25 + 0.5 * 0.125, 2.5) == pytest.approx(0.5, abs=1e-12)
    assert iid_alpha(3.0, 3.0) == 1.0 and iid_alpha(0.0, 3.0) == 0.0
    assert iid_alpha(1.0, 0.0) != iid_alpha(1.0, 0.0)  # nan without a proposal length
