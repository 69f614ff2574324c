"""Draft-length policy (``assistant_confidence_threshold``, tau): greedy replay == decoding.

For every prompt case of ``test_replay.py`` (prompts of 1..64 tokens, EOS inside blocks,
max_new_tokens stops), k = 1..8 and tau in {0.3, 0.5, 0.8}, the counters replayed from ONE
teacher-forced draft pass (exact trace: the draft's confidence along y and after each rejection)
equal :func:`specdec.speculative_generate`'s with the same threshold, on tiny fp32 pairs, and the
greedy output stays the target's. The threshold must actually shorten blocks here, and a replay
that ignores it must be caught. :func:`replay_grid` pools the same counters.
"""

from __future__ import annotations

import pytest
import torch

from specdec import SamplingConfig, autoregressive_generate, speculative_generate
from specdec.validation.replay import COMPARED_COUNTERS, counters_equal, draft_trace, replay_counters, replay_grid
from tests.validation.test_replay import _cases, drafters, target  # noqa: F401 (fixtures)

GREEDY = SamplingConfig()
KS = range(1, 9)
TAUS = (0.3, 0.5, 0.8)


def _traces(target, drafter):
    out = []
    for ids, max_new, stop in _cases(target):
        ref = autoregressive_generate(target, torch.tensor([ids]), max_new_tokens=max_new, sampling=GREEDY,
                                      eos_token_id=sorted(stop) or None).token_ids
        out.append((ids, max_new, stop, ref, draft_trace(drafter, ids, ref, 103, kmax=8, stop_token_ids=stop, exact=True)))
    return out


@pytest.mark.parametrize("name", ["close", "far"])
def test_replay_equals_decoding_for_every_k_and_tau(target, drafters, name):
    drafter, bad, shortened = drafters[name], [], 0
    for ids, max_new, stop, ref, trace in _traces(target, drafter):
        for k in KS:
            fixed = replay_counters(trace, ref, num_speculative_tokens=k, max_new_tokens=max_new, stop_token_ids=stop)
            for tau in TAUS:
                out = speculative_generate(target, drafter, torch.tensor([ids]), num_speculative_tokens=k,
                                           max_new_tokens=max_new, sampling=GREEDY, eos_token_id=sorted(stop) or None,
                                           assistant_confidence_threshold=tau)
                assert out.token_ids == ref
                got = replay_counters(trace, ref, num_speculative_tokens=k, max_new_tokens=max_new,
                                      stop_token_ids=stop, assistant_confidence_threshold=tau)
                if not counters_equal(got, out.stats, exact=True):
                    bad.append(f"{name} len={len(ids)} k={k} tau={tau}: " + str(
                        {c: (getattr(got, c), getattr(out.stats, c)) for c in COMPARED_COUNTERS
                         if getattr(got, c) != getattr(out.stats, c)}))
                shortened += got.num_draft_tokens < fixed.num_draft_tokens
    assert not bad, "\n".join(bad[:10])
    assert shortened > 0, "the threshold never shortened a block: the test would not see a wrong replay"


def test_a_replay_that_ignores_tau_is_caught(target, drafters):
    ids, max_new, stop, ref, trace = _traces(target, drafters["far"])[4]
    caught = 0
    for k in (4, 8):
        out = speculative_generate(target, drafters["far"], torch.tensor([ids]), num_speculative_tokens=k,
                                   max_new_tokens=max_new, sampling=GREEDY, eos_token_id=sorted(stop) or None,
                                   assistant_confidence_threshold=0.8)
        ignored = replay_counters(trace, ref, num_speculative_tokens=k, max_new_tokens=max_new, stop_token_ids=stop)
        caught += not counters_equal(ignored, out.stats, exact=True)
    assert caught


def test_replay_grid_pools_the_per_prompt_counters(target, drafters):
    rows = []
    for seed in range(3):
        ids = torch.randint(7, 103, (5 + 7 * seed,), generator=torch.Generator().manual_seed(seed)).tolist()
        ref = autoregressive_generate(target, torch.tensor([ids]), max_new_tokens=20, sampling=GREEDY).token_ids
        rows.append((ref, draft_trace(drafters["close"], ids, ref, 103, kmax=8, exact=True)))
    grid = replay_grid([r[1] for r in rows], [r[0] for r in rows], [2, 5], [None, 0.5], max_new_tokens=20)
    assert set(grid) == {(2, None), (2, 0.5), (5, None), (5, 0.5)}
    for (k, tau), pooled in grid.items():
        per = [replay_counters(trace, ref, num_speculative_tokens=k, max_new_tokens=20,
                               assistant_confidence_threshold=tau) for ref, trace in rows]
        for counter in ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_rejected_steps"):
            assert getattr(pooled, counter) == sum(getattr(s, counter) for s in per)
    assert grid[(5, 0.5)].num_draft_tokens < grid[(5, None)].num_draft_tokens


def test_best_k_tau_scores_the_grid_with_the_one_speed_model(target, drafters):
    from specdec.validation.replay_curve import best_k_tau
    from specdec.validation.speed import StepCounters, VerifyCost, predicted_speedup

    rows = []
    for seed in range(3):
        ids = torch.randint(7, 103, (6 + 5 * seed,), generator=torch.Generator().manual_seed(10 + seed)).tolist()
        ref = autoregressive_generate(target, torch.tensor([ids]), max_new_tokens=24, sampling=GREEDY).token_ids
        rows.append((ref, draft_trace(drafters["far"], ids, ref, 103, kmax=8, exact=True)))
    traces, conts = [r[1] for r in rows], [r[0] for r in rows]
    v = VerifyCost.fit({n: 1.0 + 0.15 * n for n in range(1, 9)})  # a CPU-like steep v(n)
    out = best_k_tau(traces, conts, range(1, 9), 0.4, v, max_new_tokens=24, taus=(0.3, 0.5, 0.8))
    fixed, best = out["best_fixed_k"], out["best_k_tau"]
    assert best["predicted_speedup"] >= fixed["predicted_speedup"]
    grid = replay_grid(traces, conts, range(1, 9), [None, 0.3, 0.5, 0.8], max_new_tokens=24)
    scores = {key: predicted_speedup(StepCounters.from_stats(s), 0.4, v) for key, s in grid.items()}
    assert best["predicted_speedup"] == pytest.approx(max(scores.values()))
    assert fixed["predicted_speedup"] == pytest.approx(max(s for (k, t), s in scores.items() if t is None))
    assert scores[(best["num_speculative_tokens"], best["assistant_confidence_threshold"])] == pytest.approx(
        best["predicted_speedup"])
