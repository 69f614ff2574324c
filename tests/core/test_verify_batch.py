"""verify_batch (B rows at once) against verify_block (one row), directly.

Deterministic cases (one-hot p and q, stop tokens, padding slots) must agree row by row; random
cases must produce the exact outcome distribution of Leviathan et al. (2022), Alg. 1 for fixed
drafts: P(n = i) = prod_{j<i} a_j (1 - a_i), a_j = min(1, p_j(x_j) / q_j(x_j)); the next token is
drawn from norm(max(0, p_n - q_n)) after a rejection and from p_k after k acceptances. Both are
checked against that formula with a chi-square test (alpha 1e-3; with 40 000 draws the test has
power 0.9 against a total-variation error of about 0.02 on these 20-odd cells).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from specdec.core.sampling import (
    NO_NEXT_TOKEN,
    acceptance_probability,
    residual_distribution,
    verify_batch,
    verify_block,
)

V = 6
ALPHA = 1e-3


def onehot(ids: list[int]) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(ids), V).float()


def block_outcomes(drafts, p, q, stop=frozenset(), generator=None):
    out = verify_block(drafts, p, q, generator, stop)
    return out.num_accepted, out.next_token, out.is_bonus, out.rejected


def batch_outcomes(rows, stop=frozenset(), generator=None):
    """rows: list of (drafts list, p [k_b+1, V], q [k_b, V]); padded to the longest k."""
    k = max(len(d) for d, _, _ in rows)
    B = len(rows)
    tokens = torch.zeros(B, k, dtype=torch.long)
    P = torch.zeros(B, k + 1, V)
    Q = torch.zeros(B, k, V)
    P[:] = 1.0 / V  # padding slots hold any valid distribution
    for b, (d, p, q) in enumerate(rows):
        tokens[b, : len(d)] = torch.tensor(d, dtype=torch.long)
        P[b, : len(d) + 1] = p
        Q[b, : len(d)] = q
    num_drafts = torch.tensor([len(d) for d, _, _ in rows])
    out = verify_batch(tokens, num_drafts, P, Q, generator, stop)
    return list(zip(out.num_accepted.tolist(), out.next_token.tolist(), out.is_bonus.tolist(), out.rejected.tolist()))


def test_one_hot_rows_agree_with_verify_block_row_by_row():
    """Greedy-style rows (no randomness involved): accepted prefix, recovered token, bonus token,
    a row proposing nothing, and rows of different lengths in one batch (padding never accepted)."""
    rows = [
        ([1, 2, 3], onehot([1, 2, 3, 4]), onehot([1, 2, 3])),  # all accepted -> bonus 4
        ([1, 5, 3], onehot([1, 2, 3, 4]), onehot([1, 5, 3])),  # rejected at slot 1 -> recovered 2
        ([0], onehot([5, 1]), onehot([0])),  # rejected at once -> recovered 5
        ([], onehot([3]), torch.zeros(0, V)),  # nothing proposed -> bonus from p_0
        ([2, 2], onehot([2, 2, 0]), onehot([2, 2])),  # shorter row: slot 2 is padding
    ]
    expected = [block_outcomes(d, p, q) for d, p, q in rows]
    assert batch_outcomes(rows) == expected
    assert expected == [(3, 4, True, False), (1, 2, False, True), (0, 5, False, True), (0, 3, True, False), (2, 0, True, False)]


def test_accepted_stop_token_ends_the_row_with_the_named_placeholder():
    stop = frozenset({2})
    rows = [
        ([1, 2, 3], onehot([1, 2, 3, 4]), onehot([1, 2, 3])),  # stop accepted at slot 1: ends there
        ([2, 5], onehot([1, 5, 0]), onehot([2, 5])),  # stop drafted but rejected: recovered 1
        ([1, 3], onehot([1, 3, 2]), onehot([1, 3])),  # bonus is a stop id: a bonus, not the placeholder
    ]
    expected = [block_outcomes(d, p, q, stop) for d, p, q in rows]
    assert batch_outcomes(rows, stop) == expected
    assert expected[0] == (2, NO_NEXT_TOKEN, False, False)
    assert expected[1] == (0, 1, False, True) and expected[2] == (2, 2, True, False)


def _exact(drafts: list[int], p: torch.Tensor, q: torch.Tensor) -> dict[tuple[int, int], float]:
    """P(num_accepted = n, next_token = x) for fixed drafts (Leviathan Alg. 1)."""
    k = len(drafts)
    a = [float(acceptance_probability(p[j, x], q[j, x])) for j, x in enumerate(drafts)]
    out, reach = {}, 1.0
    for n in range(k + 1):
        if n < k:
            dist, mass = residual_distribution(p[n], q[n]), reach * (1 - a[n])
        else:
            dist, mass = p[k], reach
        for x in range(V):
            if mass * float(dist[x]) > 0:
                out[(n, x)] = mass * float(dist[x])
        if n < k:
            reach *= a[n]
    return out


def _chi2_pvalue(samples: list[tuple[int, int]], exact: dict[tuple[int, int], float]) -> float:
    cells = sorted(exact)
    counts = np.array([sum(1 for s in samples if s == c) for c in cells], dtype=float)
    assert counts.sum() == len(samples), "an outcome the exact distribution gives probability 0"
    probs = np.array([exact[c] for c in cells])
    return float(stats.chisquare(counts, probs / probs.sum() * len(samples)).pvalue)


def test_random_rows_follow_the_exact_outcome_distribution_like_verify_block():
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(4, V, generator=gen) * 1.5, dim=-1)
    q = torch.softmax(torch.randn(3, V, generator=gen) * 1.5, dim=-1)
    drafts = [int(torch.multinomial(q[j], 1, generator=gen)) for j in range(3)]
    exact = _exact(drafts, p, q)
    assert abs(sum(exact.values()) - 1) < 1e-6

    n = 40_000
    rng = torch.Generator().manual_seed(1)
    batch = batch_outcomes([(drafts, p, q)] * n, generator=rng)
    rng = torch.Generator().manual_seed(2)
    single = [block_outcomes(drafts, p, q, generator=rng) for _ in range(n)]
    for outcomes in (batch, single):
        assert _chi2_pvalue([(o[0], o[1]) for o in outcomes], exact) > ALPHA
        # the phases are consistent: recovered after a rejection, bonus after k acceptances
        assert all(rej == (acc < 3) and bonus == (acc == 3) for acc, _, bonus, rej in outcomes)


@pytest.mark.parametrize("bad", ["num_drafts", "p", "q"])
def test_inconsistent_shapes_are_refused(bad):
    tokens, num_drafts = torch.zeros(2, 3, dtype=torch.long), torch.tensor([3, 1])
    p, q = torch.full((2, 4, V), 1 / V), torch.full((2, 3, V), 1 / V)
    args = {"num_drafts": num_drafts, "p": p, "q": q}
    args[bad] = {"num_drafts": torch.tensor([3]), "p": p[:, :3], "q": q[:, :2]}[bad]
    with pytest.raises(ValueError, match="need draft_tokens"):
        verify_batch(tokens, args["num_drafts"], args["p"], args["q"])
