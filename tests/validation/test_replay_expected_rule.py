"""Sampling replay under the engine's proposal rule: per-position acceptance p(argmax q) for
``draft_sampling="argmax"`` (vLLM, SGLang), sum_x min(p, q) for ``"sampled"`` (the forward recursion over
blocks in ``expected_counters`` is the same for both)."""

import pytest
import torch

from specdec import SamplingConfig
from specdec.core.sampling import logits_to_probs
from specdec.validation.replay_expected import position_alphas

SAMPLING = SamplingConfig(temperature=0.7, top_p=0.9)


def _logits(seed: int) -> torch.Tensor:
    return torch.randn(12, 50, generator=torch.Generator().manual_seed(seed)) * 2


def test_argmax_alphas_are_the_target_probability_of_the_drafts_argmax():
    z_p, z_q = _logits(0), _logits(1)
    p, q = logits_to_probs(z_p, SAMPLING), logits_to_probs(z_q, SAMPLING)
    argmax = position_alphas(z_p, z_q, SAMPLING, "argmax")
    sampled = position_alphas(z_p, z_q, SAMPLING, "sampled")
    assert argmax == pytest.approx(p[torch.arange(12), z_q.argmax(dim=-1)].tolist())
    assert sampled == pytest.approx(torch.minimum(p, q).sum(dim=-1).tolist())
    assert argmax != pytest.approx(sampled)
    with pytest.raises(ValueError, match="draft_sampling"):
        position_alphas(z_p, z_q, SAMPLING, "greedy")

