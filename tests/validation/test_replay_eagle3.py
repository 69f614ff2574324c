"""Replay of an EAGLE-3 head == the core's decoding, counter for counter, k = 1..8 (tiny fp32 pair).

One teacher-forced target pass (features) and one teacher-forced head pass per draft depth give
every block of every k (:func:`specdec.validation.replay.head_trace`). Stop tokens inside blocks and
max_new_tokens stops; a replay that ignores the head's own-state chain (reads depth 0 at every
position, as for a draft model) must be caught.
"""

from __future__ import annotations

import pytest
import torch

from specdec import SamplingConfig, autoregressive_generate, speculative_generate
from specdec.core.head_drafter import Eagle3Drafter
from specdec.validation.replay import COMPARED_COUNTERS, ModelTrace, counters_equal, draft_trace, replay_counters
from tests.support.eagle3 import PROMPTS, cached_pair

GREEDY = SamplingConfig()
KS = range(1, 9)


@pytest.fixture(scope="module")
def pair():
    return cached_pair(0)


def _cases(target):
    cases = []
    for prompt, max_new in zip(PROMPTS, (24, 9, 30, 17, 28)):
        ref = autoregressive_generate(target, torch.tensor([list(prompt)]), max_new_tokens=max_new, sampling=GREEDY).token_ids
        cases.append((list(prompt), max_new, frozenset()))
        cases.append((list(prompt), max_new, frozenset({ref[len(ref) // 2]})))  # EOS inside a block
    return cases


def _mismatches(target, drafter, make_trace):
    bad, accepted = [], 0
    for ids, max_new, stop in _cases(target):
        ref = autoregressive_generate(target, torch.tensor([ids]), max_new_tokens=max_new, sampling=GREEDY,
                                      eos_token_id=sorted(stop) or None).token_ids
        trace = make_trace(ids, ref, stop)
        for k in KS:
            out = speculative_generate(target, drafter, torch.tensor([ids]), num_speculative_tokens=k,
                                       max_new_tokens=max_new, sampling=GREEDY, eos_token_id=sorted(stop) or None)
            assert out.token_ids == ref
            accepted += out.stats.num_accepted_tokens
            got = replay_counters(trace, ref, num_speculative_tokens=k, max_new_tokens=max_new, stop_token_ids=stop)
            if not counters_equal(got, out.stats, exact=True):
                diff = {c: (getattr(got, c), getattr(out.stats, c)) for c in COMPARED_COUNTERS
                        if getattr(got, c) != getattr(out.stats, c)}
                bad.append(f"len={len(ids)} max_new={max_new} stop={set(stop)} k={k}: {diff}")
    return bad, accepted


@pytest.mark.parametrize("exact", [True, False])
def test_head_replay_equals_decoding_for_every_k(pair, exact):
    target, head = pair
    drafter = Eagle3Drafter(head, [1, 2, 4])

    def trace(ids, ref, stop):
        return draft_trace(drafter, ids, ref, 103, kmax=8, stop_token_ids=stop, exact=exact, target=target)

    bad, accepted = _mismatches(target, drafter, trace)
    assert accepted > 100  # the head is exercised: long accepted runs and rejections
    if exact:
        assert not bad, bad[:3]
    else:  # fast replay: exact except where a draft after a rejection would have been a stop token
        assert len(bad) <= 2, bad[:3]


def test_a_replay_that_reads_depth_zero_everywhere_is_caught(pair):
    """A head's d-th draft comes from its own state, not from target features at that position:
    replaying it like a draft model (depth-0 argmax at t = m + i) must disagree with decoding."""
    target, head = pair
    drafter = Eagle3Drafter(head, [1, 2, 4])

    def wrong(ids, ref, stop):
        right = draft_trace(drafter, ids, ref, 103, kmax=8, stop_token_ids=stop, exact=True, target=target)
        return ModelTrace(argmax=[UNSEEN_IF_EMPTY(c) for c in right.chains], adopts_prefix=True, exact=False)

    bad, _ = _mismatches(target, drafter, wrong)
    assert bad


def UNSEEN_IF_EMPTY(chain):
    from specdec.validation.replay import UNSEEN

    return chain[0] if chain else UNSEEN


def test_head_trace_needs_the_target(pair):
    _, head = pair
    with pytest.raises(ValueError, match="needs the target"):
        draft_trace(Eagle3Drafter(head, [1, 2, 4]), [5, 6], [7, 8], 103)


def test_teacher_forced_agreement_of_a_head_is_its_first_draft(pair):
    """validate's teacher-forced agreement for a head: position t >= 1 scores the head's first draft
    of a block starting there (t = 0 is the prefill, no features): top-1 agreement counts exactly
    the positions where the replayed first draft equals the target's greedy token."""
    from specdec.validation.teacher_forcing import draft_agreement, target_teacher_forcing

    target, head = pair
    drafter = Eagle3Drafter(head, [1, 2, 4])
    ids = list(PROMPTS[0])
    ref = autoregressive_generate(target, torch.tensor([ids]), max_new_tokens=20, sampling=GREEDY).token_ids
    agree = draft_agreement(target_teacher_forcing(target, ids, ref, GREEDY), None, drafter, GREEDY)
    trace = draft_trace(drafter, ids, ref, 103, kmax=1, target=target)
    assert agree.positions == len(ref) - 1
    assert agree.top1 == sum(trace.argmax[t] == ref[t] for t in range(1, len(ref))) > 0
    # the decode path wraps the drafter to record its proposals (validate's method "both"): same answer
    from specdec.validation.replay import RecordingDrafter
    wrapped = draft_agreement(target_teacher_forcing(target, ids, ref, GREEDY), None, RecordingDrafter(drafter), GREEDY)
    assert (wrapped.positions, wrapped.top1) == (agree.positions, agree.top1)
