"""The one speed model (counters + measured c and v(n)) and the paired, robust measured speedup."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specdec.core.stats import DecodingStats
from specdec.validation.speed import (StepCounters, VerifyCost, best_k, bootstrap_speedup_ci, paired_speedup,
                                      pooled_speedup, predicted_speedup, timing_band)


def leviathan(alpha: float, c: float, k: int) -> float:
    """Leviathan et al. 2022, Thm 3.8 (the closed form lives here and in docs/metrics.md only)."""
    e = k + 1 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return e / (c * k + 1)


@pytest.mark.parametrize("alpha, c, k, expected", [
    (0.8, 0.1, 4, 2.4011428571428571),
    (0.5, 0.0, 2, 1.75),  # free draft: E[tokens] = 1 + .5 + .25
    (1.0, 0.5, 3, 4 / 2.5),  # alpha = 1: (k+1)/(ck+1)
    (0.0, 0.2, 3, 1 / 1.6),  # nothing accepted: pure overhead
    (0.6, 1.4, 4, (1 - 0.6**5) / (0.4 * 6.6)),  # slower draft than target: < 1
])
def test_leviathan_is_the_iid_special_case_with_free_verification(alpha, c, k, expected):
    s = predicted_speedup(StepCounters.iid(alpha, k, steps=7.0), c, VerifyCost.unit())
    assert s == pytest.approx(expected, rel=1e-12) and s == pytest.approx(leviathan(alpha, c, k), rel=1e-12)


def test_speedup_counts_the_steps_as_they_ran():
    # an n-gram miss (plain target step), a 4-token proposal with 3 accepted, a 2-token one fully accepted
    v = VerifyCost.fit({1: 1.1, 2: 1.2, 4: 1.4})
    s = predicted_speedup(StepCounters.from_steps([(0, 0), (4, 3), (2, 2)]), 0.1, v)
    assert s == pytest.approx((1 + 4 + 3) / (1.0 + (0.4 + 1.4) + (0.2 + 1.2)))
    # DecodingStats of the same steps (one target pass per step; the miss records no draft) give the same counters
    st = DecodingStats(num_speculative_tokens=4)
    for n, a in [(0, 0), (4, 3), (2, 2)]:
        st.record_step(n, a, a < n)
        st.target_forward_passes += 1
    assert StepCounters.from_stats(st) == StepCounters({0: 1.0, 4: 1.0, 2: 1.0}, 5.0)
    assert math.isnan(predicted_speedup(StepCounters({}, 0.0), 0.1, v))
    assert math.isnan(predicted_speedup(StepCounters({8: 1.0}, 8.0), 0.1, v))  # v(8) not measured: no guess
    tot = StepCounters.from_totals(4, 10, 6)  # 2.5 per step: half the steps at 2, half at 3
    assert tot.steps_by_proposed == {2: 2.0, 3: 2.0} and tot.proposed == 10


def test_verify_cost_curve_keeps_the_measured_points_and_is_never_extrapolated():
    # a CPU's BLAS picks its kernel by row count: a wider pass may cost less, and the curve keeps it
    measured = {1: 1.58, 2: 1.90, 3: 1.35, 4: 1.25, 6: 1.70}
    v = VerifyCost.fit(measured)
    assert v(0) == 1.0
    assert [v(n) for n in (1, 2, 3, 4, 6)] == pytest.approx([1.58, 1.90, 1.35, 1.25, 1.70])
    assert v(5) == pytest.approx((1.25 + 1.70) / 2)  # interpolated between measured points
    assert math.isnan(v(7)) and v.n_max == 6
    assert VerifyCost.fit({1: 0.9, 2: 0.95}).as_list() == [1.0, 1.0, 1.0]  # never below one pass
    # never above n + 1 passes (one token at a time through the cache): a stalled timing is clipped
    stalled = VerifyCost.fit({1: 1.0, 6: 1.04, 7: 1246.5, 8: 1246.5})
    assert stalled.as_list()[-3:] == [pytest.approx(1.04), 8.0, 9.0]
    assert VerifyCost.from_list(v.as_list()).as_list() == pytest.approx(v.as_list())


def test_a_verification_cost_that_grows_with_k_pushes_the_best_k_down():
    by_k = {k: StepCounters.iid(0.95, k) for k in range(1, 9)}
    flat_k, flat_s = best_k(by_k, 0.5, VerifyCost.unit())
    grow = VerifyCost.fit({k: 1.0 + 0.1 * k for k in range(1, 9)})
    k2, s2 = best_k(by_k, 0.5, grow)
    assert k2 < flat_k and s2 < flat_s
    assert s2 == pytest.approx(max(predicted_speedup(c, 0.5, grow) for c in by_k.values()))
    assert best_k(by_k, math.nan, grow) == (None, best_k(by_k, math.nan, grow)[1])


def test_one_slow_round_cannot_decide_the_measured_speedup():
    # six prompts at 1.5x; a co-tenant slows one target-only round 4x (the 3.2 vs 15 tok/s)
    ref, spec, toks = [1.5] * 6, [1.0] * 6, [32] * 6
    ref_loaded = ref[:5] + [6.0]
    assert paired_speedup(toks, ref_loaded, toks, spec) == pytest.approx(1.5)
    assert pooled_speedup(toks, ref_loaded, toks, spec) > 2.0  # the ratio of sums is carried away
    assert math.isnan(paired_speedup([], [], [], []))
    assert timing_band(1.5, 1.5) is False and timing_band(2.05, 1.54) is True and timing_band(math.nan, 1.0) is None


def test_bootstrap_ci_covers_the_true_speedup_at_the_stated_rate():
    # 200 simulated nights of 24 prompts, per-prompt paired ratio with median 1.2 and prompt-level noise;
    # a 95% interval must cover 1.2 in roughly 95% of nights (binomial sd ~1.5%: [0.88, 0.995] fails a
    # broken interval, e.g. one ignoring prompt variance)
    rng = np.random.default_rng(7)
    hits = 0
    for night in range(200):
        n = 24
        ref = rng.uniform(0.5, 3.0, n)
        spec = ref / 1.2 * rng.lognormal(0.0, 0.15, n)
        toks = np.full(n, 32.0)
        lo, hi = bootstrap_speedup_ci(toks, ref, toks, spec, n_resamples=1000, seed=night)
        hits += lo <= 1.2 <= hi
    assert 0.88 <= hits / 200 <= 0.995, hits


def test_bootstrap_ci_edge_cases():
    assert all(math.isnan(x) for x in bootstrap_speedup_ci([1], [1.0], [1], [1.0]))
    with pytest.raises(ValueError, match="one value per prompt"):
        bootstrap_speedup_ci([1, 2], [1.0], [1, 2], [1.0, 1.0])
    lo, hi = bootstrap_speedup_ci([5] * 6, [1.0] * 6, [5] * 6, [2.0] * 6)
    assert lo == pytest.approx(0.5) and hi == pytest.approx(0.5)
