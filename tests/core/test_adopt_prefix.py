"""A bf16 copy of the very target it serves adopts the target's prompt KV (no draft prefill);
outputs stay exactly the target's. A stale derived draft (another target object) and int8/int4
copies keep the ordinary path."""

from __future__ import annotations

import copy

import pytest
import torch

from specdec import SamplingConfig, autoregressive_generate, speculative_generate
from specdec.core.drafters import ModelDrafter
from specdec.models.derived import DerivedDraftRecipe, derive_draft
from tests.support.models import tiny_llama


def _draft_tokens_seen(draft):
    seen = []
    handle = draft.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["input_ids"].shape[1]), with_kwargs=True)
    return seen, handle


@pytest.mark.parametrize("n", [3, 40, 200])
def test_bf16_copy_adopts_target_prefix_and_stays_exact(n):
    target = tiny_llama(103, hidden_size=64, init_std=0.05, seed=2)
    draft = derive_draft(target, DerivedDraftRecipe.from_spec("derived:bf16"))
    ids = torch.randint(7, 103, (1, n), generator=torch.Generator().manual_seed(3))
    kw = dict(max_new_tokens=40, sampling=SamplingConfig(), eos_token_id=None)
    ref = autoregressive_generate(target, ids, **kw)
    seen, h = _draft_tokens_seen(draft)
    out = speculative_generate(target, draft, ids, num_speculative_tokens=4, **kw)
    h.remove()
    assert out.token_ids == ref.token_ids
    assert max(seen) <= 2 and sum(seen) < n + 40  # the draft never ran over the prompt
    assert out.stats.num_drafts > 0 and out.stats.acceptance_rate > 0.8

    # a stale copy (derived from another target object) prefills the prompt itself
    other = copy.deepcopy(target)
    seen, h = _draft_tokens_seen(draft)
    out2 = speculative_generate(other, draft, ids, num_speculative_tokens=4, **kw)
    h.remove()
    assert out2.token_ids == autoregressive_generate(other, ids, **kw).token_ids and max(seen) >= n


def test_int8_copy_keeps_its_own_prefill():
    target = tiny_llama(103, hidden_size=64, init_std=0.05, seed=2)
    draft = derive_draft(target, DerivedDraftRecipe.from_spec("derived:int8"))
    assert not draft.derived_recipe.adopts_target_prefix
    ids = torch.randint(7, 103, (1, 50), generator=torch.Generator().manual_seed(3))
    kw = dict(max_new_tokens=20, sampling=SamplingConfig(), eos_token_id=None)
    seen, h = _draft_tokens_seen(draft)
    out = speculative_generate(target, draft, ids, num_speculative_tokens=4, **kw)
    h.remove()
    assert out.token_ids == autoregressive_generate(target, ids, **kw).token_ids and max(seen) >= 50


def test_adopted_prefix_under_sampling_keeps_the_run_valid():
    target = tiny_llama(103, hidden_size=64, init_std=0.05, seed=2)
    draft = derive_draft(target, DerivedDraftRecipe.from_spec("derived:bf16"))
    ids = torch.randint(7, 103, (1, ModelDrafter.ADOPT_PREFIX_MIN_TOKENS + 5), generator=torch.Generator().manual_seed(4))
    g = torch.Generator().manual_seed(0)
    out = speculative_generate(target, draft, ids, num_speculative_tokens=3, max_new_tokens=30,
                               sampling=SamplingConfig(temperature=0.8), eos_token_id=None, generator=g)
    assert len(out.token_ids) == 30 and out.stats.num_drafts > 0
