"""Stops, limits, input validation and the stats invariants of the decoding loop."""

import math
import pytest
import torch

from specdec import (DecodingStats, NgramDrafter, SamplingConfig, autoregressive_generate,
                     speculative_generate)
from tests.support.models import perturbed_copy, tiny_llama

GREEDY = SamplingConfig()


@pytest.fixture(scope="module")
def target():
    return tiny_llama(103, seed=0)


@pytest.fixture(scope="module")
def draft(target):
    return perturbed_copy(target, scale=0.02, seed=7)


def prompt(n=9, seed=0):
    return torch.randint(7, 103, (1, n), generator=torch.Generator().manual_seed(seed))


def test_eos_accepted_mid_block_ends_generation_there(target):
    ids = prompt()
    ref = autoregressive_generate(target, ids, max_new_tokens=40, sampling=GREEDY).token_ids
    eos = ref[5]  # pretend the 6th greedy token is EOS
    first = ref.index(eos)
    # draft = target: the EOS arrives as an accepted draft in the middle of a block of k=8
    out = speculative_generate(target, target, ids, num_speculative_tokens=8, max_new_tokens=40,
                               sampling=GREEDY, eos_token_id=[999, eos])
    assert out.token_ids == ref[: first + 1]
    assert out.finish_reason == "eos"
    assert out.stats.num_accepted_tokens == first + 1  # nothing after the EOS was counted
    ar = autoregressive_generate(target, ids, max_new_tokens=40, sampling=GREEDY, eos_token_id=eos)
    assert ar.token_ids == out.token_ids and ar.finish_reason == "eos"


@pytest.mark.parametrize("max_new", [0, 1, 2, 3, 5])
@pytest.mark.parametrize("drafter", ["self", "draft", "ngram"])
def test_max_new_tokens_smaller_than_k_is_respected(target, draft, max_new, drafter):
    d = {"self": target, "draft": draft, "ngram": NgramDrafter()}[drafter]
    ids = prompt()
    ref = autoregressive_generate(target, ids, max_new_tokens=max_new, sampling=GREEDY).token_ids
    out = speculative_generate(target, d, ids, num_speculative_tokens=8, max_new_tokens=max_new, sampling=GREEDY)
    assert out.token_ids == ref and len(out.token_ids) == max_new
    s = out.stats
    assert s.num_draft_tokens <= s.num_drafts * max(max_new - 1, 0)  # no step drafts past the budget


def test_sampling_output_never_exceeds_max_new_tokens(target, draft):
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        out = speculative_generate(target, draft, prompt(), num_speculative_tokens=6, max_new_tokens=7,
                                   sampling=SamplingConfig(temperature=1.0), generator=g)
        assert len(out.token_ids) == 7


def test_same_generator_seed_reproduces(target, draft):
    s = SamplingConfig(temperature=0.9, top_p=0.9)
    a = speculative_generate(target, draft, prompt(), num_speculative_tokens=3, max_new_tokens=30, sampling=s,
                             generator=torch.Generator().manual_seed(42))
    b = speculative_generate(target, draft, prompt(), num_speculative_tokens=3, max_new_tokens=30, sampling=s,
                             generator=torch.Generator().manual_seed(42))
    assert a.token_ids == b.token_ids and a.stats.num_accepted_tokens == b.stats.num_accepted_tokens


@pytest.mark.parametrize("sampling", [GREEDY, SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.8, top_k=5)])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_stats_invariants(target, draft, sampling, k):
    out = speculative_generate(target, draft, prompt(20, seed=k), num_speculative_tokens=k, max_new_tokens=50,
                               sampling=sampling, generator=torch.Generator().manual_seed(k))
    s = out.stats
    assert 0.0 <= s.acceptance_rate <= 1.0
    assert 1.0 <= s.mean_accepted_length <= k + 1
    assert len(s.accepted_per_position) == k
    assert all(a >= b for a, b in zip(s.accepted_per_position, s.accepted_per_position[1:]))
    assert all(a <= d for a, d in zip(s.accepted_per_position, s.drafted_per_position))
    assert sum(s.accepted_per_position) == s.num_accepted_tokens
    assert sum(s.drafted_per_position) == s.num_draft_tokens
    assert s.drafted_per_position[0] == s.num_drafts
    # every step proposes k except possibly the last (clipped at max_new_tokens); a step is a
    # rejection unless all its drafts were accepted
    full_k = s.accepted_per_position[-1]
    assert s.num_drafts - full_k - 1 <= s.num_rejected_steps <= s.num_drafts - full_k
    assert s.alpha_hat == s.num_accepted_tokens / (s.num_accepted_tokens + s.num_rejected_steps)
    assert s.num_emitted_tokens == len(out.token_ids) == s.target_forward_passes + s.num_accepted_tokens
    # every draft pass drafts one token; prefill/catch-up share the first pass of a step
    assert s.draft_forward_passes == s.num_draft_tokens
    assert s.target_seconds > 0 and s.draft_seconds > 0
    pooled = s.merge(s)
    assert pooled.acceptance_rate == pytest.approx(s.acceptance_rate)
    assert pooled.num_drafts == 2 * s.num_drafts


def test_input_validation(target, draft):
    with pytest.raises(ValueError, match="left padding"):
        speculative_generate(target, draft, torch.ones(2, 4, dtype=torch.long), torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]]),
                             num_speculative_tokens=2, max_new_tokens=4, sampling=GREEDY)
    with pytest.raises(ValueError, match="shape"):
        speculative_generate(target, draft, torch.ones(4, dtype=torch.long), num_speculative_tokens=2,
                             max_new_tokens=4, sampling=GREEDY)
    with pytest.raises(ValueError, match="empty prompt"):
        autoregressive_generate(target, torch.ones(1, 0, dtype=torch.long), max_new_tokens=4, sampling=GREEDY)
    with pytest.raises(ValueError, match="exceeds the target's context"):
        autoregressive_generate(target, prompt(), max_new_tokens=10_000, sampling=GREEDY)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        speculative_generate(target, draft, prompt(), num_speculative_tokens=0, max_new_tokens=4, sampling=GREEDY)
    with pytest.raises(TypeError, match="drafter"):
        speculative_generate(target, "not a drafter", prompt(), num_speculative_tokens=2, max_new_tokens=4, sampling=GREEDY)


def test_padded_draft_vocabulary_is_exact(target):
    """A draft with extra embedding rows never proposes ids the target lacks; output stays exact."""
    big = tiny_llama(110, seed=0)
    with torch.no_grad():  # same weights on the shared 103 rows, random (high) logits on the pads
        big.model.embed_tokens.weight[:103] = target.model.embed_tokens.weight
        big.lm_head.weight[:103] = target.lm_head.weight
        big.lm_head.weight[103:] = target.lm_head.weight[:7] * 5
        for (n, a), b in zip(big.model.named_parameters(), target.model.parameters()):
            if "embed_tokens" not in n:
                a.copy_(b)
    ids = prompt()
    ref = autoregressive_generate(target, ids, max_new_tokens=30, sampling=GREEDY).token_ids
    out = speculative_generate(target, big, ids, num_speculative_tokens=4, max_new_tokens=30, sampling=GREEDY)
    assert out.token_ids == ref
    g = torch.Generator().manual_seed(0)
    out = speculative_generate(target, big, ids, num_speculative_tokens=4, max_new_tokens=30,
                               sampling=SamplingConfig(temperature=1.0), generator=g)
    assert max(out.token_ids) < 103


def test_stats_definitions():
    s = DecodingStats(num_speculative_tokens=4, num_drafts=10, num_draft_tokens=40, num_accepted_tokens=25,
                      num_rejected_steps=6)
    assert s.acceptance_rate == 0.625
    assert s.alpha_hat == 25 / 31  # i.i.d. MLE: 25 successes, 6 failures
    assert s.merge(s).alpha_hat == 25 / 31
    assert math.isnan(DecodingStats().alpha_hat)
    assert s.mean_accepted_length == 3.5
    assert s.draft_tokens_per_step == 4.0
