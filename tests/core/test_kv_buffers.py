"""The preallocated KV layers and the native-GQA verification attention change no number (issue 33).

Both only remove copies (the cache's concatenation per pass, ``repeat_kv`` per verification pass); the
logits, the caches and the outputs must stay bitwise those of transformers' own ``DynamicCache`` and
``sdpa`` path.
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from specdec import SamplingConfig, autoregressive_generate, speculative_generate
from specdec.core.attention import NATIVE_GQA, sdpa_native_gqa, wants_native_gqa
from specdec.core.kv import cache_layer_tensors, copy_cache_prefix, crop_cache, growing_layer_class, model_kwargs, new_cache
from tests.support.models import tiny_llama


@pytest.fixture(scope="module")
def model():
    m = tiny_llama(103, seed=0, max_position_embeddings=2048)
    assert m.config.num_key_value_heads < m.config.num_attention_heads  # GQA, as SmolLM2
    return m


def _steps(model, cache, ids, native: bool):
    """prefill 300 (past the first buffer), crop, a verification-like block, crop, single tokens."""
    extra = {NATIVE_GQA: True} if native else {}
    kw = dict(cache=cache, use_cache=True, **extra)
    out = [model(input_ids=ids[:, :300], **kw).logits]
    crop_cache(cache, 290)
    out.append(model(input_ids=ids[:, 290:296], **kw).logits)
    crop_cache(cache, 293)
    for i in range(293, 600):  # grows past the spare capacity
        out.append(model(input_ids=ids[:, i : i + 1], **kw).logits)
    out.append(model(input_ids=ids[:, 600:605], **kw).logits)
    return out


@torch.inference_mode()
def test_growing_cache_and_native_gqa_are_bitwise_transformers(model):
    ids = torch.randint(0, 103, (1, 640), generator=torch.Generator().manual_seed(0))
    ours = new_cache(model)
    assert all(type(layer) is growing_layer_class() for layer in ours.layers)
    a = _steps(model, ours, ids, native=True)
    b = _steps(model, DynamicCache(config=model.config), ids, native=False)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    ref = DynamicCache(config=model.config)
    _steps(model, ref, ids, native=False)
    assert ours.get_seq_length() == ref.get_seq_length() == 605
    for (k1, v1), (k2, v2) in zip(cache_layer_tensors(ours), cache_layer_tensors(ref)):
        assert torch.equal(k1, k2) and torch.equal(v1, v2)
    copy = copy_cache_prefix(ours, model, 100, torch.bfloat16)
    assert copy.get_seq_length() == 100
    assert torch.equal(cache_layer_tensors(copy)[0][0], cache_layer_tensors(ref)[0][0][:, :, :100].bfloat16())


@torch.inference_mode()
def test_growing_cache_batch_select_and_crop_to_zero(model):
    ids = torch.randint(0, 103, (3, 20), generator=torch.Generator().manual_seed(1))
    ours, ref = new_cache(model), DynamicCache(config=model.config)
    for c in (ours, ref):
        model(input_ids=ids, cache=c, use_cache=True)
        c.batch_select_indices(torch.tensor([2, 0]))
    a = model(input_ids=ids[[2, 0], :3], cache=ours, use_cache=True).logits
    b = model(input_ids=ids[[2, 0], :3], cache=ref, use_cache=True).logits
    assert torch.equal(a, b)
    crop_cache(ours, 0)
    assert ours.get_seq_length() == 0
    with pytest.raises(ValueError):
        ours.layers[0].crop(3)


def test_native_gqa_matches_repeated_kv_bitwise():
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        q = torch.randn(1, 9, 5, 64, generator=g).to(dtype)
        k, v = (torch.randn(1, 3, 700, 64, generator=g).to(dtype) for _ in range(2))
        mask = torch.ones(1, 1, 5, 700, dtype=torch.bool).tril(695)
        module = torch.nn.Module()
        module.num_key_value_groups = 3
        module.eval()
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        want, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.125)
        got, _ = sdpa_native_gqa(module, q, k, v, mask, scaling=0.125, **{NATIVE_GQA: True})
        assert torch.equal(got, want), dtype


def test_native_gqa_keyword_only_for_gqa_sdpa_models(model):
    assert wants_native_gqa(model) and model_kwargs(model, None, 1)[NATIVE_GQA] is True
    mha = tiny_llama(103, seed=0)
    mha.config.num_key_value_heads = mha.config.num_attention_heads
    assert not wants_native_gqa(mha)


def test_speculative_output_still_token_identical(model):
    draft = tiny_llama(103, seed=0, max_position_embeddings=2048)
    prompt = torch.randint(3, 103, (1, 400), generator=torch.Generator().manual_seed(2))
    ref = autoregressive_generate(model, prompt, max_new_tokens=40, sampling=SamplingConfig())
    out = speculative_generate(model, draft, prompt, num_speculative_tokens=4, max_new_tokens=40, sampling=SamplingConfig())
    assert out.token_ids == ref.token_ids and out.stats.num_accepted_tokens > 0
