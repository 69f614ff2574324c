"""The TTT unroll computes what the drafting head computes: step ``s`` at position ``i`` equals the head's
incremental forward (verified prefix ``<= i`` in its cache, then ``s`` own-state draft steps)."""

from __future__ import annotations

import pytest
import torch

from specdec.core.features import target_features
from specdec.training.eagle3_ttt import ttt_mask, ttt_states
from tests.support.eagle3 import head_config, random_head, tiny_target


def test_ttt_mask_is_causal_on_step_zero_and_diagonal_after():
    m = ttt_mask(1, 3, 2)[0].int().tolist()
    assert m == [[1, 0, 0, 1, 0, 0, 1, 0, 0],
                 [1, 1, 0, 0, 1, 0, 0, 1, 0],
                 [1, 1, 1, 0, 0, 1, 0, 0, 1]]


@pytest.mark.parametrize("layer_type,flags", [("llama", {}), ("qwen3", {"norm_output": True}),
                                              ("llama", {"norm_before_residual": True})])
def test_unroll_equals_incremental_drafting(layer_type, flags):
    target = tiny_target(0)
    head = random_head(head_config(target, layer_type=layer_type, draft_vocab_size=40, **flags), target, seed=1)
    ids = torch.tensor([[5, 17, 33, 8, 91, 4, 60, 61, 62, 9, 99, 44]])
    _, aux = target_features(target, ids, head.config.layer_ids_for(target.config.num_hidden_layers))
    steps = 3
    with torch.no_grad():
        unrolled = [head.lm_head(n) for _, n in ttt_states(head, ids, aux, steps)]
        for i in (0, 4, 7):
            cache = head.new_cache(1)
            state, logits = head(ids[:, 1:i + 2], head.combine(aux[:, :i + 1]), torch.arange(i + 1)[None], cache)
            state = state[:, -1:]
            torch.testing.assert_close(logits[:, -1], unrolled[0][:, i], rtol=1e-5, atol=1e-5)
            for s in range(1, steps):
                state, logits = head(ids[:, i + 1 + s:i + 2 + s], state, torch.tensor([[i + s]]), cache)
                torch.testing.assert_close(logits[:, 0], unrolled[s][:, i], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("flags", [{}, {"norm_output": True}])
def test_suffix_unroll_equals_the_full_unroll_from_start(flags):
    """Steps >= 1 computed only from ``start`` on give the full unroll's rows there (and gradients)."""
    target = tiny_target(0)
    head = random_head(head_config(target, draft_vocab_size=40, **flags), target, seed=2)
    ids = torch.tensor([[5, 17, 33, 8, 91, 4, 60, 61, 62, 9, 99, 44], [7, 3, 8, 1, 2, 9, 10, 11, 12, 13, 14, 15]])
    _, aux = target_features(target, ids, head.config.layer_ids_for(target.config.num_hidden_layers))
    aux = aux.clone()
    full = [n for _, n in ttt_states(head, ids, aux, 3)]
    part = [n for _, n in ttt_states(head, ids, aux, 3, start=5)]
    torch.testing.assert_close(part[0], full[0], rtol=0, atol=0)
    for s in (1, 2):
        torch.testing.assert_close(part[s][:, 5:], full[s][:, 5:], rtol=1e-5, atol=1e-5)
        assert not part[s][:, :5].any()
    mask = torch.zeros(2, 12, dtype=torch.bool)
    mask[:, 8:] = True
    logits = torch.randn(2, 12, 40)
    from specdec.training.eagle3_ttt import ttt_unroll
    a = ttt_unroll(head, ids, aux, logits, mask)  # start = 8 - 3 = 5 inside
    grads_a = torch.autograd.grad(a.loss, head.fc.weight)[0]
    b = sum(torch.nn.functional.kl_div(torch.log_softmax(head.lm_head(n[:, :11 - s][mask[:, 1 + s:12]]), -1),
                                       torch.log_softmax(logits[:, 1 + s:12][mask[:, 1 + s:12]], -1),
                                       log_target=True, reduction="batchmean") for s, n in enumerate(full))
    grads_b = torch.autograd.grad(b, head.fc.weight)[0]
    torch.testing.assert_close(a.loss, b, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads_a, grads_b, rtol=1e-4, atol=1e-6)
