"""Batched decoding (B > 1): every row must behave exactly as it would alone.

* Greedy: each row of a left-padded batch with mixed prompt lengths equals its own B = 1
  target-only output token for token, and its acceptance counters equal those of its own B = 1
  speculative run (same drafts, same verdicts), for model and n-gram drafters, k in {1, 3, 8},
  with and without an EOS that ends rows at different steps.
* Sampling: rows of two different prompts (different lengths, so one is left-padded) are sampled
  in large batches; each prompt's joint distribution of the first two new tokens is compared
  with the exact enumeration by the same chi-square test and power statement as
  ``tests/core/test_distribution.py`` (alpha 1e-3, power 0.9 at the printed detectable TV).
"""

import numpy as np
import pytest
import torch

from specdec import NgramDrafter, SamplingConfig, autoregressive_generate, speculative_generate
from specdec.core.batch import BatchGenerationResult
from specdec.core.kv import MaskedKV
from tests.support.models import perturbed_copy, tiny_llama
from tests.core.test_distribution import ALPHA, VOCAB, detectable_tv, gof
from specdec.core.sampling import logits_to_probs

GREEDY = SamplingConfig()
LENGTHS = [1, 2, 17, 64, 5, 30]
NEW_TOKENS = 40


@pytest.fixture(scope="module")
def drafters(model_drafts):
    return {**model_drafts, "ngram": NgramDrafter()}


def _prompt(n: int, repetitive: bool) -> list[int]:
    if repetitive:
        return ([10, 11, 12, 13, 14] * (n // 5 + 1))[:n]
    g = torch.Generator().manual_seed(n)
    return torch.randint(7, 103, (n,), generator=g).tolist()


def left_pad(prompts: list[list[int]], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    return ids, mask


# EOS ids that show up mid-output for some rows only (50 for the random prompts, 99 for the
# repetitive ones), so rows stop at different steps and are dropped from the batch
@pytest.mark.parametrize("eos", [None, "mid"])
@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("drafter_name", ["self", "independent", "perturbed", "ngram"])
def test_greedy_rows_equal_their_single_row_runs(target, drafters, drafter_name, k, eos):
    repetitive = drafter_name == "ngram"
    eos = (99 if repetitive else 50) if eos == "mid" else None
    prompts = [_prompt(n, repetitive) for n in LENGTHS]
    ids, mask = left_pad(prompts, pad_id=77)  # a real token id as padding: it must be masked out
    drafter = drafters[drafter_name]
    out = speculative_generate(target, drafter, ids, mask, num_speculative_tokens=k, max_new_tokens=NEW_TOKENS,
                               sampling=GREEDY, eos_token_id=eos)
    assert isinstance(out, BatchGenerationResult) and len(out.rows) == len(prompts)
    pooled_accepted = 0
    for prompt, row in zip(prompts, out.rows):
        x = torch.tensor([prompt])
        ref = autoregressive_generate(target, x, max_new_tokens=NEW_TOKENS, sampling=GREEDY, eos_token_id=eos)
        single = speculative_generate(target, drafter, x, num_speculative_tokens=k, max_new_tokens=NEW_TOKENS,
                                      sampling=GREEDY, eos_token_id=eos)
        assert row.token_ids == ref.token_ids
        assert row.finish_reason == ref.finish_reason
        s, s1 = row.stats, single.stats
        assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens, s.num_rejected_steps) == (
            s1.num_drafts, s1.num_draft_tokens, s1.num_accepted_tokens, s1.num_rejected_steps)
        assert s.accepted_per_position == s1.accepted_per_position
        assert s.drafted_per_position == s1.drafted_per_position
        assert s.target_forward_passes == s1.target_forward_passes
        assert s.num_emitted_tokens == len(row.token_ids) == s1.num_emitted_tokens
        pooled_accepted += s.num_accepted_tokens
    assert out.stats.num_accepted_tokens == pooled_accepted
    assert out.stats.num_emitted_tokens == sum(len(r.token_ids) for r in out.rows)
    if eos is not None:
        assert {r.finish_reason for r in out.rows} == {"eos", "length"}
    if drafter_name == "self":
        assert out.stats.acceptance_rate == 1.0 and out.stats.alpha_hat == 1.0


@pytest.mark.parametrize("eos", [None, 50])
def test_batched_target_only_equals_single_rows(target, eos):
    prompts = [_prompt(n, False) for n in LENGTHS]
    ids, mask = left_pad(prompts)
    out = autoregressive_generate(target, ids, mask, max_new_tokens=NEW_TOKENS, sampling=GREEDY, eos_token_id=eos)
    for prompt, row in zip(prompts, out.rows):
        ref = autoregressive_generate(target, torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, sampling=GREEDY,
                                      eos_token_id=eos)
        assert row.token_ids == ref.token_ids
        assert row.stats.target_forward_passes == len(ref.token_ids)
    assert out.stats.target_seconds > 0


def test_one_padded_row_is_the_single_row_path(target, drafters):
    ids, mask = left_pad([[5, 6, 7, 8], [9, 10]])
    one = speculative_generate(target, drafters["perturbed"], ids[1:], mask[1:], num_speculative_tokens=3,
                               max_new_tokens=12, sampling=GREEDY)
    ref = autoregressive_generate(target, torch.tensor([[9, 10]]), max_new_tokens=12, sampling=GREEDY)
    assert one.token_ids == ref.token_ids


def test_masked_cache_crops_columns_no_row_needs(target):
    kv = MaskedKV(target, 2)
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    kv.forward(ids, torch.ones(2, 4, dtype=torch.bool))
    kv.invalidate_tail(torch.tensor([1, 3]), 3)  # row 0 keeps 1 of the last 3, row 1 keeps 3
    assert kv.mask.tolist() == [[True, True, False, False], [True, True, True, True]]
    assert kv.num_valid.tolist() == [2, 4]
    kv.invalidate_tail(torch.tensor([1, 1]), 3)
    assert kv.cache.get_seq_length() == 2 and kv.mask.shape == (2, 2)


def test_batch_input_validation(target, drafters):
    ids = torch.ones(2, 4, dtype=torch.long)
    right_padded = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    with pytest.raises(ValueError, match="left padding"):
        speculative_generate(target, drafters["self"], ids, right_padded, num_speculative_tokens=2, max_new_tokens=4,
                             sampling=GREEDY)
    with pytest.raises(ValueError, match="empty prompt"):
        autoregressive_generate(target, ids, torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0]]), max_new_tokens=4,
                                sampling=GREEDY)
    with pytest.raises(ValueError, match="shape"):
        autoregressive_generate(target, ids, torch.ones(2, 3), max_new_tokens=4, sampling=GREEDY)
    with pytest.raises(ValueError, match="exceeds the target's context"):
        autoregressive_generate(target, ids, None, max_new_tokens=10_000, sampling=GREEDY)
    with pytest.raises(TypeError, match="drafter must be a transformers causal LM or a Drafter"):
        speculative_generate(target, object(), ids, num_speculative_tokens=2, max_new_tokens=4, sampling=GREEDY)


# ---- sampling: distribution of each row --------------------------------------------------------

PROMPTS = {"long": [1, 2, 3, 1, 2, 3, 1, 2], "short": [3, 1, 2, 3, 1]}  # "short" is left-padded
ROWS_PER_PROMPT = 4000
BATCH_ROWS = 500  # per prompt per batched call, so 8 calls of 1000 rows
CONFIGS = {"t1": SamplingConfig(temperature=1.0), "topp0.8": SamplingConfig(temperature=1.0, top_p=0.8)}


@pytest.fixture(scope="module")
def small_target():
    return tiny_llama(VOCAB, seed=3, hidden_size=16, num_layers=1, init_std=0.3)


@torch.inference_mode()
def exact_joint(model, prompt, sampling) -> np.ndarray:
    x = torch.tensor([prompt])
    p1 = logits_to_probs(model(x).logits[0, -1], sampling).double()
    joint = np.zeros((VOCAB, VOCAB))
    for x1 in range(VOCAB):
        if p1[x1] > 0:
            ctx = torch.cat([x, torch.tensor([[x1]])], dim=1)
            joint[x1] = (p1[x1] * logits_to_probs(model(ctx).logits[0, -1], sampling).double()).numpy()
    return joint / joint.sum()


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("drafter_kind", ["draft_model", "ngram"])
def test_batched_rows_follow_target_distribution(small_target, config, drafter_kind):
    sampling = CONFIGS[config]
    drafter = perturbed_copy(small_target, scale=0.5, seed=4) if drafter_kind == "draft_model" else NgramDrafter()
    prompts = [PROMPTS["long"]] * BATCH_ROWS + [PROMPTS["short"]] * BATCH_ROWS
    ids, mask = left_pad(prompts)
    g = torch.Generator().manual_seed(99)
    counts = {name: np.zeros((VOCAB, VOCAB), dtype=np.int64) for name in PROMPTS}
    drafted = accepted = 0
    for _ in range(ROWS_PER_PROMPT // BATCH_ROWS):
        out = speculative_generate(small_target, drafter, ids, mask, num_speculative_tokens=2, max_new_tokens=4,
                                   sampling=sampling, generator=g)
        for i, row in enumerate(out.rows):
            counts["long" if i < BATCH_ROWS else "short"][row.token_ids[0], row.token_ids[1]] += 1
        drafted += out.stats.num_draft_tokens
        accepted += out.stats.num_accepted_tokens
    # rows must really have accepted different numbers of drafts (holes in the caches)
    assert 0.05 < accepted / drafted < 0.99
    for name, prompt in PROMPTS.items():
        truth = exact_joint(small_target, prompt, sampling)
        pvalue, df = gof(counts[name], truth)
        tv = detectable_tv(ROWS_PER_PROMPT, max(df, 1))
        print(f"\n[gof batch] {drafter_kind} {config} {name}: n={ROWS_PER_PROMPT} df={df} p={pvalue:.3f} "
              f"detectable_tv={tv:.3f} acceptance={accepted / drafted:.3f}")
        assert tv <= 0.06
        assert pvalue > ALPHA


def test_batch_api_returns_batch_results_and_counts_model_calls(target, drafters):
    from specdec import BatchGenerationResult as Exported, speculative_generate_batch

    one = speculative_generate_batch(target, drafters["perturbed"], torch.tensor([[9, 10]]), num_speculative_tokens=3,
                                     max_new_tokens=12, sampling=GREEDY)
    assert isinstance(one, Exported) and one.token_ids == [
        autoregressive_generate(target, torch.tensor([[9, 10]]), max_new_tokens=12, sampling=GREEDY).token_ids]
    prompts = [_prompt(n, False) for n in LENGTHS]
    ids, mask = left_pad(prompts, pad_id=10_000)  # a pad id outside the vocabulary is fine: it is masked
    out = speculative_generate(target, drafters["perturbed"], ids, mask, num_speculative_tokens=3, max_new_tokens=12,
                               sampling=GREEDY)
    # one batched target call per step: as many as the longest-running row took
    assert out.target_calls == max(r.stats.target_forward_passes for r in out.rows)
    assert out.draft_calls == max(r.stats.draft_forward_passes for r in out.rows) > 0


def test_clear_errors_for_unsupported_pairs_and_inputs(target):
    from transformers import MistralConfig, MistralForCausalLM

    small_draft = tiny_llama(50, seed=1)  # the target can emit ids the draft cannot embed
    with pytest.raises(ValueError, match="draft model embeds only 50 ids"):
        speculative_generate(target, small_draft, torch.tensor([[5, 6, 7], [8, 9, 10]]), num_speculative_tokens=2,
                             max_new_tokens=40, sampling=GREEDY)
    with pytest.raises(ValueError, match="draft model embeds only 50 ids"):
        speculative_generate(target, small_draft, torch.tensor([[5, 6, 70]]), num_speculative_tokens=2,
                             max_new_tokens=4, sampling=GREEDY)
    cfg = MistralConfig(vocab_size=103, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2, sliding_window=12)
    sliding = MistralForCausalLM(cfg).eval()
    with pytest.raises(ValueError, match="sliding-window attention"):
        speculative_generate(sliding, sliding, torch.tensor([[5, 6, 7], [8, 9, 10]]), num_speculative_tokens=2,
                             max_new_tokens=4, sampling=GREEDY)
    with pytest.raises(ValueError, match="beyond the window"):
        speculative_generate(sliding, sliding, torch.tensor([[5, 6, 7]]), num_speculative_tokens=2, max_new_tokens=30,
                             sampling=GREEDY)
    with pytest.raises(ValueError, match="integer token ids"):
        autoregressive_generate(target, torch.tensor([[1.0, 2.0]]), max_new_tokens=2, sampling=GREEDY)
    with pytest.raises(ValueError, match="only 0"):
        autoregressive_generate(target, torch.ones(2, 3, dtype=torch.long), torch.tensor([[0, 2, 1], [1, 1, 1]]),
                                max_new_tokens=2, sampling=GREEDY)
    with pytest.raises(ValueError, match="eos_token_id"):
        autoregressive_generate(target, torch.tensor([[5, 6]]), max_new_tokens=2, sampling=GREEDY, eos_token_id="12")
    out = autoregressive_generate(target, torch.tensor([[5, 6]]), max_new_tokens=3, sampling=GREEDY,
                                  eos_token_id=np.int64(2))
    assert out.finish_reason in {"eos", "length"}
