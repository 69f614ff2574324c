"""The serving configuration a validated pair carries, per engine profile (vLLM, SGLang, transformers)."""

from __future__ import annotations

import json

import pytest

from specdec.validation.serving import serving_config


def test_vllm_speculative_config_json():
    sc = serving_config("vllm", "derived:int8", 5, draft="models:/smollm2-int8/3")
    assert sc["speculative_config"] == {"method": "draft_model", "model": "models:/smollm2-int8/3",
                                        "num_speculative_tokens": 5}
    assert sc["args"][0] == "--speculative-config" and json.loads(sc["args"][1]) == sc["speculative_config"]
    ng = serving_config("vllm", "ngram", 4, draft=None, prompt_lookup_max=3)
    assert ng["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
                                        "prompt_lookup_min": 1}


def test_sglang_flags_are_a_chain_of_k_drafts():
    sc = serving_config("sglang", "model", 3, draft="/models/draft")
    assert sc["args"] == ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", "/models/draft",
                          "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                          "--speculative-num-draft-tokens", "4"]
    assert serving_config("sglang", "ngram", 2, draft=None)["args"][:2] == ["--speculative-algorithm", "NGRAM"]


def test_eagle3_heads():
    assert serving_config("vllm", "eagle3", 3, draft="models:/head/1")["speculative_config"]["method"] == "eagle3"
    assert serving_config("sglang", "eagle3", 3, draft="h")["args"][:2] == ["--speculative-algorithm", "EAGLE3"]
    with pytest.raises(ValueError, match="EAGLE-3"):
        serving_config("transformers", "eagle3", 3, draft="h")


def test_tau_goes_where_the_engine_has_it():
    hf = serving_config("transformers", "model", 6, draft="d", assistant_confidence_threshold=0.5)
    assert hf["generate_kwargs"]["assistant_confidence_threshold"] == 0.5 and hf["draft_sampling"] == "sampled"
    vl = serving_config("vllm", "model", 6, draft="d", assistant_confidence_threshold=0.5)
    assert vl["not_applied"] == {"assistant_confidence_threshold": 0.5} and vl["draft_sampling"] == "argmax"


def test_transformers_and_bad_input():
    assert serving_config("transformers", "model", 6, draft="d")["generate_kwargs"] == {
        "assistant_model": "d", "num_assistant_tokens": 6, "num_assistant_tokens_schedule": "constant"}
    assert serving_config("transformers", "ngram", 6, draft=None)["generate_kwargs"]["prompt_lookup_num_tokens"] == 6
    for bad in [dict(engine="tgi"), dict(k=0), dict(draft=None)]:
        args = dict(engine="vllm", k=4, draft="d") | bad
        with pytest.raises(ValueError):
            serving_config(args["engine"], "model", args["k"], draft=args["draft"])
