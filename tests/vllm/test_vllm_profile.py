"""The vLLM profile's pure parts (no vLLM needed): per-position counts from vLLM's per-request histogram, the rule a
speculative config declares, the serving config with ``draft_sample_method`` explicit, the synthetic-acceptance
refusal, and the installer's ``vllm`` metadata alias that ``vllm serve`` and vLLM's platform detection read."""

from __future__ import annotations

import importlib.metadata as md

from specdec.engines.profiles import engine_profile
from specdec.engines.vllm import per_position_of
from specdec.engines.vllm_install import VLLM_VERSION, _cli_metadata
from specdec.validation.serving import serving_config

VLLM = engine_profile("vllm")


def test_per_position_counts_from_the_acceptance_histogram():
    # 5 steps accepted 0, 2 accepted 1, 1 accepted 2, 3 accepted all 4
    assert per_position_of([5, 2, 1, 0, 3]) == [6, 4, 3, 3]
    assert sum(per_position_of([5, 2, 1, 0, 3])) == 2 * 1 + 1 * 2 + 3 * 4
    assert per_position_of([]) == []


def test_the_served_rule_is_read_from_the_speculative_config():
    validated = VLLM.validated_rule(4)
    assert validated.first_token_from_prefill and not validated.drafts_past_stop
    served = VLLM.served_rule({"speculative_config": {"method": "draft_model", "num_speculative_tokens": 2,
                                                      "draft_sample_method": "greedy"}}, validated)
    assert served.drafts_less_than(validated) == ["k 2 < the validated 4"]
    ngram = VLLM.served_rule({"speculative_config": {"method": "ngram", "num_speculative_tokens": 4,
                                                     "prompt_lookup_max": 3, "prompt_lookup_min": 3}},
                             VLLM.validated_rule(4, ngram=(3, 2)))
    assert ngram.drafts_less_than(VLLM.validated_rule(4, ngram=(3, 2))) == ["a minimum n-gram 3 > the validated 2"]
    assert VLLM.served_rule({"speculative_config": None}, validated).drafts_less_than(validated) == ["drafting is off"]
    assert VLLM.served_rule({"vllm_version": "0.32.0"}, validated) is None  # the server did not say


def test_synthetic_acceptance_is_refused():
    fp = {"speculative_config": {"method": "draft_model", "num_speculative_tokens": 4,
                                 "rejection_sample_method": "synthetic"}}
    assert "synthetic" in VLLM.refusal(fp)
    assert VLLM.served_rule(fp, VLLM.validated_rule(4)).synthetic == "rejection_sample_method=synthetic"
    assert VLLM.refusal({"speculative_config": {"rejection_sample_method": "standard"}}) is None


def test_serving_configs_set_draft_sample_method_for_draft_models_only():
    for kind, draft in (("model", "/ckpt/draft"), ("eagle3", "/ckpt/head")):
        spec = serving_config("vllm", kind, 3, draft=draft)["speculative_config"]
        assert spec["draft_sample_method"] == "greedy" and spec["model"] == draft
    assert "draft_sample_method" not in serving_config("vllm", "ngram", 3, draft=None)["speculative_config"]


def test_the_cli_metadata_alias_names_a_cpu_build(tmp_path):
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    _cli_metadata(tmp_path, VLLM_VERSION)
    _cli_metadata(tmp_path, VLLM_VERSION)  # once
    (info,) = site.glob("vllm-*.dist-info")
    dist = md.PathDistribution(info)
    assert dist.metadata["Name"] == "vllm" and dist.version == f"{VLLM_VERSION}+cpu" and "cpu" in dist.version
