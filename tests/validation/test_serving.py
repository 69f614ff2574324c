"""The serving configuration a validated pair carries, per engine profile (vLLM, SGLang, transformers)."""

from __future__ import annotations

import json

import pytest

from specdec.validation.serving import serving_config

from tests.support.store import model_store


def test_vllm_speculative_config_json():
    sc = serving_config("vllm", "derived:int8", 5, draft="models:/smollm2-int8/3")
    assert sc["speculative_config"] == {"method": "draft_model", "model": "models:/smollm2-int8/3",
                                        "num_speculative_tokens": 5, "draft_sample_method": "greedy"}
    assert sc["args"][0] == "--speculative-config" and json.loads(sc["args"][1]) == sc["speculative_config"]
    ng = serving_config("vllm", "ngram", 4, draft=None)
    from specdec.core.drafters import NgramDrafter
    d = NgramDrafter()  # no recipe: the defaults, which are the drafter's
    assert ng["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": d.max_ngram,
                                        "prompt_lookup_min": d.min_ngram}
    classic = serving_config("vllm", "ngram", 4, draft=None, drafter_recipe={"max_ngram": 4, "min_ngram": 1})
    assert (classic["speculative_config"]["prompt_lookup_max"], classic["speculative_config"]["prompt_lookup_min"]) == (4, 1)


def test_a_validated_ngram_report_serves_its_own_sizes():
    from types import SimpleNamespace

    from specdec.kinds import kind_of
    from specdec.validation.serving import report_serving_config

    d = kind_of("ngram:2:1").resolve("ngram:2:1", store=model_store())
    assert (d.drafter.max_ngram, d.drafter.min_ngram) == (2, 1) and d.recipe == {"max_ngram": 2, "min_ngram": 1}
    rep = SimpleNamespace(config={"num_speculative_tokens": 3}, drafter_kind="ngram", drafter_ref=d.ref,
                          drafter_recipe=d.recipe)  # the fields of a ValidationReport it reads
    spec = report_serving_config(rep)["speculative_config"]
    assert (spec["prompt_lookup_max"], spec["prompt_lookup_min"]) == (2, 1)


def test_a_report_of_an_adapted_target_prints_no_base_only_flags():
    """``validate --target-adapter`` printed the base's vLLM flags: that command serves the base (new-user try)."""
    from types import SimpleNamespace

    from specdec.validation.serving import report_serving_config

    rep = SimpleNamespace(config={"num_speculative_tokens": 3}, drafter_kind="ngram", drafter_ref=None,
                          drafter_recipe={"max_ngram": 3, "min_ngram": 2}, target_ref="smollm2",
                          target_adapter={"name": "support-v3", "ref": "/a/support-v3"})
    out = report_serving_config(rep)
    assert "speculative_config" not in out and out["num_speculative_tokens"] == 3
    assert "LoRA adapter support-v3" in out["none"] and "--lora-modules support-v3=<dir>" in out["none"]
    rep.target_adapter = None
    assert report_serving_config(rep)["speculative_config"]["prompt_lookup_max"] == 3


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


def test_llamacpp_is_the_llama_server_command_of_gguf_files():
    sc = serving_config("llamacpp", "model", 4, draft="/m/draft-Q4_0.gguf", target="/m/target.Q4_1.gguf")
    assert sc["draft_sampling"] == "argmax" and sc["command"].startswith("llama-server -m /m/target.Q4_1.gguf ")
    args = sc["args"]
    assert args[args.index("--spec-type") + 1] == "draft-simple"
    assert args[args.index("--spec-draft-model") + 1] == "/m/draft-Q4_0.gguf"
    assert [args[args.index(f) + 1] for f in ("--spec-draft-n-max", "--spec-draft-n-min", "--spec-draft-p-min",
                                              "--spec-draft-sampling")] == ["4", "0", "0", "greedy"]
    with pytest.raises(ValueError, match="GGUF"):
        serving_config("llamacpp", "model", 4, draft="/m/draft", target="/m/target.gguf")
    with pytest.raises(ValueError, match="llama-quantize"):
        serving_config("llamacpp", "derived:int8", 4, draft="/m/t.gguf", target="/m/t.gguf")


ALL_KINDS = [("vllm", "model"), ("vllm", "derived:int8"), ("vllm", "derived:bf16"), ("vllm", "ngram"), ("vllm", "eagle3"),
             ("sglang", "model"), ("sglang", "derived:int4"), ("sglang", "eagle3"), ("transformers", "model"),
             ("transformers", "derived:int8"), ("llamacpp", "model")]


def _model_refs(sc: dict) -> list[str]:
    spec = sc.get("speculative_config") or {}
    refs = [spec["model"]] if "model" in spec else []
    args = sc.get("args") or []
    refs += [args[i + 1] for i, a in enumerate(args) if a in ("--speculative-draft-model-path", "-m", "--spec-draft-model")]
    kw = sc.get("generate_kwargs") or {}
    return refs + ([kw["assistant_model"]] if "assistant_model" in kw else [])


@pytest.mark.parametrize("engine,kind", ALL_KINDS)
@pytest.mark.parametrize("registered", ["hub", "gguf", "no serve ref"])
def test_every_serving_config_names_what_the_engine_loads(engine, kind, registered):
    """A pair's logged serving config names Hub ids or paths (GGUF files for llama.cpp), never an MLflow URI;
    a checkpoint known only by its MLflow URI comes with the command that downloads it to that path."""
    from types import SimpleNamespace

    from registry.pairs import serve_tags
    from registry.runs import serving_config_for

    sources = {"hub": ({"kind": "hub", "repo_id": "org/target"}, {"kind": "hub", "repo_id": "org/draft"}),
               "gguf": ({"kind": "gguf", "gguf_path": "/m/t.gguf", "gguf_sha256": "ab" * 32},
                        {"kind": "gguf", "gguf_path": "/m/d.gguf", "gguf_sha256": "cd" * 32}),
               "no serve ref": ({}, {})}[registered]
    tags = {"engine": engine, "drafter_kind": kind, "target": "models:/t/1",
            "draft": "none" if kind == "ngram" else "models:/d/1",
            **serve_tags("target", sources[0]), **serve_tags("draft", sources[1])}
    sc = serving_config_for(tags, SimpleNamespace(config={"num_speculative_tokens": 3}, drafter_kind=kind))
    if kind == "derived:bf16":  # the target itself to an engine running it in bf16: none, with the reason
        assert "c = 1" in sc["none"] and not _model_refs(sc), sc
        return
    if engine == "llamacpp" and registered != "gguf":
        assert sc is None  # llama.cpp serves GGUF files only: no config rather than a wrong one
        return
    assert sc is not None
    refs = _model_refs(sc)
    assert kind == "ngram" or refs, sc
    assert not any(str(r).startswith("models:/") for r in refs), sc
    if registered == "no serve ref" and kind not in ("ngram",) and not kind.startswith("derived:"):
        assert any("mlflow artifacts download --artifact-uri models:/d/1" in c for c in sc["download"])
    if kind.startswith("derived:"):
        assert "derived" in sc and (kind != "derived:bf16" or "c = 1" in sc["derived"])
