"""The bf16 draft's one-row passes run with oneDNN off (ATen's GEMV), every other pass as before."""

from __future__ import annotations

import copy

import pytest
import torch

from specdec import SamplingConfig, autoregressive_generate, speculative_generate
from specdec.models.cpu_kernels import single_row, use_gemv_for_single_row
from specdec.models.derived import DerivedDraftRecipe, derive_draft
from tests.support.models import tiny_llama


def _spy_on_mkldnn(model: torch.nn.Module) -> list[bool]:
    """Record, for every call of the decoder body, whether oneDNN was enabled at that moment."""
    seen: list[bool] = []
    body = model.model
    inner = body.forward

    def forward(*args, **kwargs):
        seen.append(torch.backends.mkldnn.enabled)
        return inner(*args, **kwargs)

    body.forward = forward
    return seen


def test_single_row_detects_one_query_token_over_the_batch():
    assert single_row((), {"input_ids": torch.tensor([[5]])})
    assert single_row((torch.tensor([[5]]),), {})
    assert not single_row((), {"input_ids": torch.tensor([[5, 6]])})
    assert not single_row((), {"input_ids": torch.tensor([[5], [6]])})  # batch of two one-token rows
    assert single_row((), {"inputs_embeds": torch.zeros(1, 1, 8)})
    assert not single_row((), {"inputs_embeds": torch.zeros(1, 3, 8)})


def test_onednn_off_only_for_one_row_calls_and_restored_even_on_error():
    assert torch.backends.mkldnn.enabled
    draft = derive_draft(tiny_llama(103, hidden_size=64), DerivedDraftRecipe.from_spec("derived:bf16"))
    assert draft.single_row_kernel == "aten-gemv"
    twin = copy.deepcopy(draft)  # (before the spy, which is itself an instance attribute)
    seen = _spy_on_mkldnn(draft)
    with torch.no_grad():
        draft(input_ids=torch.tensor([[3]]))
        draft(input_ids=torch.tensor([[3, 4, 5]]))
        draft(torch.tensor([[7]]))
        with pytest.raises(IndexError):
            draft(input_ids=torch.tensor([[10_000]]))  # out of the vocabulary: the forward raises
    assert seen == [False, True, False, False]
    assert torch.backends.mkldnn.enabled  # restored after the failing call too
    # a deep copy keeps the switch and does not call back into the original
    twin_seen = _spy_on_mkldnn(twin)
    with torch.no_grad():
        twin(input_ids=torch.tensor([[3]]))
    assert twin_seen == [False] and len(seen) == 4


def test_refused_for_fp32_models_and_kept_off_fp32_and_int8_drafts():
    with pytest.raises(ValueError, match="bf16 models on the CPU"):
        use_gemv_for_single_row(tiny_llama(103, hidden_size=64))
    target = tiny_llama(103, hidden_size=64)
    assert not hasattr(derive_draft(target, DerivedDraftRecipe.from_spec("derived:int8")), "single_row_kernel")
    assert not hasattr(target, "single_row_kernel")


def test_greedy_output_with_the_gemv_draft_is_identical_to_target_only():
    target = tiny_llama(103, hidden_size=64, init_std=0.05)
    draft = derive_draft(target, DerivedDraftRecipe.from_spec("derived:bf16"))
    kw = dict(max_new_tokens=40, sampling=SamplingConfig(), eos_token_id=None)
    for seed, length in ((1, 1), (2, 9), (3, 33)):
        ids = torch.randint(7, 103, (1, length), generator=torch.Generator().manual_seed(seed))
        ref = autoregressive_generate(target, ids, **kw)
        spec = speculative_generate(target, draft, ids, num_speculative_tokens=4, **kw)
        assert spec.token_ids == ref.token_ids
    assert torch.backends.mkldnn.enabled
