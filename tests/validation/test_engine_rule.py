"""llama.cpp's drafting rule in the replay, and the engine check's pieces that need no engine."""

from __future__ import annotations

import math

from specdec.validation.engine_report import EnginePromptResult, paired_difference_ci, summarize, verdict_of
from specdec.validation.replay import ModelTrace, replay_counters

EOS = 2


def test_llamacpp_drafts_past_a_drafted_stop_token():
    """The core cuts a block after a drafted stop token; llama.cpp drafts n_max tokens anyway, and its drafts
    past the end of the output are drafted, never accepted."""
    y = [5, 6, EOS]  # the output: 5 from the prefill, then one block that ends on EOS
    trace = ModelTrace(argmax=[5, 6, EOS], margin=[1.0] * 3, confidence=[0.9] * 3, adopts_prefix=True)
    core = replay_counters(trace, y, num_speculative_tokens=4, max_new_tokens=8, stop_token_ids=frozenset({EOS}))
    lcpp = replay_counters(trace, y, num_speculative_tokens=4, max_new_tokens=8, stop_token_ids=frozenset({EOS}),
                           drafts_past_stop=True)
    assert (core.num_drafts, core.num_draft_tokens, core.num_accepted_tokens) == (1, 2, 2)
    assert (lcpp.num_drafts, lcpp.num_draft_tokens, lcpp.num_accepted_tokens) == (1, 4, 2)
    assert core.num_emitted_tokens == lcpp.num_emitted_tokens == 3
    # no stop token inside the output: the two rules count the same
    y2 = [5, 6, 7, 8, 9, 1, 3, 4]
    t2 = ModelTrace(argmax=[5, 6, 7, 0, 9, 1, 0, 4], margin=[1.0] * 8, confidence=[0.9] * 8, adopts_prefix=True)
    a = replay_counters(t2, y2, num_speculative_tokens=3, max_new_tokens=8, stop_token_ids=frozenset({EOS}))
    b = replay_counters(t2, y2, num_speculative_tokens=3, max_new_tokens=8, stop_token_ids=frozenset({EOS}),
                        drafts_past_stop=True)
    assert (a.num_draft_tokens, a.num_accepted_tokens) == (b.num_draft_tokens, b.num_accepted_tokens)


def _row(pid: str, cat: str, e: tuple[int, int], c: tuple[int, int]) -> EnginePromptResult:
    return EnginePromptResult(prompt_id=pid, category=cat, engine_draft_tokens=e[0], engine_accepted_tokens=e[1],
                              core_draft_tokens=c[0], core_accepted_tokens=c[1])


def test_paired_difference_and_verdict():
    same = [_row(str(i), "qa", (40, 10 + i), (40, 10 + i)) for i in range(10)]
    g = summarize(same)
    assert g.difference == 0.0 and verdict_of(g) == "agrees"
    assert g.difference_ci[0] <= 0.0 <= g.difference_ci[1]
    # the engine loses 8 of 40 accepted tokens on every prompt: credibly less, whatever the prompts' spread
    less = [_row(str(i), "qa", (40, 4 + 2 * i), (40, 12 + 2 * i)) for i in range(10)]
    g = summarize(less)
    assert g.difference == -0.2 and g.difference_ci[1] < 0 and verdict_of(g) == "engine accepts less"
    # one prompt: a point, not an interval
    assert all(math.isnan(x) for x in paired_difference_ci([1], [2], [1], [2]))
    assert verdict_of(summarize(less[:1])) == "insufficient evidence"
