"""Static-buffer passes (specdec.core.static): token-identical to eager ones on this CPU, exact speculative
decoding through them, rollback by moving the end, one live cache per model, and the folded finiteness check."""

from __future__ import annotations

import pytest
import torch

from specdec import NgramDrafter, SamplingConfig, autoregressive_generate, speculative_generate
from specdec.core.finite import NonFiniteLogits
from specdec.core.kv import crop_cache, forward_tokens, new_cache
from specdec.core.static import StaticKV, passes_of, use_passes
from specdec.models.derived import DerivedDraftRecipe, derive_draft
from specdec.models.layerskip import LayerSkipRecipe, derive_layerskip
from tests.support.models import tiny_llama

GREEDY = SamplingConfig(temperature=0.0)
PROMPTS = [[1, 10, 11, 12, 13], [1, 40, 41, 40, 41, 40], [1, 7]]


def _target(seed=0, layers=4):
    return tiny_llama(103, seed=seed, hidden_size=64, num_layers=layers).eval()


def _drafters(target):
    return {
        "model": lambda: tiny_llama(103, seed=5, hidden_size=64).eval(),
        "ngram": lambda: NgramDrafter(min_ngram=1),
        "bf16": lambda: derive_draft(target, DerivedDraftRecipe(kind="bf16")),
        "layerskip": lambda: derive_layerskip(target, LayerSkipRecipe(num_layers=2)),
    }


def _run(target, make, static: bool):
    use_passes(target, "static" if static else "eager", max_len=96)
    out = []
    for p in PROMPTS:
        ids = torch.tensor([p])
        ref = autoregressive_generate(target, ids, max_new_tokens=24, sampling=GREEDY).token_ids
        drafter = make()
        if static and isinstance(drafter, torch.nn.Module):
            use_passes(drafter, "static", max_len=96)
        spec = speculative_generate(target, drafter, ids, num_speculative_tokens=3, max_new_tokens=24,
                                    sampling=GREEDY).token_ids
        out.append((ref, spec))
    return out


@pytest.mark.parametrize("kind", ["model", "ngram", "bf16", "layerskip"])
def test_static_passes_token_identical_to_eager(kind):
    target = _target()
    make = _drafters(target)[kind]
    eager = _run(target, make, static=False)
    static = _run(target, make, static=True)
    assert static == eager
    for ref, spec in static:  # exact: speculative == target-only through the same passes
        assert spec == ref and len(ref) == 24
    assert passes_of(target).uncaptured > 0  # the static path really ran


def test_static_cache_rollback_equals_fresh_forward():
    target = use_passes(_target(), "static", max_len=64)
    cache = new_cache(target, static=True)
    assert isinstance(cache, StaticKV)
    forward_tokens(target, [5, 6, 7, 8, 9], cache)
    crop_cache(cache, 3)
    assert cache.get_seq_length() == 3
    a = forward_tokens(target, [20, 21], cache)[-1]
    use_passes(target, "eager")
    b = forward_tokens(target, [5, 6, 7, 20, 21], new_cache(target))[-1]
    assert torch.allclose(a, b, atol=1e-5)


def test_one_live_cache_per_model_and_length_limit():
    target = use_passes(_target(), "static", max_len=16)
    old = new_cache(target, static=True)
    new_cache(target, static=True)
    with pytest.raises(RuntimeError, match="superseded"):
        forward_tokens(target, [5, 6], old)
    assert not isinstance(new_cache(target, static=True, need=17), StaticKV)  # does not fit: a dynamic cache
    with pytest.raises(ValueError, match="holds 16 positions"):
        forward_tokens(target, list(range(3, 20)), new_cache(target, static=True))


def test_graphs_need_cuda_and_modes_are_checked():
    target = _target()
    with pytest.raises(ValueError, match="needs CUDA"):
        use_passes(target, "graphs")
    with pytest.raises(ValueError, match="unknown passes"):
        use_passes(target, "fast")


def test_derived_copy_of_a_static_target_starts_eager():
    target = use_passes(_target(), "static", max_len=32)
    assert passes_of(derive_draft(target, DerivedDraftRecipe(kind="bf16"))) is None


@pytest.mark.parametrize("static", [False, True])
def test_folded_finiteness_check_still_names_the_broken_model(static):
    target = use_passes(_target(), "static" if static else "eager", max_len=64)
    with torch.no_grad():
        target.lm_head.weight[3].fill_(float("nan"))
    with pytest.raises(NonFiniteLogits) as e:
        autoregressive_generate(target, torch.tensor([PROMPTS[0]]), max_new_tokens=4, sampling=GREEDY)
    assert e.value.model is target and e.value.position == len(PROMPTS[0])
    draft = tiny_llama(103, seed=5, hidden_size=64).eval()
    with torch.no_grad():
        draft.lm_head.weight[3].fill_(float("nan"))
    with pytest.raises(NonFiniteLogits) as e:
        speculative_generate(_target(seed=1), draft, torch.tensor([PROMPTS[0]]), num_speculative_tokens=3,
                             max_new_tokens=8, sampling=GREEDY)
    assert e.value.model is draft
