"""End-to-end goodness of fit: speculative sampling reproduces the target's exact distribution.

Target: a tiny random Llama with vocab 8. The exact joint distribution of the first two new tokens
is enumerated from the target (8 + 8*8 forward passes). ``speculative_generate`` is then run
``N_SAMPLES`` times per configuration and a chi-square test compares the observed joint counts with
the enumeration (cells with expected count < 5 are pooled into one cell).

Power statement: for any alternative at total-variation distance >= delta from the truth, the
chi-square noncentrality is >= 4 * N * delta**2 (Cauchy-Schwarz). With the test's df and
alpha = 1e-3, ``detectable_tv`` below is the smallest delta detected with power 0.9; each test
asserts it is <= 0.06 and prints it with the p-value (see the closing note for the numbers).
"""

import math

import numpy as np
import pytest
import torch
from scipy import optimize, stats

from specdec import NgramDrafter, SamplingConfig, speculative_generate
from specdec.core.sampling import logits_to_probs
from tests.support.models import perturbed_copy, tiny_llama

VOCAB = 8
N_SAMPLES = 4000
ALPHA = 1e-3
POWER = 0.9
PROMPT = torch.tensor([[1, 2, 3, 1, 2, 3, 1, 2]])  # repetitive, so the n-gram drafter proposes

CONFIGS = {
    "t1": SamplingConfig(temperature=1.0),
    "t0.7_topk3": SamplingConfig(temperature=0.7, top_k=3),
    "topp0.8": SamplingConfig(temperature=1.0, top_p=0.8),
}


def detectable_tv(n: int, df: int) -> float:
    crit = stats.chi2.ppf(1 - ALPHA, df)
    lam = optimize.brentq(lambda lam: stats.ncx2.sf(crit, df, lam) - POWER, 1e-6, 1e6)
    return math.sqrt(lam / (4 * n))


@pytest.fixture(scope="module")
def target():
    return tiny_llama(VOCAB, seed=3, hidden_size=16, num_layers=1, init_std=0.3)


@pytest.fixture(scope="module")
def draft(target):
    return perturbed_copy(target, scale=0.5, seed=4)


@torch.inference_mode()
def exact_joint(target, sampling) -> np.ndarray:
    p1 = logits_to_probs(target(PROMPT).logits[0, -1], sampling).double()
    joint = np.zeros((VOCAB, VOCAB))
    for x1 in range(VOCAB):
        if p1[x1] == 0:
            continue
        ctx = torch.cat([PROMPT, torch.tensor([[x1]])], dim=1)
        p2 = logits_to_probs(target(ctx).logits[0, -1], sampling).double()
        joint[x1] = (p1[x1] * p2).numpy()
    return joint / joint.sum()


def gof(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    counts, probs = counts.ravel(), probs.ravel()
    assert counts[probs == 0].sum() == 0, "emitted a sequence the target gives probability 0"
    n = counts.sum()
    exp = probs * n
    big = exp >= 5
    obs_cells = list(counts[big]) + ([counts[~big & (probs > 0)].sum()] if (~big & (probs > 0)).any() else [])
    exp_cells = list(exp[big]) + ([exp[~big & (probs > 0)].sum()] if (~big & (probs > 0)).any() else [])
    if len(obs_cells) < 2:
        return 1.0, 0
    exp_cells = np.array(exp_cells) / np.sum(exp_cells) * n
    return float(stats.chisquare(obs_cells, exp_cells).pvalue), len(obs_cells) - 1


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("drafter_kind,k", [("draft_model", 1), ("draft_model", 2), ("ngram", 2)])
def test_first_two_tokens_follow_target_distribution(target, draft, config, drafter_kind, k):
    sampling = CONFIGS[config]
    truth = exact_joint(target, sampling)
    drafter = draft if drafter_kind == "draft_model" else NgramDrafter(min_ngram=1)  # 1-token matches: accepted often here
    g = torch.Generator().manual_seed(1234)
    counts = np.zeros((VOCAB, VOCAB), dtype=np.int64)
    accepted = drafted = 0
    for _ in range(N_SAMPLES):
        out = speculative_generate(target, drafter, PROMPT, num_speculative_tokens=k, max_new_tokens=k + 1,
                                   sampling=sampling, generator=g)
        counts[out.token_ids[0], out.token_ids[1]] += 1
        accepted += out.stats.num_accepted_tokens
        drafted += out.stats.num_draft_tokens
    pvalue, df = gof(counts, truth)
    tv = detectable_tv(N_SAMPLES, max(df, 1))
    empirical_tv = 0.5 * np.abs(counts / N_SAMPLES - truth).sum()
    print(f"\n[gof] {drafter_kind} k={k} {config}: n={N_SAMPLES} df={df} p={pvalue:.3f} "
          f"detectable_tv={tv:.3f} empirical_tv={empirical_tv:.3f} acceptance={accepted / max(drafted, 1):.3f}")
    # the drafter must actually be exercised, or the test proves nothing about rejection sampling
    assert drafted >= N_SAMPLES and accepted >= 50 and accepted / drafted < 0.99
    assert tv <= 0.06
    assert pvalue > ALPHA


def test_gof_has_power_against_a_wrong_sampler(target):
    """Sanity of the test itself: sampling from the *draft*'s distribution must be rejected."""
    sampling = CONFIGS["t1"]
    truth = exact_joint(target, sampling)
    wrong = exact_joint(perturbed_copy(target, scale=0.5, seed=4), sampling)
    tv_wrong = 0.5 * np.abs(truth - wrong).sum()
    rng = np.random.default_rng(0)
    counts = rng.multinomial(N_SAMPLES, wrong.ravel()).reshape(VOCAB, VOCAB)
    pvalue, df = gof(counts, truth)
    assert tv_wrong > detectable_tv(N_SAMPLES, df)
    assert pvalue < ALPHA
