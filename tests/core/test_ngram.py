"""The n-gram drafter: the incremental index matches the brute-force definition; weak matches
propose fewer tokens; decoding with it stays exact."""

from __future__ import annotations

import random

import pytest
import torch

from specdec import NgramDrafter, SamplingConfig, autoregressive_generate, speculative_generate
from specdec.core.ngram_index import IndexPool, NgramIndex, brute_force_match
from tests.support.models import tiny_llama


@pytest.mark.parametrize("vocab", [2, 5, 40])
def test_index_equals_brute_force_on_growing_contexts(vocab):
    rng = random.Random(vocab)
    for trial in range(30):
        max_n, min_n = rng.choice([(3, 1), (4, 2), (1, 1), (5, 3)])
        first = trial % 2 == 1
        idx = NgramIndex(max_n, min_n, first=first)
        ctx: list[int] = []
        for _ in range(rng.randint(1, 80)):
            ctx.append(rng.randrange(vocab))
            assert idx.match(ctx) == brute_force_match(ctx, max_n, min_n, first), (trial, ctx)


def test_index_reindexes_a_context_that_is_not_an_extension():
    idx = NgramIndex(3, 1)
    a = [1, 2, 3, 1, 2]
    assert idx.match(a) == brute_force_match(a, 3, 1) == (2, 0)
    b = [9, 9, 8, 9]  # another prompt: shorter and different
    assert idx.match(b) == brute_force_match(b, 3, 1)
    c = [1, 2, 3, 4, 1, 2, 3]  # same prefix as a, then differs
    assert idx.match(c) == brute_force_match(c, 3, 1) == (3, 0)


def test_pool_keeps_rows_apart_and_reuses_growing_slices():
    pool = IndexPool(3, 1, size=2)
    rows = [[1, 2, 1, 2], [5, 6, 7, 5, 6]]
    for _ in range(3):
        for r in rows:
            assert pool.match(r) == brute_force_match(r, 3, 1)
            r.append(r[0])
    full = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]
    for t in range(1, len(full) + 1):  # fresh slices of one growing list, as validation passes them
        assert pool.match(full[:t]) == brute_force_match(full[:t], 3, 1)
    assert len(pool.pool) <= 2


def test_weak_matches_propose_fewer_tokens_and_a_miss_proposes_nothing():
    ctx = [10, 11, 12, 13, 14, 20, 30, 10]  # suffix [10] matches once (1-token match)
    classic = NgramDrafter(min_ngram=1, match_tokens=())
    assert classic.lookup(ctx, 4) == [11, 12, 13, 14]
    weak = NgramDrafter(min_ngram=1, match_tokens=(1, 2))
    assert weak.lookup(ctx, 4) == [11]
    assert weak.lookup(ctx + [11], 4) == [12, 13]  # a 2-token match: 2 tokens
    assert weak.lookup(ctx + [11, 12], 4) == [13, 14, 20, 30]  # 3-token match: k
    assert weak.lookup([1, 2, 3, 4], 4) == []  # miss
    rep = [5, 6, 7, 5, 8, 9, 5]  # [5] occurs at 0 and 3
    assert NgramDrafter(min_ngram=1, match_tokens=()).lookup(rep, 2) == [8, 9]
    assert NgramDrafter(min_ngram=1, match_tokens=(), first_occurrence=True).lookup(rep, 2) == [6, 7]
    assert weak.budget(1, 4) == 1 and weak.budget(5, 3) == 3
    assert NgramDrafter(min_ngram=1, match_tokens=(0,)).lookup(ctx, 4) == []  # budget 0: a 1-token match is a miss
    with pytest.raises(ValueError, match="match_tokens"):
        NgramDrafter(match_tokens=(-1,))


def test_min_ngram_2_needs_a_two_token_match_and_then_proposes_k():
    d = NgramDrafter(min_ngram=2)  # vLLM's prompt_lookup_min = 2, prompt_lookup_max = 3
    ctx = [10, 11, 12, 13, 14, 20, 30, 10]
    assert d.lookup(ctx, 4) == []  # a 1-token match is weak evidence: a plain target step
    assert d.lookup(ctx + [11], 4) == [12, 13, 14, 20]  # a 2-token match: k tokens
    assert d.lookup(ctx + [11], 4) == NgramDrafter(min_ngram=1, match_tokens=(0,)).lookup(ctx + [11], 4)
    assert (NgramDrafter().min_ngram, NgramDrafter().max_ngram) == (2, 3)  # the default (spec ngram = ngram:3:2)
    assert NgramDrafter(min_ngram=1).lookup(ctx, 4) == [11]  # the classic ngram:3:1: one token after a 1-token match


@pytest.mark.parametrize("min_ngram", [1, 2])
@pytest.mark.parametrize("match_tokens", [(), (1,), (1, 2)])
def test_greedy_output_identical_with_any_policy(match_tokens, min_ngram):
    target = tiny_llama(103, hidden_size=64, init_std=0.3, seed=3)
    g = torch.Generator().manual_seed(5)
    base = torch.randint(7, 103, (1, 12), generator=g)
    ids = torch.cat([base, base, base[:, :6]], dim=1)  # repetitions so the lookup hits
    kw = dict(max_new_tokens=48, sampling=SamplingConfig(), eos_token_id=None)
    ref = autoregressive_generate(target, ids, **kw)
    drafter = NgramDrafter(min_ngram=min_ngram, match_tokens=match_tokens)
    out = speculative_generate(target, drafter, ids, num_speculative_tokens=4, **kw)
    assert out.token_ids == ref.token_ids
    assert out.stats.num_drafts > 0
