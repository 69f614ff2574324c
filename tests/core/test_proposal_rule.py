"""The engine's proposal rule (``draft_sampling``) and the draft-length policy
(``assistant_confidence_threshold``) keep speculative sampling exact.

Goodness of fit as ``tests/core/test_distribution.py`` (same tiny vocab-8 target, same chi-square
test with pooled cells, alpha 1e-3, power 0.9 at the printed detectable TV, asserted <= 0.06):
the joint distribution of the first two new tokens under the argmax rule at temperature 0.7,
top-p 0.9 (vLLM's rule: the draft's argmax verified with one-hot q), alone and with a confidence
threshold, at B = 1 and in batches. The acceptance of the first draft is checked against its
exact value, p(argmax q) under the argmax rule and sum_x min(p, q) under the sampled rule, so
the two rules are shown to measure different quantities. The config codec keeps old dicts.
"""

import numpy as np
import pytest
import torch

from specdec import SamplingConfig, SpeculativeConfig, speculative_generate
from specdec.core.sampling import logits_to_probs
from tests.core.test_distribution import N_SAMPLES, PROMPT, VOCAB, detectable_tv, exact_joint, gof
from tests.support.models import perturbed_copy, tiny_llama

SAMPLING = SamplingConfig(temperature=0.7, top_p=0.9)
ALPHA = 1e-3
BATCH = 500


@pytest.fixture(scope="module")
def target():
    """Flatter than test_distribution's target, so that p(argmax q) (0.41 at the first position)
    and sum_x min(p, q) (0.79) differ widely."""
    return tiny_llama(VOCAB, seed=3, hidden_size=16, num_layers=1, init_std=0.1)


@pytest.fixture(scope="module")
def draft(target):
    return perturbed_copy(target, scale=0.3, seed=5)


def _sample_joint(target, draft, k, batched, **rule):
    g = torch.Generator().manual_seed(99)
    counts = np.zeros((VOCAB, VOCAB), dtype=np.int64)
    accepted = drafted = 0
    runs = [(PROMPT.repeat(BATCH, 1), None)] * (N_SAMPLES // BATCH) if batched else [(PROMPT, None)] * N_SAMPLES
    for ids, mask in runs:
        out = speculative_generate(target, draft, ids, mask, num_speculative_tokens=k, max_new_tokens=k + 1,
                                   sampling=SAMPLING, generator=g, **rule)
        for row in (out.rows if batched else [out]):
            counts[row.token_ids[0], row.token_ids[1]] += 1
        accepted += out.stats.num_accepted_tokens
        drafted += out.stats.num_draft_tokens
    return counts, accepted, drafted


@pytest.mark.parametrize("tau", [None, 0.6])  # 0.6: above the first draft's confidence (0.55)
@pytest.mark.parametrize("k,batched", [(1, False), (2, False), (2, True)])
def test_argmax_rule_follows_target_distribution(target, draft, k, batched, tau):
    truth = exact_joint(target, SAMPLING)
    counts, accepted, drafted = _sample_joint(target, draft, k, batched, draft_sampling="argmax",
                                              assistant_confidence_threshold=tau)
    pvalue, df = gof(counts, truth)
    tv = detectable_tv(N_SAMPLES, max(df, 1))
    print(f"\n[gof argmax] k={k} batched={batched} tau={tau}: n={N_SAMPLES} df={df} p={pvalue:.3f} "
          f"detectable_tv={tv:.3f} acceptance={accepted / max(drafted, 1):.3f}")
    assert drafted >= N_SAMPLES and accepted >= 50 and accepted / drafted < 0.99
    assert (drafted < k * N_SAMPLES) == (tau is not None and k > 1)  # the threshold shortens blocks
    assert tv <= 0.06
    assert pvalue > ALPHA


@torch.inference_mode()
@pytest.mark.parametrize("rule", ["argmax", "sampled"])
def test_first_draft_acceptance_is_the_rules_expectation(target, draft, rule):
    p = logits_to_probs(target(PROMPT).logits[0, -1], SAMPLING).double()
    q = logits_to_probs(draft(PROMPT).logits[0, -1], SAMPLING).double()
    expected = float(p[int(q.argmax())]) if rule == "argmax" else float(torch.minimum(p, q).sum())
    other = float(torch.minimum(p, q).sum()) if rule == "argmax" else float(p[int(q.argmax())])
    _, accepted, drafted = _sample_joint(target, draft, 1, True, draft_sampling=rule)
    rate, se = accepted / drafted, (expected * (1 - expected) / drafted) ** 0.5
    print(f"\n[acceptance {rule}] measured {rate:.4f} expected {expected:.4f} (other rule {other:.4f}, se {se:.4f})")
    assert abs(rate - expected) < 4 * se  # |z| < 4: false alarm ~6e-5
    assert abs(other - expected) > 8 * se  # the two rules are told apart at this n


def test_config_codec_keeps_old_dicts_and_round_trips():
    old = SpeculativeConfig(3, SAMPLING, 64)
    assert set(old.to_dict()) == {"num_speculative_tokens", "temperature", "top_k", "top_p", "max_new_tokens"}
    assert SpeculativeConfig.from_dict(old.to_dict()) == old and SpeculativeConfig.from_tags(old.to_tags()) == old
    new = SpeculativeConfig(3, SAMPLING, 64, draft_sampling="argmax", assistant_confidence_threshold=0.3)
    assert new.sha256() != old.sha256()
    assert SpeculativeConfig.from_dict(new.to_dict()) == new and SpeculativeConfig.from_tags(new.to_tags()) == new
    with pytest.raises(ValueError, match="draft_sampling"):
        SpeculativeConfig(3, SAMPLING, 64, draft_sampling="greedy")
    with pytest.raises(ValueError, match="assistant_confidence_threshold"):
        SpeculativeConfig(3, SAMPLING, 64, assistant_confidence_threshold=1.5)
