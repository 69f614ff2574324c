"""Target features: layer id i = the residual stream entering decoder layer i (vLLM, speculators).

Checked against a hand-written hook on the decoder layers and against transformers'
``output_hidden_states``: equal for i < L; for i = L transformers returns the final-normed state, the
feature is the pre-norm one (vLLM appends ``hidden_states + residual`` before the final norm).
"""

from __future__ import annotations

import pytest
import torch

from specdec.core.features import capture_features, target_features
from specdec.core.kv import forward_tokens, new_cache
from tests.support.eagle3 import tiny_target

IDS = torch.tensor([[5, 17, 33, 8, 91, 4, 60]])


@pytest.fixture(scope="module")
def target():
    return tiny_target(0)


def _manual(target, ids):
    """Inputs of every decoder layer and the output of the last one, by a plain hook."""
    seen = []
    layers = target.model.layers
    hs = [layer.register_forward_hook(lambda m, a, kw, out: seen.append(out[0] if isinstance(out, tuple) else out), with_kwargs=True)
          for layer in layers]
    with torch.no_grad():
        emb = target.get_input_embeddings()(ids)
        out = target(input_ids=ids, output_hidden_states=True, use_cache=False)
    for h in hs:
        h.remove()
    return [emb] + seen, out.hidden_states


def test_layer_ids_mean_the_stream_entering_that_layer(target):
    L = target.config.num_hidden_layers
    manual, hf = _manual(target, IDS)
    _, feats = target_features(target, IDS, list(range(L + 1)))
    per_layer = feats.split(target.config.hidden_size, dim=-1)
    for i in range(L + 1):
        assert torch.equal(per_layer[i], manual[i]), i
    for i in range(L):
        assert torch.allclose(per_layer[i], hf[i], atol=1e-6), i
    # transformers' last hidden state is after the final norm; the head's id L is before it
    assert torch.allclose(hf[L], target.model.norm(manual[L]), atol=1e-6)
    assert not torch.allclose(per_layer[L], hf[L], atol=1e-3)


def test_features_in_the_order_of_the_ids_and_out_of_range_refused(target):
    _, a = target_features(target, IDS, [4, 1])
    _, b = target_features(target, IDS, [1, 4])
    H = target.config.hidden_size
    assert torch.equal(a[..., :H], b[..., H:]) and torch.equal(a[..., H:], b[..., :H])
    with pytest.raises(ValueError, match="layer id 5 is outside"):
        target_features(target, IDS, [1, 5])


def test_incremental_passes_with_a_cache_give_the_full_pass_features(target):
    _, full = target_features(target, IDS, [1, 2, 4])
    cache = new_cache(target)
    with capture_features(target, [1, 2, 4]) as got:
        forward_tokens(target, IDS[0, :4].tolist(), cache, logits_to_keep=1)
        forward_tokens(target, IDS[0, 4:].tolist(), cache, logits_to_keep=1)
    assert torch.allclose(torch.cat([g[0] for g in got]), full[0], atol=1e-4)
    assert not target.model.layers[0]._forward_pre_hooks  # hooks removed after the block
