"""Small input edges (issue 25, item 7): draft ids are checked up front, tiny temperatures get
vLLM's answer (any 0 < T < 1e-2 is raised to 1e-2, vllm/sampling_params.py __post_init__) instead of NaN
and a torch error."""

from __future__ import annotations

import math

import pytest
import torch

from specdec import SamplingConfig, autoregressive_generate, speculative_generate
from specdec.core.config import MIN_TEMPERATURE
from specdec.core.sampling import logits_to_probs, verify_batch, verify_block, verify_greedy
from tests.support.models import perturbed_copy, tiny_llama

V = 11


def _pq(k: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.rand(k + 1, V, generator=g).softmax(-1), torch.rand(k, V, generator=g).softmax(-1)


@pytest.mark.parametrize("bad", [-1, V, V + 7])
def test_verify_block_refuses_draft_ids_outside_the_vocabulary(bad):
    """Before: -1 wrapped to the last vocabulary entry and was verified as that token."""
    p, q = _pq(3)
    with pytest.raises(ValueError, match=rf"draft token 1 is id {bad}, outside the vocabulary \[0, {V}\)"):
        verify_block([2, bad, 4], p, q, torch.Generator().manual_seed(1))


def test_minus_one_is_named_as_vllms_placeholder_and_the_batch_path_refuses_it_too():
    with pytest.raises(ValueError, match="placeholder"):
        verify_block([-1], *_pq(1))
    # verify_greedy compares ids and indexes nothing: a negative id is a draft that never matches
    # (replay uses -2 as "no proposal"), so it is not refused there
    assert verify_greedy([-2, 3], [3, 3, 3]).num_accepted == 0
    p, q = _pq(2)
    with pytest.raises(ValueError, match="draft_tokens holds token id -1"):
        verify_batch(torch.tensor([[1, -1]]), torch.tensor([2]), p[None], q[None], torch.Generator().manual_seed(0))


def test_a_valid_block_is_unchanged():
    p, q = _pq(3)
    out = verify_block([2, 3, 4], p, q, torch.Generator().manual_seed(1))
    assert 0 <= out.num_accepted <= 3


@pytest.mark.parametrize("t,expect", [(1e-38, MIN_TEMPERATURE), (5e-324, MIN_TEMPERATURE), (9.9e-6, MIN_TEMPERATURE), (0.0, 0.0),
                                      (1e-3, MIN_TEMPERATURE), (0.01, 0.01), (0.7, 0.7)])
def test_tiny_temperatures_follow_vllm(t, expect):
    if 0 < t < MIN_TEMPERATURE:
        with pytest.warns(UserWarning, match="vLLM"):
            s = SamplingConfig(temperature=t)
    else:
        s = SamplingConfig(temperature=t)
    assert s.temperature == expect and s.is_greedy == (expect == 0.0)
    assert MIN_TEMPERATURE == 1e-2  # vLLM's _MAX_TEMP
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0)) * 30
    probs = logits_to_probs(logits, s)
    assert bool(torch.isfinite(probs).all()) and torch.allclose(probs.sum(-1), torch.ones(4))


def test_speculative_decoding_at_temperature_1e_38_samples_at_1e_2():
    """Before: logits / 1e-38 overflowed to inf, softmax gave NaN, torch.multinomial raised.
    Now it samples at 1e-2 (vLLM's floor): the same tokens as an explicit 1e-2 with the same seed."""
    target = tiny_llama(103, seed=0)
    draft = perturbed_copy(target, scale=0.05)
    ids = torch.tensor([[5, 6, 7, 8]])
    with pytest.warns(UserWarning):
        tiny = SamplingConfig(temperature=1e-38)
    got = speculative_generate(target, draft, ids, num_speculative_tokens=3, max_new_tokens=12, sampling=tiny,
                               generator=torch.Generator().manual_seed(0))
    ref = speculative_generate(target, draft, ids, num_speculative_tokens=3, max_new_tokens=12,
                               sampling=SamplingConfig(temperature=MIN_TEMPERATURE),
                               generator=torch.Generator().manual_seed(0))
    assert got.token_ids == ref.token_ids and not math.isnan(got.stats.acceptance_rate)
