"""A pair's engine profile sets the proposal rule its nightly measures under (issue 21, item 3):
vLLM and SGLang verify the draft's argmax with one-hot q, transformers samples drafts from q."""

from __future__ import annotations

import pytest

from specdec.validation.serving import engine_config
from specdec import SamplingConfig
from specdec.core.config import SpeculativeConfig

SAMPLED = SpeculativeConfig(4, SamplingConfig(temperature=0.7, top_p=0.9), 64)
GREEDY = SpeculativeConfig(4, SamplingConfig(), 64)


@pytest.mark.parametrize("engine,rule", [("vllm", "argmax"), ("sglang", "argmax"), ("transformers", "sampled")])
def test_a_named_engine_gives_a_sampling_pair_its_rule(engine, rule):
    got_engine, cfg = engine_config(engine, SAMPLED)
    assert got_engine == engine and cfg.draft_sampling == rule
    assert cfg.num_speculative_tokens == 4 and cfg.sampling == SAMPLED.sampling


def test_no_engine_is_read_from_the_config():
    assert engine_config(None, SAMPLED) == ("transformers", SAMPLED)
    argmax = SpeculativeConfig(4, SAMPLED.sampling, 64, "argmax")
    assert engine_config(None, argmax) == ("vllm", argmax)
    assert engine_config(None, GREEDY) == ("vllm", GREEDY)


def test_greedy_pairs_keep_their_config_and_its_hash():
    for engine in ("vllm", "sglang", "transformers"):
        got_engine, cfg = engine_config(engine, GREEDY)
        assert got_engine == engine and cfg is GREEDY and cfg.sha256() == GREEDY.sha256()


def test_an_explicit_rule_the_engine_does_not_use_is_refused():
    with pytest.raises(ValueError, match="engine transformers proposes drafts by sampled"):
        engine_config("transformers", SpeculativeConfig(4, SAMPLED.sampling, 64, "argmax"))
    with pytest.raises(ValueError, match="unknown engine 'tgi'"):
        engine_config("tgi", GREEDY)
