"""Deterministic stratified subsets of held-out sets."""

from __future__ import annotations

from collections import Counter

import pytest

from specdec.validation.heldout import HeldoutPrompt, HeldoutSet, content_version, load_heldout


def _ids(hs):
    return [p.id for p in hs.prompts]


def test_same_seed_same_subset_other_seed_differs():
    hs = load_heldout("spec_bench")
    a, b = hs.subset(48, seed=0), hs.subset(48, seed=0)
    assert _ids(a) == _ids(b) and a.version == b.version
    assert _ids(hs.subset(48, seed=1)) != _ids(a)
    # file order is kept; the subset remembers the full set's version and how it was drawn
    pos = {p.id: i for i, p in enumerate(hs.prompts)}
    assert [pos[i] for i in _ids(a)] == sorted(pos[i] for i in _ids(a))
    assert a.source_version == hs.version != a.version and a.subset_spec == {"limit": 48, "seed": 0}


@pytest.mark.parametrize("limit", [6, 48, 50, 13, 4])
def test_spread_evenly_over_categories(limit):
    hs = load_heldout("spec_bench")
    counts = Counter(p.category for p in hs.subset(limit, seed=3).prompts)
    assert sum(counts.values()) == limit
    full = [counts.get(c, 0) for c in hs.categories]
    assert max(full) - min(full) <= 1


def test_small_category_gives_all_and_the_rest_is_spread():
    prompts = [HeldoutPrompt(id=f"{c}{i}", category=c, text="x") for c, n in (("a", 2), ("b", 10), ("c", 10)) for i in range(n)]
    hs = HeldoutSet("toy", content_version(prompts), prompts)
    counts = Counter(p.category for p in hs.subset(12, seed=0).prompts)
    assert counts == {"a": 2, "b": 5, "c": 5}
    counts = Counter(p.category for p in hs.subset(13, seed=0).prompts)
    assert counts["a"] == 2 and sorted([counts["b"], counts["c"]]) == [5, 6]


def test_larger_limit_same_seed_is_a_superset():
    hs = load_heldout("spec_bench+humaneval")
    small, big = set(_ids(hs.subset(14, seed=5))), set(_ids(hs.subset(70, seed=5)))
    assert small < big


def test_limit_edge_cases():
    hs = load_heldout("humaneval")
    assert hs.subset(None) is hs and hs.subset(10_000) is hs
    with pytest.raises(ValueError):
        hs.subset(0)
