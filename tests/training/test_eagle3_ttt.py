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
