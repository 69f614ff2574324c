"""Strict inputs (issue 12, item 6): every public entry point checks types and ranges up front,
with a message naming the argument, before any model runs."""

from __future__ import annotations

import warnings

import pytest
import torch

from specdec import (
    NgramDrafter,
    SamplingConfig,
    SpeculativeConfig,
    autoregressive_generate,
    speculative_generate,
    speculative_generate_batch,
)
from tests.support.models import perturbed_copy, tiny_llama

VOCAB = 103
GREEDY = SamplingConfig()


@pytest.fixture(scope="module")
def target():
    return tiny_llama(VOCAB, seed=0)


@pytest.fixture(scope="module")
def draft(target):
    return perturbed_copy(target, scale=0.05)


@pytest.mark.parametrize("bad_id", [VOCAB, VOCAB + 50, -1])
@pytest.mark.parametrize("kind", ["target-only", "ngram", "model draft", "batch"])
def test_token_ids_outside_the_vocabulary_name_the_argument(target, draft, bad_id, kind):
    """Before: a torch IndexError deep in the embedding, or (model draft) "the target produced token id"."""
    ids = torch.tensor([[5, 6, bad_id, 7]])
    kw = dict(max_new_tokens=4, sampling=GREEDY)
    with pytest.raises(ValueError, match=rf"input_ids holds token id {bad_id}, outside the target's vocabulary \[0, {VOCAB}\)"):
        if kind == "target-only":
            autoregressive_generate(target, ids, **kw)
        elif kind == "batch":
            speculative_generate(target, draft, torch.cat([ids, torch.tensor([[1, 2, 3, 4]])]), num_speculative_tokens=2, **kw)
        else:
            drafter = NgramDrafter() if kind == "ngram" else draft
            speculative_generate(target, drafter, ids, num_speculative_tokens=2, **kw)


def test_padding_slots_may_hold_any_id(target, draft):
    """Only real tokens are checked: a left-padded batch may pad with an id outside the vocabulary."""
    ids = torch.tensor([[10_000, 5, 6], [7, 8, 9]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    out = speculative_generate(target, draft, ids, mask, num_speculative_tokens=2, max_new_tokens=3, sampling=GREEDY)
    assert [len(r.token_ids) for r in out.rows] == [3, 3]


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        (dict(top_k=3.0), TypeError, "top_k must be an int"),
        (dict(top_k=True), TypeError, "top_k must be an int"),
        (dict(top_k=0), ValueError, "top_k must be an int >= 1"),
        (dict(temperature=True), TypeError, "temperature must be a number"),
        (dict(temperature="0.7"), TypeError, "temperature must be a number"),
        (dict(temperature=float("nan")), ValueError, "temperature must be a finite number"),
        (dict(temperature=-0.1), ValueError, "temperature must be a finite number"),
        (dict(top_p=True), TypeError, "top_p must be a number"),
        (dict(top_p=0.0), ValueError, r"top_p must be in \(0, 1\]"),
        (dict(top_p=1.5), ValueError, r"top_p must be in \(0, 1\]"),
    ],
)
def test_sampling_config_refuses_wrong_types_and_ranges(kwargs, error, pattern):
    """Before: ``top_k=3.0`` / ``top_k=True`` passed and failed later in torch; ``temperature=True`` ran as 1.0."""
    with pytest.raises(error, match=pattern):
        SamplingConfig(**kwargs)


def test_sampling_config_accepts_numpy_numbers():
    np = pytest.importorskip("numpy")
    s = SamplingConfig(temperature=np.float32(0.5), top_k=np.int64(5), top_p=np.float64(0.9))
    d = s.to_dict()
    assert d["temperature"] == 0.5 and d["top_k"] == 5 and type(d["top_k"]) is int and type(d["top_p"]) is float


@pytest.mark.parametrize("call", ["autoregressive", "speculative", "batch"])
def test_sampling_must_be_a_sampling_config(target, call):
    """Before: ``sampling={...}`` gave an AttributeError ('dict' object has no attribute 'is_greedy')."""
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(TypeError, match=r"sampling must be a SamplingConfig .*got dict"):
        if call == "autoregressive":
            autoregressive_generate(target, ids, max_new_tokens=2, sampling={"temperature": 0.5})
        elif call == "speculative":
            speculative_generate(target, NgramDrafter(), ids, num_speculative_tokens=2, max_new_tokens=2,
                                 sampling={"temperature": 0.5})
        else:
            speculative_generate_batch(target, NgramDrafter(), ids, num_speculative_tokens=2, max_new_tokens=2,
                                       sampling={"temperature": 0.5})


@pytest.mark.parametrize("bad, error", [(0, ValueError), (2.0, TypeError), (True, TypeError), ("4", TypeError)])
def test_num_speculative_tokens_is_checked(target, bad, error):
    with pytest.raises(error, match="num_speculative_tokens must be an int >= 1"):
        speculative_generate(target, NgramDrafter(), torch.tensor([[5, 6]]), num_speculative_tokens=bad,
                             max_new_tokens=2, sampling=GREEDY)


def test_max_new_tokens_is_checked(target):
    with pytest.raises(TypeError, match="max_new_tokens must be an int"):
        autoregressive_generate(target, torch.tensor([[5, 6]]), max_new_tokens=2.0, sampling=GREEDY)
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 0"):
        autoregressive_generate(target, torch.tensor([[5, 6]]), max_new_tokens=-1, sampling=GREEDY)


def test_old_num_draft_tokens_keyword_still_works_with_a_deprecation_warning(target, draft):
    ids = torch.tensor([[5, 6, 7, 8]])
    kw = dict(max_new_tokens=6, sampling=GREEDY)
    new = speculative_generate(target, draft, ids, num_speculative_tokens=3, **kw)
    with pytest.warns(DeprecationWarning, match="num_draft_tokens= is deprecated"):
        old = speculative_generate(target, draft, ids, num_draft_tokens=3, **kw)
    assert old.token_ids == new.token_ids and old.stats.num_speculative_tokens == 3
    with pytest.warns(DeprecationWarning):
        batch = speculative_generate_batch(target, draft, ids, num_draft_tokens=3, **kw)
    assert batch.rows[0].token_ids == new.token_ids
    with pytest.raises(TypeError, match="num_speculative_tokens only"):
        speculative_generate(target, draft, ids, num_speculative_tokens=3, num_draft_tokens=3, **kw)
    with pytest.raises(TypeError, match="missing required keyword argument: num_speculative_tokens"):
        speculative_generate(target, draft, ids, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new keyword warns about nothing
        speculative_generate(target, draft, ids, num_speculative_tokens=3, **kw)


class TestSpeculativeConfig:
    def test_validated_once_at_construction(self):
        with pytest.raises(ValueError, match="num_speculative_tokens must be an int >= 1"):
            SpeculativeConfig(0)
        with pytest.raises(TypeError, match="num_speculative_tokens must be an int"):
            SpeculativeConfig(4.0)
        with pytest.raises(TypeError, match="sampling must be a SamplingConfig"):
            SpeculativeConfig(4, {"temperature": 0.0})
        with pytest.raises(TypeError, match="max_new_tokens must be an int"):
            SpeculativeConfig(4, max_new_tokens="64")
        with pytest.raises(AttributeError):
            SpeculativeConfig(4).num_speculative_tokens = 5  # frozen

    def test_dict_and_tag_round_trips(self):
        cfg = SpeculativeConfig(5, SamplingConfig(temperature=0.7, top_k=20, top_p=0.9), 96)
        assert cfg.to_dict() == {"num_speculative_tokens": 5, "temperature": 0.7, "top_k": 20, "top_p": 0.9,
                                 "max_new_tokens": 96}
        assert SpeculativeConfig.from_dict(cfg.to_dict()) == cfg
        tags = cfg.to_tags()
        assert all(isinstance(v, str) for v in tags.values()) and tags["top_k"] == "20"
        assert SpeculativeConfig.from_tags(tags) == cfg
        greedy = SpeculativeConfig(4)
        assert greedy.to_tags()["top_p"] == "none" and SpeculativeConfig.from_tags(greedy.to_tags()) == greedy
        assert cfg.sha256() != greedy.sha256() and cfg.sha256() == SpeculativeConfig.from_dict(cfg.to_dict()).sha256()

    def test_reads_data_written_before_the_rename(self):
        legacy = {"num_draft_tokens": "3", "temperature": "0.0", "top_k": "none", "top_p": "none", "max_new_tokens": "16"}
        assert SpeculativeConfig.from_tags(legacy) == SpeculativeConfig(3, max_new_tokens=16)
        assert SpeculativeConfig.from_dict({"num_draft_tokens": 6, "temperature": 0.0}, max_new_tokens=32) == \
            SpeculativeConfig(6, max_new_tokens=32)
        with pytest.raises(KeyError, match="num_speculative_tokens"):
            SpeculativeConfig.from_dict({"temperature": 0.0})
