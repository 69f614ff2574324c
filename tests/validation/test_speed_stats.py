"""Paired speedup statistics: pooled ratio of rates, bootstrap CI over prompt pairs, best k with a
measured verification cost."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specdec.validation.metrics import predicted_speedup
from specdec.validation.speed import best_k, bootstrap_speedup_ci, pooled_speedup, predicted_speedup_with_verify


def test_pooled_speedup_is_a_ratio_of_rates():
    assert pooled_speedup([10, 10], [1.0, 3.0], [10, 10], [1.0, 1.0]) == pytest.approx(2.0)
    # sampling: different token counts -> rates, not seconds
    assert pooled_speedup([10], [1.0], [20], [1.0]) == pytest.approx(2.0)
    assert math.isnan(pooled_speedup([], [], [], []))
    assert math.isnan(pooled_speedup([1], [0.0], [1], [1.0]))


def test_bootstrap_ci_covers_the_true_speedup_at_the_stated_rate():
    # 200 simulated nights of 24 prompts: per-prompt times with a true pooled speedup of 1.2 and
    # prompt-level noise; a 95% interval must cover 1.2 in roughly 95% of nights (binomial sd
    # ~1.5%: the check [0.88, 0.99] fails a broken interval, e.g. one ignoring prompt variance).
    rng = np.random.default_rng(7)
    hits = 0
    for night in range(200):
        n = 24
        ref = rng.uniform(0.5, 3.0, n)  # seconds of target-only per prompt (length varies)
        spec = ref / 1.2 * rng.lognormal(0.0, 0.15, n) / math.exp(0.15**2 / 2)
        toks = np.full(n, 32.0)
        lo, hi = bootstrap_speedup_ci(toks, ref, toks, spec, n_resamples=1000, seed=night)
        hits += lo <= 1.2 <= hi
    assert 0.88 <= hits / 200 <= 0.99, hits


def test_bootstrap_ci_edge_cases():
    assert all(math.isnan(x) for x in bootstrap_speedup_ci([1], [1.0], [1], [1.0]))
    with pytest.raises(ValueError, match="one value per prompt"):
        bootstrap_speedup_ci([1, 2], [1.0], [1, 2], [1.0, 1.0])
    lo, hi = bootstrap_speedup_ci([5] * 6, [1.0] * 6, [5] * 6, [2.0] * 6)
    assert lo == pytest.approx(0.5) and hi == pytest.approx(0.5)  # no variance, no width


def test_best_k_with_verify_cost():
    # with v = 1 it is Leviathan's Thm 3.8
    assert predicted_speedup_with_verify(0.8, 0.1, 4, 1.0) == pytest.approx(predicted_speedup(0.8, 0.1, 4))
    # a verification pass that grows with k pushes the best k down
    flat_k, flat_s = best_k(0.95, 0.5, 1.0)
    grow = {k: 1.0 + 0.1 * k for k in range(1, 9)}
    k2, s2 = best_k(0.95, 0.5, grow)
    assert k2 < flat_k and s2 < flat_s
    assert s2 == pytest.approx(max(predicted_speedup_with_verify(0.95, 0.5, k, v) for k, v in grow.items()))
    assert best_k(float("nan"), 0.5, 1.0) == (None, best_k(float("nan"), 0.5, 1.0)[1])


def test_verify_cost_fit_is_a_line():
    from specdec.validation.recommend import smooth_verify_cost

    exact = {k: 1.2 + 0.05 * k for k in range(1, 7)}
    assert smooth_verify_cost(exact) == pytest.approx(exact)
    noisy = {1: 1.71, 2: 1.20, 3: 1.50, 4: 1.37, 5: 1.47, 6: 1.82}
    fit = smooth_verify_cost(noisy)
    b = fit[2] - fit[1]
    assert all(fit[k] == pytest.approx(fit[1] + b * (k - 1)) for k in noisy) and b >= 0
    assert smooth_verify_cost({1: 0.9, 2: 0.95}) == {1: 1.0, 2: 1.0}  # never below one pass
