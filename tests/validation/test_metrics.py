"""Validation math against hand-computed values: agreement, bootstrap (the speed model: test_speed_stats.py)."""

from __future__ import annotations

import math

import pytest
import torch

from specdec.validation.metrics import (
    AgreementSums,
    agreement_sums,
    bootstrap_ratio_ci,
    onehot_agreement_sums,
)


def test_agreement_sums_hand_values():
    p = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
    q = torch.tensor([[0.25, 0.25, 0.5], [1.0, 0.0, 0.0]])
    lp = torch.log(torch.tensor([[0.5, 0.4, 0.1], [0.7, 0.2, 0.1]]))
    lq = torch.log(torch.tensor([[0.25, 0.25, 0.5], [0.7, 0.2, 0.1]]))
    s = agreement_sums(p, q, lp, lq)
    assert s.positions == 2
    assert s.alpha == pytest.approx(0.5 + 1.0)  # sum of min(p, q) per row
    assert s.tv == pytest.approx(0.5 + 0.0)  # alpha = 1 - TV row by row
    assert s.top1 == 1.0  # row 0: argmax p = 0, argmax q = 2; row 1 agrees
    kl0 = 0.5 * math.log(0.5 / 0.25) + 0.4 * math.log(0.4 / 0.25) + 0.1 * math.log(0.1 / 0.5)
    assert s.kl == pytest.approx(kl0)
    assert s.mean("alpha") == pytest.approx(0.75) and AgreementSums().mean("alpha") != AgreementSums().mean("alpha")


def test_onehot_agreement_for_ngram_proposals():
    p = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.2, 0.2, 0.6]])
    s = onehot_agreement_sums(p, [0, 2, None])  # third position: no proposal, excluded
    assert s.positions == 2
    assert s.alpha == pytest.approx(0.7 + 0.3) and s.tv == pytest.approx(0.3 + 0.7)
    assert s.top1 == 1.0 and math.isnan(s.kl)
    assert onehot_agreement_sums(p, [None] * 3).positions == 0


def test_bootstrap_pools_counts_and_is_reproducible():
    # five long prompts at rate .9 and twenty short ones at rate .1: the pooled rate is ~.87, far
    # from the mean of per-prompt ratios (.26); the CI must sit around the pooled value
    num = [900.0] * 5 + [1.0] * 20
    den = [1000.0] * 5 + [10.0] * 20
    pooled = sum(num) / sum(den)
    lo, hi = bootstrap_ratio_ci(num, den, seed=1)
    assert lo <= pooled <= hi and lo > 0.5
    assert bootstrap_ratio_ci(num, den, seed=1) == [lo, hi]
    # identical prompts: a zero-width interval at the common ratio
    assert bootstrap_ratio_ci([3, 3, 3], [4, 4, 4]) == pytest.approx([0.75, 0.75])
    assert all(math.isnan(x) for x in bootstrap_ratio_ci([], []))
    assert all(math.isnan(x) for x in bootstrap_ratio_ci([0, 0], [0, 0]))


def test_bootstrap_coverage_on_binomial_data():
    # 40 prompts x 50 Bernoulli(0.7) trials: the 95% interval should contain 0.7 in most of 40
    # independent repetitions (expected ~38; fail only if coverage is grossly wrong)
    g = torch.Generator().manual_seed(0)
    hits = 0
    for rep in range(40):
        x = (torch.rand(40, 50, generator=g) < 0.7).sum(1).double().tolist()
        lo, hi = bootstrap_ratio_ci(x, [50.0] * 40, n_resamples=500, seed=rep)
        hits += lo <= 0.7 <= hi
    assert hits >= 33


def test_a_proportion_ci_never_collapses_to_a_point_at_all_accepted():
    """222 of 222 drafted tokens accepted on 6 prompts: the prompt bootstrap says [1, 1]; the exact
    binomial bound (0.025 ** (1 / 222) = 0.9835) keeps a decoding at 100% comparable with a teacher-forced
    0.986 [0.979, 0.993] (the demo's night 3 was marked a measurement disagreement without it)."""
    from specdec.validation.metrics import bootstrap_ratio_ci, proportion_ci

    boot = bootstrap_ratio_ci([37] * 6, [37] * 6)
    assert boot == [1.0, 1.0]
    lo, hi = proportion_ci(222, 222, boot)
    assert hi == 1.0 and lo == pytest.approx(0.025 ** (1 / 222), abs=1e-9)
    wide = proportion_ci(90, 100, [0.70, 0.97])  # a bootstrap wider than the binomial interval stays
    assert wide == [0.70, 0.97]
    assert proportion_ci(0, 50, [0.0, 0.0])[1] == pytest.approx(1 - 0.025 ** (1 / 50), abs=1e-9)
    assert all(math.isnan(x) for x in proportion_ci(5, 5, [math.nan, math.nan]))  # one prompt: not estimable
