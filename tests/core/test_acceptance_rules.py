"""Both acceptance rules (docs/metrics.md "Two acceptance rules") against a brute-force enumeration.

Exact rule: x ~ q, accepted with min(1, p(x)/q(x)) (Leviathan et al. 2022, Alg. 1); argmax rule: x = argmax q,
accepted with p(x) (q one-hot). Per draft position j of a chain started at t the draft is accepted only when
drafts 0..j all were. The enumeration walks every drafted k-tuple with its probability and the verifier's
acceptance test written out in plain Python floats, independently of the tensor formulas under test.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from specdec import SamplingConfig
from specdec.core.sampling import (acceptance_rule_of, argmax_rule_acceptance, exact_rule_acceptance, logits_to_probs,
                                   rule_acceptance)
from specdec.validation.metrics import agreement_sums, chain_sums

T_POS, V, K = 6, 4, 3
SAMPLING = SamplingConfig(temperature=0.7)


def _pq(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (logits_to_probs(torch.randn(T_POS, V, generator=g) * 2, SAMPLING),
            logits_to_probs(torch.randn(T_POS, V, generator=g) * 2, SAMPLING))


def _accept(px: float, qx: float) -> float:
    """The verifier's test for a drawn x: accept with min(1, p(x) / q(x))."""
    return 1.0 if qx <= px else px / qx


def _brute_chain(p: list[list[float]], q: list[list[float]], t: int, n: int, rule: str) -> float:
    """P(drafts 0..n-1 of a chain started at t all accepted), enumerating every drafted n-tuple."""
    total = 0.0
    for xs in itertools.product(range(V), repeat=n):
        if rule == "argmax":
            drafted = [max(range(V), key=lambda v, i=i: (q[t + i][v], -v)) for i in range(n)]
            if list(xs) != drafted:
                continue
            weight, qs = 1.0, [1.0] * n  # x = argmax q is verified with q one-hot on x
        else:
            weight, qs = math.prod(q[t + i][x] for i, x in enumerate(xs)), [q[t + i][x] for i, x in enumerate(xs)]
        total += weight * math.prod(_accept(p[t + i][x], qs[i]) for i, x in enumerate(xs))
    return total


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("rule", ["exact", "argmax"])
def test_both_rules_per_position_equal_the_enumeration(seed, rule):
    p, q = _pq(seed)
    pl, ql = p.double().tolist(), q.double().tolist()
    ag = agreement_sums(p, q, p.log(), q.log(), chain=K)
    for j in range(K):
        windows = range(T_POS - j)
        brute = sum(_brute_chain(pl, ql, t, j + 1, rule) for t in windows) / len(windows)
        assert ag.per_position(rule, K)[j] == pytest.approx(brute, rel=1e-9, abs=1e-12)
    per_token = [_brute_chain(pl, ql, t, 1, rule) for t in range(T_POS)]
    assert rule_acceptance(p, q, rule).tolist() == pytest.approx(per_token, rel=1e-9, abs=1e-12)
    assert ag.mean("alpha" if rule == "exact" else "argmax_rule") == pytest.approx(sum(per_token) / T_POS, rel=1e-9)


def test_the_rules_differ_at_t07_and_neither_dominates():
    p, q = _pq(0)
    exact, by_argmax = exact_rule_acceptance(p, q), argmax_rule_acceptance(p, q)
    assert (exact > by_argmax + 1e-3).any() and (by_argmax > exact + 1e-3).any()


@pytest.mark.parametrize("p, q, exact, by_argmax", [
    ((0.9, 0.1), (0.6, 0.4), 0.7, 0.9),  # the argmax rule counts more
    ((0.6, 0.4), (0.4, 0.6), 0.8, 0.4),  # the exact rule counts more
    ((0.9, 0.1), (0.5, 0.5), 0.6, 0.9),  # the example: a tie in q, argmax takes the first index
])
def test_worked_examples_of_docs_metrics(p, q, exact, by_argmax):
    pt, qt = torch.tensor([p]), torch.tensor([q])
    assert float(exact_rule_acceptance(pt, qt)) == pytest.approx(exact)
    assert float(argmax_rule_acceptance(pt, qt)) == pytest.approx(by_argmax)


def test_greedy_both_rules_are_argmax_agreement():
    g = torch.Generator().manual_seed(3)
    z_p, z_q = torch.randn(T_POS, V, generator=g), torch.randn(T_POS, V, generator=g)
    p, q = logits_to_probs(z_p, SamplingConfig()), logits_to_probs(z_q, SamplingConfig())
    agree = (z_p.argmax(-1) == z_q.argmax(-1)).double()
    assert 0 < agree.sum() < T_POS
    assert exact_rule_acceptance(p, q).tolist() == argmax_rule_acceptance(p, q).tolist() == agree.tolist()


def test_chain_windows_skip_unproposed_positions():
    a = torch.tensor([0.5, math.nan, 0.8, 0.5, 1.0], dtype=torch.float64)
    sums, windows = chain_sums(a, 3)
    assert windows == [4.0, 2.0, 1.0]
    assert sums == pytest.approx([2.8, 0.8 * 0.5 + 0.5 * 1.0, 0.8 * 0.5 * 1.0])
    assert chain_sums(a[:1], 2) == ([0.5, 0.0], [1.0, 0.0])


def test_rule_names():
    assert acceptance_rule_of("sampled") == "exact" and acceptance_rule_of("argmax") == "argmax"
    with pytest.raises(ValueError, match="draft_sampling"):
        acceptance_rule_of("greedy")
    with pytest.raises(ValueError, match="acceptance rule"):
        rule_acceptance(torch.ones(1, 2) / 2, torch.ones(1, 2) / 2, "sampled")
