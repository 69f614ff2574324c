"""verify_drafts, the one verifier of the loops and the replay: its greedy branch (ids) and its
sampling branch (distributions) agree on one-hot inputs, row by row, with verify_block; and its
argument errors."""

from __future__ import annotations

import pytest
import torch

from specdec.core.sampling import NO_NEXT_TOKEN, verify_block, verify_drafts

V = 7


def _onehot(ids: list[int]) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(ids, dtype=torch.long), V).float()


ROWS = [  # (drafts, target argmax at each drafted slot + the bonus slot)
    ([1, 2, 3], [1, 2, 3, 4]),  # all accepted: bonus 4
    ([1, 5, 3], [1, 2, 3, 4]),  # rejected at slot 1: recovered 2
    ([], [6]),  # nothing proposed: the plain target token
    ([2, 6, 1], [2, 6, 0, 0]),  # stop token 6 accepted: nothing after it
    ([0], [3, 0]),  # rejected at once
]


@pytest.mark.parametrize("stop", [frozenset(), frozenset({6})])
def test_greedy_and_sampling_branches_agree_with_verify_block(stop):
    width = max(len(d) for d, _ in ROWS)
    greedy = verify_drafts([d for d, _ in ROWS], stop, target_argmax=[a for _, a in ROWS])
    p = torch.full((len(ROWS), width + 1, V), 1.0 / V)
    for b, (_, a) in enumerate(ROWS):
        p[b, : len(a)] = _onehot(a)
    g = torch.Generator().manual_seed(0)
    sampled = verify_drafts([d for d, _ in ROWS], stop, p=p, q=None, generator=g)
    for (d, a), x, y in zip(ROWS, greedy, sampled):
        ref = verify_block(d, _onehot(a), _onehot(d).reshape(len(d), V), g, stop)
        assert (x.num_accepted, x.next_token, x.is_bonus) == (ref.num_accepted, ref.next_token, ref.is_bonus)
        assert (y.num_accepted, y.next_token, y.is_bonus) == (ref.num_accepted, ref.next_token, ref.is_bonus)
    assert (greedy[3].next_token == NO_NEXT_TOKEN) == (6 in stop)


def test_argument_errors():
    with pytest.raises(ValueError, match="exactly one"):
        verify_drafts([[1]], frozenset())
    with pytest.raises(ValueError, match="exactly one"):
        verify_drafts([[1]], frozenset(), target_argmax=[[1, 2]], p=torch.ones(1, 2, V) / V)
    with pytest.raises(ValueError, match="target argmax rows"):
        verify_drafts([[1], [2]], frozenset(), target_argmax=[[1, 2]])
    with pytest.raises(ValueError, match="does not cover"):
        verify_drafts([[1, 2]], frozenset(), p=torch.ones(1, 2, V) / V)
