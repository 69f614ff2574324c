"""An EAGLE-3 head as a drafter: exact (greedy identical to target-only, sampling goodness of fit),
drafts only inside its draft vocabulary (q = 0 elsewhere), rollback as the engines do."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec import SamplingConfig, autoregressive_generate, speculative_generate
from specdec.core.head_drafter import Eagle3Drafter
from tests.support.eagle3 import PROMPTS, cached_pair, head_config, random_head, tiny_target

GREEDY = SamplingConfig()


@pytest.fixture(scope="module")
def pair():
    return cached_pair(0)


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_greedy_output_is_the_target_s_own(pair, k):
    target, head = pair
    drafter = Eagle3Drafter(head, head.config.layer_ids_for(4))
    accepted = 0
    for p in PROMPTS:
        ids = torch.tensor([list(p)])
        ref = autoregressive_generate(target, ids, max_new_tokens=30, sampling=GREEDY).token_ids
        out = speculative_generate(target, drafter, ids, num_speculative_tokens=k, max_new_tokens=30, sampling=GREEDY)
        assert out.token_ids == ref
        accepted += out.stats.num_accepted_tokens
        # only the prefill step (no features yet) and a last step with budget 0 draft nothing
        assert out.stats.num_drafts >= out.stats.target_forward_passes - 2
    assert accepted > 0


def _seed_features(drafter, target, prompt):
    """The drafter after the prefill step: the target's features of the prompt's positions."""
    from specdec.core.drafters import TargetFeatures
    from specdec.core.features import target_features

    feats = target_features(target, torch.tensor([list(prompt)]), drafter.target_layer_ids)[1]
    n = torch.tensor([len(prompt)])
    drafter.start([list(prompt)])
    drafter.accept([0], [0], TargetFeatures(feats, n, n))


def test_reduced_vocabulary_head_never_drafts_outside_it_and_stays_exact():
    target = tiny_target(0)
    head = random_head(head_config(target, draft_vocab_size=20), target, seed=2)
    allowed = set(head.t2d.nonzero().flatten().tolist())
    drafter = Eagle3Drafter(head, [1, 2, 4])
    g = torch.Generator().manual_seed(0)
    ref = autoregressive_generate(target, torch.tensor([PROMPTS[0]]), max_new_tokens=20, sampling=GREEDY).token_ids
    for sampling in (GREEDY, SamplingConfig(temperature=1.0)):
        _seed_features(drafter, target, PROMPTS[0])
        prop = drafter.propose([list(PROMPTS[0]) + [ref[0]]], [6], sampling, 103, g)
        assert prop.num_drafts.tolist() == [6] and set(prop.row(0)) <= allowed
        if prop.q is not None:
            assert torch.all(prop.q[0][:, sorted(set(range(103)) - allowed)] == 0)
            assert torch.allclose(prop.q[0].sum(-1), torch.ones(6))
    out = speculative_generate(target, drafter, torch.tensor([PROMPTS[0]]), num_speculative_tokens=4,
                               max_new_tokens=20, sampling=GREEDY)
    assert out.token_ids == ref


def test_accept_keeps_target_fed_entries_and_verified_features(pair):
    from specdec.core.drafters import TargetFeatures

    target, head = pair
    d = Eagle3Drafter(head, [1, 2, 4])
    prompt = list(PROMPTS[0])
    assert d.start([prompt]) is None and d.propose([prompt], [4], GREEDY, 103).num_drafts.tolist() == [0]  # prefill step
    _seed_features(d, target, prompt)
    row = d.rows[0]
    assert d.propose([prompt + [7]], [4], GREEDY, 103).num_drafts.tolist() == [4]
    assert row.cache.length == len(prompt) + 3  # target-fed entries 0..len-1, then 3 draft-chain entries
    fed = torch.zeros(1, 5, 3 * 32)  # the pass fed [7] + 4 drafts; 1 draft accepted: 2 positions verified
    d.accept([1], [9], TargetFeatures(fed, torch.tensor([5]), torch.tensor([2])))
    assert row.cache.length == len(prompt) and row.num_features == len(prompt) + 2


def test_batch_and_single_rows_agree(pair):
    target, head = pair
    drafter = Eagle3Drafter(head, [1, 2, 4])
    prompts = [list(p) for p in PROMPTS[:3]]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    batch = speculative_generate(target, drafter, ids, mask, num_speculative_tokens=3, max_new_tokens=24, sampling=GREEDY)
    for p, row in zip(prompts, batch.rows):
        one = speculative_generate(target, drafter, torch.tensor([p]), num_speculative_tokens=3, max_new_tokens=24,
                                   sampling=GREEDY)
        assert row.token_ids == one.token_ids
        assert row.stats.num_accepted_tokens == one.stats.num_accepted_tokens
        assert row.stats.num_draft_tokens == one.stats.num_draft_tokens


# --- sampling: goodness of fit (as tests/core/test_distribution.py, with an EAGLE-3 head) ---
VOCAB = 8
N_SAMPLES = 4000
PROMPT = torch.tensor([[1, 2, 3, 1, 2, 3, 1, 2]])


@pytest.fixture(scope="module")
def small_pair():
    target = tiny_target(3, vocab_size=VOCAB, hidden_size=16, init_std=0.3)
    head = random_head(head_config(target, draft_vocab_size=6), target, seed=4, std=0.3)
    return target, head


@pytest.mark.parametrize("config,rule", [(SamplingConfig(temperature=1.0), "sampled"),
                                         (SamplingConfig(temperature=0.7, top_k=3), "sampled"),
                                         (SamplingConfig(temperature=0.7, top_p=0.9), "argmax")])  # vLLM's rule
def test_sampling_follows_the_target_distribution(small_pair, config, rule):
    from tests.core.test_distribution import detectable_tv, gof

    target, head = small_pair
    drafter = Eagle3Drafter(head, [1, 2, 4])
    g = torch.Generator().manual_seed(1234)
    counts = np.zeros((VOCAB, VOCAB), dtype=np.int64)
    accepted = drafted = 0
    for _ in range(N_SAMPLES):  # k = 2, 3 new tokens: step 1 is the prefill, step 2 drafts 1 token (budget)
        out = speculative_generate(target, drafter, PROMPT, num_speculative_tokens=2, max_new_tokens=3,
                                   sampling=config, generator=g, draft_sampling=rule)
        counts[out.token_ids[1], out.token_ids[2]] += 1
        accepted += out.stats.num_accepted_tokens
        drafted += out.stats.num_draft_tokens
    truth = _second_and_third(target, config)
    pvalue, df = gof(counts, truth)
    tv = detectable_tv(N_SAMPLES, max(df, 1))
    print(f"\n[gof] eagle3 {config} {rule}: n={N_SAMPLES} df={df} p={pvalue:.3f} detectable_tv={tv:.3f} "
          f"acceptance={accepted / max(drafted, 1):.3f}")
    assert drafted >= N_SAMPLES and accepted >= 50 and accepted / drafted < 0.99
    assert tv <= 0.065
    assert pvalue > 1e-3


@torch.inference_mode()
def _second_and_third(target, sampling) -> np.ndarray:
    """Exact joint of new tokens 2 and 3 (marginal over token 1), enumerated from the target."""
    from specdec.core.sampling import logits_to_probs

    def probs(ctx):
        return logits_to_probs(target(ctx).logits[0, -1], sampling).double()

    joint = np.zeros((VOCAB, VOCAB))
    p1 = probs(PROMPT)
    for x1 in range(VOCAB):
        if p1[x1] == 0:
            continue
        c1 = torch.cat([PROMPT, torch.tensor([[x1]])], dim=1)
        p2 = probs(c1)
        for x2 in range(VOCAB):
            if p2[x2] == 0:
                continue
            joint[x2] += (p1[x1] * p2[x2] * probs(torch.cat([c1, torch.tensor([[x2]])], dim=1))).numpy()
    return joint / joint.sum()
