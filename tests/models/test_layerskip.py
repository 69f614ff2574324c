"""The layer-skip draft (specdec.models.layerskip): the target's own first N layers, shared; exact decoding.

Its logits are the target's early exit (LM head over the final norm of the residual stream after layer N);
greedy speculative decoding with it is token-identical to target-only decoding and the validation's greedy
exactness audit (fp32, ``method="both"``: the nightly's, through RecordingDrafter) finds no mismatch.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from specdec import SamplingConfig, autoregressive_generate, speculative_generate
from specdec.kinds import kind_of
from specdec.models.layerskip import LayerSkipRecipe, derive_layerskip
from tests.support.models import tiny_llama, tiny_tokenizer
from tests.support.store import model_store
from tests.validation.heldouts import toy_heldout

GREEDY = SamplingConfig(temperature=0.0)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0, num_layers=4, hidden_size=48)


def test_shares_every_weight_and_is_the_early_exit(target):
    draft = derive_layerskip(target, LayerSkipRecipe(num_layers=2))
    target_ptrs = {p.data_ptr() for p in target.parameters()}
    assert all(p.data_ptr() in target_ptrs for p in draft.parameters())
    assert draft.config.num_hidden_layers == 2 and target.config.num_hidden_layers == 4  # the target untouched
    ids = torch.tensor([[1, 5, 9, 12, 7, 3]])
    with torch.no_grad():
        hidden = target(ids, output_hidden_states=True).hidden_states[2]  # after layer 1, before the final norm
        want = target.lm_head(target.model.norm(hidden))
        got = draft(ids).logits
    assert torch.allclose(got, want, atol=1e-5)


def test_follows_a_fine_tuned_target(target):
    draft = derive_layerskip(target, LayerSkipRecipe(num_layers=1))
    ids = torch.tensor([[1, 5, 9]])
    with torch.no_grad():
        before = draft(ids).logits.clone()
        target.model.layers[0].mlp.down_proj.weight.mul_(1.5)  # a "fine-tune" of a shared layer
        after = draft(ids).logits
        target.model.layers[0].mlp.down_proj.weight.div_(1.5)
    assert not torch.allclose(before, after)


@pytest.mark.parametrize("bad", [0, 4, 7])
def test_bad_layer_counts_are_refused(target, bad):
    with pytest.raises(ValueError, match="num_layers"):
        derive_layerskip(target, LayerSkipRecipe(num_layers=bad))


def test_unsupported_architecture_is_one_clear_error():
    with pytest.raises(ValueError, match="Llama family"):
        derive_layerskip(torch.nn.Linear(2, 2), LayerSkipRecipe(num_layers=1))


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_speculative_output_is_the_targets(target, k):
    draft = derive_layerskip(target, LayerSkipRecipe(num_layers=2))
    for prompt in ([1, 10, 11, 12, 13], [1, 40, 41, 40, 41, 40, 41], [1, 7]):
        ids = torch.tensor([prompt])
        ref = autoregressive_generate(target, ids, max_new_tokens=30, sampling=GREEDY).token_ids
        out = speculative_generate(target, draft, ids, num_speculative_tokens=k, max_new_tokens=30, sampling=GREEDY)
        assert out.token_ids == ref
        assert out.stats.num_draft_tokens > 0 and out.stats.draft_forward_passes > 0


def test_validates_exactly_with_method_both(target, tmp_path):
    from specdec.validation import ValidationConfig, ValidationRequest, validate
    from specdec.validation.continuation_cache import ContinuationCache

    resolved = kind_of("layerskip:2").resolve("layerskip:2", SimpleNamespace(model=target), store=model_store())
    cfg = ValidationConfig(num_speculative_tokens=3, max_new_tokens=16, bootstrap_resamples=200)
    [r] = validate(ValidationRequest(target, [resolved], toy_heldout(8, "abc", (5, 20)), cfg, method="both",
                                     decode_fraction=0.5, tokenizer=tiny_tokenizer(), target_ref="tiny",
                                     cache=ContinuationCache(tmp_path)))
    g = r.overall
    assert r.drafter_kind == "layerskip" and r.drafter_recipe == {"num_layers": 2, "method": LayerSkipRecipe(2).method}
    assert g.exactness_checked > 0 and g.exactness_mismatches == 0 and r.exactness_clean
    assert r.method == "both" and r.replay is not None
