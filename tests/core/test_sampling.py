"""Unit tests of the sampling math (specdec/core/sampling.py) on adversarial (p, q) pairs.

The vectorised check at the end verifies Leviathan's Theorem 3.5 directly: for a draft x ~ q,
accept with min(1, p/q) else resample from norm(max(0, p - q)) gives exactly p.
"""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from specdec.core.sampling import (
    SamplingConfig,
    acceptance_probability,
    logits_to_probs,
    residual_distribution,
    verify_block,
)

V = 6


def onehot(i, n=V):
    t = torch.zeros(n)
    t[i] = 1.0
    return t


ADVERSARIAL = {
    "q_zero_where_p_positive": (torch.tensor([0.5, 0.5, 0, 0, 0, 0.0]), torch.tensor([1.0, 0, 0, 0, 0, 0])),
    "p_equals_q": (torch.full((V,), 1 / V), torch.full((V,), 1 / V)),
    "disjoint_supports": (torch.tensor([0, 0, 0, 0.5, 0.5, 0]), torch.tensor([0.3, 0.7, 0, 0, 0, 0])),
    "one_hot_q": (torch.tensor([0.1, 0.2, 0.3, 0.4, 0, 0]), onehot(3)),
    "one_hot_both_equal": (onehot(2), onehot(2)),
    "one_hot_both_differ": (onehot(2), onehot(4)),
}


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_residual_is_a_distribution_and_respects_target_support(name):
    p, q = ADVERSARIAL[name]
    r = residual_distribution(p, q)
    assert torch.isfinite(r).all()
    assert torch.all(r >= 0)
    assert r.sum().item() == pytest.approx(1.0, abs=1e-6)
    assert torch.all(r[p == 0] == 0), "residual must never give mass to a token the target rules out"
    a = acceptance_probability(p, q)
    assert torch.isfinite(a).all() and torch.all((a >= 0) & (a <= 1))
    assert torch.all(a[p == 0] == 0)


def test_residual_values():
    p, q = ADVERSARIAL["q_zero_where_p_positive"]
    assert residual_distribution(p, q).tolist() == pytest.approx([0, 1, 0, 0, 0, 0])
    p, q = ADVERSARIAL["one_hot_q"]
    assert residual_distribution(p, q).tolist() == pytest.approx([1 / 6, 2 / 6, 3 / 6, 0, 0, 0])
    p, q = ADVERSARIAL["disjoint_supports"]
    assert torch.equal(residual_distribution(p, q), p)  # nothing of q overlaps: the residual is p
    p, q = ADVERSARIAL["p_equals_q"]
    assert torch.allclose(residual_distribution(p, q), p)  # no residual mass: falls back to p
    assert torch.equal(residual_distribution(onehot(2), onehot(4)), onehot(2))


def test_coin_of_exactly_zero_never_accepts_a_zero_probability_token(monkeypatch):
    p = torch.tensor([[0.0, 1.0, 0, 0, 0, 0], [1 / 6] * 6])
    q = onehot(0).unsqueeze(0)
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.tensor(0.0))
    out = verify_block([0], p, q)
    assert out.num_accepted == 0 and out.next_token == 1
    # the same zero coin accepts a token with tiny but positive target probability
    p2 = torch.tensor([[1e-6, 1 - 1e-6, 0, 0, 0, 0], [1 / 6] * 6])
    out = verify_block([0], p2, q)
    assert out.num_accepted == 1 and out.is_bonus


def test_greedy_verify_accepts_matching_prefix_then_target_argmax():
    p = torch.stack([onehot(1), onehot(2), onehot(5), onehot(0)])
    q = torch.stack([onehot(1), onehot(2), onehot(3)])
    out = verify_block([1, 2, 3], p, q)
    assert (out.num_accepted, out.next_token, out.is_bonus) == (2, 5, False)
    out = verify_block([1, 2, 5], p, torch.stack([onehot(1), onehot(2), onehot(5)]))
    assert (out.num_accepted, out.next_token, out.is_bonus) == (3, 0, True)


def test_verify_stops_at_accepted_stop_token():
    p = torch.stack([onehot(1), onehot(2), onehot(5)])
    q = torch.stack([onehot(1), onehot(2)])
    out = verify_block([1, 2], p, q, stop_token_ids=frozenset({1}))
    assert (out.num_accepted, out.next_token) == (1, -1)


def test_logits_to_probs_filters():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0])
    assert logits_to_probs(logits, SamplingConfig()).tolist() == [1, 0, 0, 0, 0]
    pk = logits_to_probs(logits, SamplingConfig(temperature=1.0, top_k=2))
    assert (pk[2:] == 0).all() and pk[:2].sum() == pytest.approx(1)
    full = torch.softmax(logits, -1)
    pp = logits_to_probs(logits, SamplingConfig(temperature=1.0, top_p=0.8))
    # smallest prefix with mass >= 0.8: {0.665, 0.245} -> 0.91
    assert (pp > 0).tolist() == [True, True, False, False, False]
    assert pp[0] / pp[1] == pytest.approx(float(full[0] / full[1]))
    pt = logits_to_probs(logits, SamplingConfig(temperature=0.5))
    assert pt.tolist() == pytest.approx(torch.softmax(logits / 0.5, -1).tolist())
    with pytest.raises(ValueError):
        SamplingConfig(temperature=-1)
    with pytest.raises(ValueError):
        SamplingConfig(temperature=1, top_p=0)
    with pytest.raises(ValueError):
        SamplingConfig(temperature=1, top_k=0)


def test_temperature_to_zero_plus_converges_to_argmax():
    logits = torch.tensor([1.0, 1.2, 0.9, -3.0])
    assert logits_to_probs(logits, SamplingConfig(temperature=1e-3))[1].item() == pytest.approx(1.0)


# --- Theorem 3.5, checked by simulation -------------------------------------------------------
N_SIM = 200_000  # per (p, q) pair; with df <= 5 this detects a TV of 0.006 with power 0.9 at alpha 1e-3


def _simulate(p: torch.Tensor, q: torch.Tensor, n: int, seed: int) -> np.ndarray:
    """Vectorised replay of verify_block for one draft token: x~q, accept w.p. min(1,p/q), else residual."""
    g = torch.Generator().manual_seed(seed)
    x = torch.multinomial(q, n, replacement=True, generator=g)
    accept = torch.rand(n, generator=g) < acceptance_probability(p[x], q[x])
    resid = torch.multinomial(residual_distribution(p, q), n, replacement=True, generator=g)
    out = torch.where(accept, x, resid)
    return np.bincount(out.numpy(), minlength=p.numel())


@pytest.mark.parametrize("name", ["q_zero_where_p_positive", "p_equals_q", "disjoint_supports", "one_hot_q", "random"])
def test_accept_or_resample_reproduces_target_distribution(name):
    if name == "random":
        g = torch.Generator().manual_seed(3)
        p = torch.rand(V, generator=g) ** 3
        p /= p.sum()
        q = torch.rand(V, generator=g)
        q /= q.sum()
    else:
        p, q = ADVERSARIAL[name]
    counts = _simulate(p, q, N_SIM, seed=11)
    support = (p > 0).numpy()
    assert counts[~support].sum() == 0, "a token with p = 0 was emitted"
    if support.sum() == 1:
        return
    p64 = p.double().numpy()[support]
    expected = p64 / p64.sum() * counts[support].sum()
    res = stats.chisquare(counts[support], expected)
    assert res.pvalue > 1e-3, f"{name}: chi-square p={res.pvalue:.2e}"
    # and the acceptance rate equals sum_x min(p, q) (Leviathan Def. 3.1)
    g = torch.Generator().manual_seed(5)
    x = torch.multinomial(q, N_SIM, replacement=True, generator=g)
    acc = (torch.rand(N_SIM, generator=g) < acceptance_probability(p[x], q[x])).float().mean().item()
    alpha = torch.minimum(p, q).sum().item()
    assert acc == pytest.approx(alpha, abs=4 * math.sqrt(max(alpha * (1 - alpha), 1e-9) / N_SIM) + 1e-9)


def test_verify_greedy_is_verify_block_on_one_hot_distributions():
    """The id-only greedy verifier must agree with the general one on one-hot p and q."""
    from specdec.core.sampling import verify_block, verify_greedy

    g = torch.Generator().manual_seed(5)
    V = 6
    for trial in range(300):
        k = int(torch.randint(0, 5, (1,), generator=g))
        drafts = torch.randint(0, V, (k,), generator=g).tolist()
        argmax = torch.randint(0, V, (k + 1,), generator=g).tolist()
        if trial % 3 == 0:  # make long accepted prefixes common
            argmax[:k] = drafts
        stop = frozenset({5}) if trial % 2 else frozenset()
        p = torch.nn.functional.one_hot(torch.tensor(argmax), V).float()
        q = torch.nn.functional.one_hot(torch.tensor(drafts, dtype=torch.long), V).float().reshape(k, V)
        a = verify_block(drafts, p, q, g, stop)
        b = verify_greedy(drafts, argmax, stop)
        assert (a.num_accepted, a.next_token, a.is_bonus) == (b.num_accepted, b.next_token, b.is_bonus)
