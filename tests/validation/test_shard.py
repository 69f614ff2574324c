"""Shards of one pair's replay (specdec.validation.shard): split, replayed apart, pooled into the one-process
report exactly; a pool that lost or doubled a prompt, or whose counters do not add up, is refused."""

from __future__ import annotations

import dataclasses
import json

import pytest

from specdec import NgramDrafter
from specdec.validation.api import ValidationRequest, validate
from specdec.validation.config import ValidationConfig
from specdec.validation.continuation_cache import ContinuationCache
from specdec.validation.heldout import HeldoutPrompt, HeldoutSet, content_version
from specdec.validation.shard import measure_shard, pool, shard_counters, shard_indices
from tests.support.models import perturbed_copy, tiny_llama, tiny_tokenizer


def _heldout(n=9):
    prompts = [HeldoutPrompt(id=f"q{i}", category="abc"[i % 3],
                             messages=[{"role": "user", "content": f"item {i} " + "ab " * (i % 4)}]) for i in range(n)]
    return HeldoutSet("toy", content_version(prompts), prompts)


def _comparable(r):
    o = r.overall
    return (o.num_prompts, o.num_drafts, o.num_draft_tokens, o.num_accepted_tokens, o.acceptance_rate,
            tuple(o.acceptance_rate_ci), o.per_token_acceptance, tuple(o.per_token_acceptance_ci),
            {c: (g.num_accepted_tokens, g.num_draft_tokens, tuple(g.acceptance_rate_ci)) for c, g in r.categories.items()},
            r.replay["acceptance_by_k"], [_counted(row) for row in r.replay["prompts"]],
            json.dumps([dataclasses.asdict(p) for p in r.prompts], sort_keys=True))  # as text: NaN equals NaN


def _counted(row: dict) -> dict:  # which producer made a continuation is provenance (timing-chosen), not a count
    return {n: v for n, v in row.items() if n != "produced_by"}


def test_two_shards_pool_into_the_one_process_report(tmp_path):
    target, tok = tiny_llama(103, seed=0), tiny_tokenizer()
    drafters = [perturbed_copy(target, scale=0.3, seed=3), NgramDrafter()]
    cfg = ValidationConfig(max_new_tokens=12, bootstrap_resamples=200, warmup=False, seed=5, limit=8)

    def request(cache_dir, **extra):
        return ValidationRequest(target, drafters, _heldout(), cfg, method="replay", tokenizer=tok, kmax=6,
                                 cache=ContinuationCache(tmp_path / cache_dir), **extra)

    one = validate(request("one"))
    shards = [measure_shard(request("sharded"), s, 2) for s in (1, 0)]  # any order
    assert [len(s.indices) for s in sorted(shards, key=lambda s: s.shard)] == [4, 4]
    assert all(rp.produced_by != "cache" for s in shards for rp in s.prompts)  # each shard made its continuations
    pooled = validate(request("sharded", replayed=pool(shards, subset_size=8)))
    assert len(one) == len(pooled) == 2
    for a, b in zip(one, pooled):
        assert a.overall.num_draft_tokens > 0 and 0 < a.overall.acceptance_rate < 1
        assert _comparable(a) == _comparable(b)


def test_pool_refuses_a_lost_or_doubled_prompt_and_wrong_counters(tmp_path):
    target, tok = tiny_llama(103, seed=0), tiny_tokenizer()
    cfg = ValidationConfig(max_new_tokens=6, bootstrap_resamples=20, warmup=False, limit=6)
    req = ValidationRequest(target, [NgramDrafter()], _heldout(6), cfg, method="replay", tokenizer=tok, kmax=3,
                            cache=ContinuationCache(tmp_path))
    a, b = (measure_shard(req, s, 2) for s in (0, 1))
    assert len(pool([a, b], subset_size=6).prompts) == 6
    with pytest.raises(ValueError, match="not one split"):
        pool([a])
    short = dataclasses.replace(b, indices=b.indices[:-1], prompts=b.prompts[:-1],
                                counters=shard_counters(b.prompts[:-1], b.kmax))
    with pytest.raises(ValueError, match="came back from no shard"):
        pool([a, short], subset_size=6)
    with pytest.raises(ValueError, match="given twice"):
        pool([a, dataclasses.replace(b, indices=[a.indices[0]] + b.indices[1:])], subset_size=6)
    bad = dict(b.counters)
    bad[next(iter(bad))] += 1
    with pytest.raises(ValueError, match="not the sum"):
        pool([a, dataclasses.replace(b, counters=bad)], subset_size=6)
    assert shard_indices(5, 2) == [[0, 2, 4], [1, 3]]
    with pytest.raises(ValueError):
        measure_shard(req, 2, 2)
