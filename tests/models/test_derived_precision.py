"""Derived drafts by precision: derived:bf16 (a bf16 cast of the target) and derived:fp8 (CUDA only)."""

from __future__ import annotations

import copy

import pytest
import torch

from specdec import SamplingConfig, autoregressive_generate, speculative_generate
from specdec.models.derived import DerivedDraftRecipe, UnsupportedRecipeError, derive_draft, recipe_support
from specdec.kinds import DrafterSpecError, resolve_drafter
from specdec.validation.machine import native_bf16
from tests.support.models import tiny_llama
from tests.support.store import model_store


def test_bf16_recipe_records_dtype_and_int8_dict_is_unchanged():
    r = DerivedDraftRecipe.from_spec("derived:bf16")
    assert (r.kind, r.dtype, r.keep_lm_head_fp32, r.group_size, r.spec) == ("bf16", "bfloat16", False, None, "derived:bf16")
    assert r.to_dict()["dtype"] == "bfloat16" and "to(torch.bfloat16)" in r.method
    assert DerivedDraftRecipe.from_dict(r.to_dict()) == r
    # int8 recipes keep the exact dict (and so the registry's recipe hash) they had before dtype existed
    assert set(DerivedDraftRecipe.from_spec("derived:int8").to_dict()) == {
        "kind", "method", "group_size", "keep_lm_head_fp32", "torchao_version"}
    assert DerivedDraftRecipe.from_dict({"kind": "int8", "keep_lm_head_fp32": True}).keep_lm_head_fp32 is True
    with pytest.raises(ValueError, match="keep_lm_head_fp32 must be False"):
        DerivedDraftRecipe(kind="bf16", keep_lm_head_fp32=True)
    with pytest.raises(ValueError, match="has dtype bfloat16"):
        DerivedDraftRecipe(kind="bf16", dtype="float16")
    with pytest.raises(ValueError, match="int4 only"):
        DerivedDraftRecipe(kind="bf16", group_size=32)
    fp8 = DerivedDraftRecipe.from_spec("derived:fp8")
    assert fp8.dtype == "float8_e4m3fn" and fp8.keep_lm_head_fp32 is True


def test_bf16_draft_is_a_bf16_copy_and_decoding_stays_exact():
    target = tiny_llama(103, hidden_size=64, init_std=0.05)
    before = {n: t.detach().clone() for n, t in target.state_dict().items()}
    draft = derive_draft(target, DerivedDraftRecipe.from_spec("derived:bf16"))
    assert all(p.dtype is torch.bfloat16 for p in draft.parameters())
    assert all(p.dtype is torch.float32 for p in target.parameters())
    assert all(torch.equal(t, before[n]) for n, t in target.state_dict().items())
    assert draft.derived_recipe.kind == "bf16" and not draft.training
    ids = torch.randint(7, 103, (1, 24), generator=torch.Generator().manual_seed(1))
    ref_logits = target(ids).logits
    out = draft(ids).logits
    assert out.dtype is torch.bfloat16 and not torch.equal(out.float(), ref_logits)
    agree = (out.float().argmax(-1) == ref_logits.argmax(-1)).float().mean()
    assert agree >= 0.9, agree
    # exact greedy decoding with the fp32 target, and a draft that mostly agrees
    kw = dict(max_new_tokens=40, sampling=SamplingConfig(), eos_token_id=None)
    ref = autoregressive_generate(target, ids, **kw)
    spec = speculative_generate(target, draft, ids, num_speculative_tokens=4, **kw)
    assert spec.token_ids == ref.token_ids
    assert spec.stats.acceptance_rate > 0.8, spec.stats.acceptance_rate


def test_fp8_refused_on_cpu_with_a_clear_error():
    target = tiny_llama(103, hidden_size=64)
    recipe = DerivedDraftRecipe.from_spec("derived:fp8")
    why = recipe_support(recipe, "cpu")
    assert why is not None and "CUDA" in why and "derived:bf16" in why
    assert recipe_support(DerivedDraftRecipe.from_spec("derived:bf16"), "cpu") is None
    with pytest.raises(UnsupportedRecipeError, match="needs a CUDA GPU"):
        derive_draft(target, recipe)

    class Loaded:  # what resolve_drafter needs of a LoadedModel
        model = target
        tokenizer = None

    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        resolve_drafter("derived:fp8", Loaded(), store=model_store())
    with pytest.raises(DrafterSpecError, match="derived:bf16"):
        resolve_drafter("derived:fp16", Loaded(), store=model_store())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fp8_draft_on_cuda():  # runs on a GPU machine only
    target = copy.deepcopy(tiny_llama(103, hidden_size=64, init_std=0.05)).to("cuda", torch.bfloat16)
    recipe = DerivedDraftRecipe.from_spec("derived:fp8")
    if recipe_support(recipe, "cuda") is not None:
        with pytest.raises(UnsupportedRecipeError):
            derive_draft(target, recipe)
        return
    draft = derive_draft(target, recipe)
    ids = torch.randint(7, 103, (1, 24), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    kw = dict(max_new_tokens=32, sampling=SamplingConfig(), eos_token_id=None)
    assert speculative_generate(target, draft, ids, num_speculative_tokens=4, **kw).token_ids == \
        autoregressive_generate(target, ids, **kw).token_ids


def test_native_bf16_detection_from_flags():
    yes = native_bf16("cpu", flags={"avx2", "avx512f", "avx512_bf16"})
    assert yes["native"] and yes["flags"] == ["avx512_bf16"] and "native bf16" in yes["detail"]
    amx = native_bf16("cpu", flags={"amx_bf16", "amx_tile"})
    assert amx["native"] and amx["flags"] == ["amx_bf16"]
    no = native_bf16("cpu", flags={"avx2", "fma"})
    assert not no["native"] and "emulated" in no["detail"]
    unknown = native_bf16("cpu", flags=set())
    assert not unknown["native"] and "unknown" in unknown["detail"]
