"""Greedy replay == the core's speculative decoding, counter for counter, for k = 1..8 (tiny fp32 models).

Ground truth is :func:`specdec.speculative_generate` itself. Prompts of length 1..64, stop tokens
that land inside blocks (accepted mid-block, drafted after a rejection, drafted and rejected),
and max_new_tokens stops. A deliberately wrong replay (teacher-forced logits read one
position late, or a plain first step that decoding does not take) must be caught by the same comparison.
"""

from __future__ import annotations

import pytest
import torch

from specdec import NgramDrafter, SamplingConfig, autoregressive_generate, speculative_generate
from tests.support.models import perturbed_copy, tiny_llama
from specdec.validation.replay import (
    COMPARED_COUNTERS,
    counters_equal,
    draft_trace,
    RecordingDrafter,
    first_flip,
    replay_counters,
)

GREEDY = SamplingConfig()
KS = range(1, 9)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(103, seed=0, init_std=0.3)


@pytest.fixture(scope="module")
def drafters(target):
    return {
        "close": perturbed_copy(target, scale=0.05, seed=7),  # long accepted runs
        "far": perturbed_copy(target, scale=0.4, seed=8),  # frequent rejections
        "ngram": NgramDrafter(),
    }


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(7, 103, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _cases(target):
    """(prompt, max_new_tokens, stop ids): each stop set makes a token of the greedy continuation EOS."""
    cases = []
    for n, seed, max_new in [(1, 0, 24), (2, 1, 9), (7, 2, 30), (19, 3, 17), (40, 4, 28), (64, 5, 32)]:
        ids = _prompt(n, seed)
        ref = autoregressive_generate(target, torch.tensor([ids]), max_new_tokens=max_new, sampling=GREEDY).token_ids
        cases.append((ids, max_new, frozenset()))  # stops at max_new_tokens
        cases.append((ids, max_new, frozenset({ref[len(ref) // 2]})))  # EOS somewhere inside a block
    return cases


def _decode(target, drafter, ids, k, max_new, stop):
    rec = RecordingDrafter(drafter)
    out = speculative_generate(target, rec, torch.tensor([ids]), num_speculative_tokens=k, max_new_tokens=max_new,
                               sampling=GREEDY, eos_token_id=sorted(stop) or None)
    return out, rec


def _check_all(target, drafters, replay, exact=True):
    """Compare ``replay`` with decoding on every case; returns the mismatches as strings."""
    bad = []
    for name, drafter in drafters.items():
        for ids, max_new, stop in _cases(target):
            ref = autoregressive_generate(target, torch.tensor([ids]), max_new_tokens=max_new, sampling=GREEDY,
                                          eos_token_id=sorted(stop) or None).token_ids
            trace = draft_trace(drafter, ids, ref, 103, kmax=8, stop_token_ids=stop, exact=exact)
            for k in KS:
                out, rec = _decode(target, drafter, ids, k, max_new, stop)
                assert out.token_ids == ref
                got = replay(trace, ref, k, max_new, stop)
                if not counters_equal(got, out.stats, exact=True):
                    diff = {c: (getattr(got, c), getattr(out.stats, c)) for c in COMPARED_COUNTERS
                            if getattr(got, c) != getattr(out.stats, c)}
                    bad.append(f"{name} len={len(ids)} max_new={max_new} stop={set(stop)} k={k}: {diff}")
                else:
                    assert first_flip(rec.blocks, len(ids), trace, ref) is None
    return bad


def _right(trace, ref, k, max_new, stop):
    return replay_counters(trace, ref, num_speculative_tokens=k, max_new_tokens=max_new, stop_token_ids=stop)


def test_replay_equals_decoding_for_every_k(target, drafters):
    bad = _check_all(target, drafters, _right, exact=True)
    assert not bad, "\n".join(bad[:10])


def test_fast_replay_matches_acceptance_and_bounds_proposals(target, drafters):
    # without the free runs after a rejection, acceptance counters are still exact; proposals are an upper bound
    far = drafters["far"]
    for ids, max_new, stop in _cases(target):
        ref = autoregressive_generate(target, torch.tensor([ids]), max_new_tokens=max_new, sampling=GREEDY,
                                      eos_token_id=sorted(stop) or None).token_ids
        trace = draft_trace(far, ids, ref, 103, kmax=8, stop_token_ids=stop)
        for k in (2, 5, 8):
            out, _ = _decode(target, far, ids, k, max_new, stop)
            got = _right(trace, ref, k, max_new, stop)
            assert counters_equal(got, out.stats, exact=False)
            assert got.num_draft_tokens >= out.stats.num_draft_tokens


def test_a_wrong_replay_is_caught(target, drafters):
    def shifted(trace, ref, k, max_new, stop):  # teacher-forced logits read one position late
        import dataclasses

        return _right(dataclasses.replace(trace, argmax=trace.argmax[1:] + trace.argmax[-1:]), ref, k, max_new, stop)

    def plain_first_step(trace, ref, k, max_new, stop):  # treats a draft as if it adopted the prompt KV
        import dataclasses

        return _right(dataclasses.replace(trace, adopts_prefix=True), ref, k, max_new, stop)

    close = {"close": drafters["close"]}
    assert _check_all(target, close, shifted)
    assert _check_all(target, close, plain_first_step)


def test_recording_drafter_names_the_flip(target, drafters):
    ids = _prompt(12, 9)
    ref = autoregressive_generate(target, torch.tensor([ids]), max_new_tokens=20, sampling=GREEDY).token_ids
    trace = draft_trace(drafters["close"], ids, ref, 103, kmax=8)
    out, rec = _decode(target, drafters["close"], ids, 4, 20, frozenset())
    trace.argmax[3] = (trace.argmax[3] + 1) % 103  # a replay that saw a different draft token at position 3
    t, margin = first_flip(rec.blocks, len(ids), trace, ref)
    assert t == 3 and margin >= 0


def test_replay_equals_decoding_with_an_adopted_prompt_prefix(target):
    # a draft that adopts the target's prompt KV starts with one plain target step; an fp32 copy of the
    # target with only its LM head perturbed has exactly the target's KV, so the adoption is exact here
    import copy
    import weakref

    from specdec.models.derived import DerivedDraftRecipe

    draft = copy.deepcopy(target)
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        draft.lm_head.weight.add_(torch.randn(draft.lm_head.weight.shape, generator=g) * 0.5 * draft.lm_head.weight.std())
    draft.derived_recipe, draft.derived_source = DerivedDraftRecipe(kind="bf16"), weakref.ref(target)
    from specdec.validation.replay_run import adopts_prefix

    for ids, max_new, stop in _cases(target)[::3]:
        assert adopts_prefix(draft, target, len(ids))
        ref = autoregressive_generate(target, torch.tensor([ids]), max_new_tokens=max_new, sampling=GREEDY,
                                      eos_token_id=sorted(stop) or None).token_ids
        trace = draft_trace(draft, ids, ref, 103, kmax=8, stop_token_ids=stop, exact=True, adopts_prefix=True)
        for k in KS:
            out, _ = _decode(target, draft, ids, k, max_new, stop)
            got = _right(trace, ref, k, max_new, stop)
            assert counters_equal(got, out.stats), (len(ids), k)


def test_target_divergence_is_told_apart_from_a_draft_flip():
    from specdec.validation.replay import target_divergence

    y = [10, 11, 12, 13, 14]
    assert target_divergence([[1, 2], [1, 2, 10, 11], [1, 2, 10, 11, 12, 13]], 2, y) is None
    assert target_divergence([[1, 2], [1, 2, 10, 11], [1, 2, 10, 11, 99, 13]], 2, y) == 2
