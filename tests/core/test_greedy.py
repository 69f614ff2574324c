"""Greedy speculative decoding must be token-identical to target-only decoding."""

import pytest
import torch

from specdec import NgramDrafter, SamplingConfig, autoregressive_generate, speculative_generate

PROMPT_LENGTHS = [1, 2, 17, 64]
KS = list(range(1, 9))
NEW_TOKENS = 48
GREEDY = SamplingConfig()


@pytest.fixture(scope="module")
def drafts(model_drafts):
    return model_drafts


def _prompt(n: int, repetitive: bool = False) -> torch.Tensor:
    if repetitive:
        pattern = [10, 11, 12, 13, 14]
        return torch.tensor([(pattern * (n // len(pattern) + 1))[:n]])
    g = torch.Generator().manual_seed(n)
    return torch.randint(7, 103, (1, n), generator=g)


@pytest.fixture(scope="module")
def references(target):
    refs = {}
    for n in PROMPT_LENGTHS:
        for rep in (False, True):
            refs[(n, rep)] = autoregressive_generate(
                target, _prompt(n, rep), max_new_tokens=NEW_TOKENS, sampling=GREEDY
            ).token_ids
    return refs


@pytest.mark.parametrize("prompt_len", PROMPT_LENGTHS)
@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("drafter_name", ["self", "independent", "perturbed", "ngram"])
def test_greedy_equals_target_only(target, drafts, references, prompt_len, k, drafter_name):
    repetitive = drafter_name == "ngram"
    drafter = NgramDrafter() if drafter_name == "ngram" else drafts[drafter_name]
    out = speculative_generate(
        target, drafter, _prompt(prompt_len, repetitive), num_speculative_tokens=k,
        max_new_tokens=NEW_TOKENS, sampling=GREEDY,
    )
    assert out.token_ids == references[(prompt_len, repetitive)]
    s = out.stats
    if drafter_name == "self":
        assert s.acceptance_rate == 1.0
        assert s.accepted_per_position == s.drafted_per_position
        assert s.drafted_per_position[0] == s.num_drafts
    # one target pass per emitted non-draft token: emitted = passes + accepted (no EOS here)
    assert s.num_emitted_tokens == len(out.token_ids) == s.target_forward_passes + s.num_accepted_tokens


def test_perturbed_draft_is_partially_accepted(target, drafts):
    """Guard: the 'perturbed' drafter really exercises both accept and reject paths."""
    out = speculative_generate(target, drafts["perturbed"], _prompt(17), num_speculative_tokens=4,
                               max_new_tokens=NEW_TOKENS, sampling=GREEDY)
    assert 0.1 < out.stats.acceptance_rate < 0.95


def test_ngram_drafter_hits_on_repetitive_prompt(target):
    out = speculative_generate(target, NgramDrafter(), _prompt(64, True), num_speculative_tokens=4,
                               max_new_tokens=NEW_TOKENS, sampling=GREEDY)
    assert out.stats.num_drafts > 0 and out.stats.num_accepted_tokens > 0
