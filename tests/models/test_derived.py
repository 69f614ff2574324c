"""Derived drafts: torchao weight-only quantized copies of the target."""

from __future__ import annotations

import pytest
import torch

from specdec.kinds import kind_of
from specdec.models.derived import DerivedDraftRecipe, derive_draft
from tests.support.models import tiny_llama


def _snapshot(model):
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


def _assert_untouched(model, snap):
    sd = model.state_dict()
    assert sd.keys() == snap.keys()
    for n, t in snap.items():
        assert type(sd[n]) is torch.Tensor or isinstance(sd[n], torch.nn.Parameter), n
        assert torch.equal(sd[n], t), n


def _tied_llama(seed=0):
    from transformers import LlamaForCausalLM

    cfg = tiny_llama(103, hidden_size=64).config
    cfg.tie_word_embeddings = True
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    return model


IDS = torch.randint(7, 103, (1, 48), generator=torch.Generator().manual_seed(0))


def test_recipe_round_trip_and_spec():
    r = DerivedDraftRecipe.from_spec("derived:int4")
    assert (r.kind, r.group_size, r.keep_lm_head_fp32, r.spec) == ("int4", 32, True, "derived:int4")
    assert "IntxWeightOnlyConfig" in r.method and r.torchao_version.startswith("0.")
    assert DerivedDraftRecipe.from_dict(r.to_dict()) == r
    assert DerivedDraftRecipe.from_dict({**r.to_dict(), "future_field": 1}) == r
    r8 = DerivedDraftRecipe.from_spec("int8")
    assert r8.group_size is None and "Int8WeightOnlyConfig" in r8.method
    assert kind_of("derived:int8").derives_from_target and not kind_of("ngram").derives_from_target
    for bad in ("derived:int3", "ngram"):
        with pytest.raises(ValueError, match="derived"):
            DerivedDraftRecipe.from_spec(bad)
    with pytest.raises(ValueError, match="unknown derived draft kind"):
        DerivedDraftRecipe(kind="fp16")


def test_int8_draft_close_to_target_and_target_untouched():
    target = tiny_llama(103, hidden_size=64, init_std=0.05)
    snap = _snapshot(target)
    ref = target(IDS).logits
    draft = derive_draft(target, DerivedDraftRecipe.from_spec("derived:int8"))
    _assert_untouched(target, snap)
    assert torch.equal(target(IDS).logits, ref)
    assert draft.derived_recipe.kind == "int8" and not draft.training
    q = draft.model.layers[0].self_attn.q_proj.weight
    assert type(q).__name__ == "Int8Tensor"
    assert type(draft.lm_head.weight) is torch.nn.Parameter and draft.lm_head.weight.dtype is torch.float32
    assert torch.equal(draft.lm_head.weight, target.lm_head.weight)
    out = draft(IDS).logits
    assert not torch.equal(out, ref)  # really quantized
    rel = (out - ref).abs().max() / ref.abs().max()
    assert rel < 0.05, rel
    agree = (out.argmax(-1) == ref.argmax(-1)).float().mean()
    assert agree >= 0.9, agree


def test_int4_draft_on_tied_embeddings():
    target = _tied_llama()
    snap = _snapshot(target)
    ref = target(IDS).logits
    draft = derive_draft(target, DerivedDraftRecipe.from_spec("derived:int4"))
    _assert_untouched(target, snap)
    assert target.lm_head.weight is target.model.embed_tokens.weight
    # the copy keeps its own tie, in fp32, not shared with the target
    assert draft.lm_head.weight is draft.model.embed_tokens.weight
    assert draft.lm_head.weight.data_ptr() != target.lm_head.weight.data_ptr()
    assert type(draft.lm_head.weight) is torch.nn.Parameter
    assert type(draft.model.layers[1].mlp.down_proj.weight).__name__ == "IntxUnpackedToInt8Tensor"
    out = draft(IDS).logits
    assert out.shape == ref.shape and torch.isfinite(out).all() and not torch.equal(out, ref)
    assert torch.equal(target(IDS).logits, ref)


def test_quantized_head_unties_only_the_copy():
    target = _tied_llama()
    snap = _snapshot(target)
    recipe = DerivedDraftRecipe(kind="int8", keep_lm_head_fp32=False)
    draft = derive_draft(target, recipe)
    _assert_untouched(target, snap)
    assert target.lm_head.weight is target.model.embed_tokens.weight and target.config.tie_word_embeddings
    assert type(draft.lm_head.weight).__name__ == "Int8Tensor"
    assert type(draft.model.embed_tokens.weight) is torch.nn.Parameter
    assert torch.equal(draft.model.embed_tokens.weight, target.model.embed_tokens.weight)


def test_bad_group_size():
    target = tiny_llama(103, hidden_size=64)
    with pytest.raises(ValueError, match="does not divide"):
        derive_draft(target, DerivedDraftRecipe(kind="int4", group_size=48))
