"""What ``pair engine --url`` stores (registry.pairs.engine_tags): never a credential. The second walk-through
(issue 43) found the user info dropped but a token in the URL's query stored and printed."""

from __future__ import annotations

import pytest

from registry.pairs import engine_tags


def test_user_info_and_query_are_not_stored_and_each_is_said():
    tags, dropped = engine_tags("http://bob:hunter2secret@127.0.0.1:18931/?token=abc#frag", None)
    assert tags["engine_url"] == "http://127.0.0.1:18931/"
    assert "hunter2secret" not in str(tags) and "abc" not in str(tags)
    assert len(dropped) == 2 and "user info" in dropped[0] and "query" in dropped[1]


def test_a_plain_url_is_stored_as_given():
    tags, dropped = engine_tags("http://127.0.0.1:8080", ["llama-server", "-m", "t.gguf"], concurrency=2)
    assert tags == {"engine": "llamacpp", "engine_url": "http://127.0.0.1:8080", "engine_concurrency": "2",
                    "engine_flags": '["llama-server", "-m", "t.gguf"]'} and dropped == []


def test_the_engine_is_set_with_its_url_and_must_be_checkable():
    """``pair engine`` names the engine serving at the URL (the default engine when not given); the nightly checks
    the pair through that profile, so one it cannot ask is refused."""
    assert engine_tags("http://127.0.0.1:8000", None, engine="vllm")[0]["engine"] == "vllm"
    assert engine_tags("http://127.0.0.1:8080", None, engine="llama.cpp")[0]["engine"] == "llamacpp"
    with pytest.raises(ValueError, match="the engine check cannot ask sglang: use vllm or llamacpp"):
        engine_tags("http://127.0.0.1:30000", None, engine="sglang")


@pytest.mark.parametrize("url", ["", "notaurl", "ftp://h:1"])
def test_not_an_engine_url_is_refused_naming_it(url):
    with pytest.raises(ValueError, match="base URL, got"):
        engine_tags(url, None)


# issue 51: an environment prefix, vLLM's underscore spellings and upper-case flags reached the MLflow tag verbatim
FLAGS = ("VLLM_API_KEY=envkey1 HF_TOKEN=envtok2 TOKENIZERS_PARALLELISM=false vllm serve /m --api_key undkey3 "
         "--hf_token=undtok4 --API-KEY upkey5 --HF-TOKEN=uptok6 --max-num-batched-tokens 512 --port 8000")


def test_env_prefixes_underscore_spellings_and_case_are_stored_as_stars():
    import json
    import shlex

    tags, dropped = engine_tags("http://127.0.0.1:8000/v1", shlex.split(FLAGS))
    stored = json.loads(tags["engine_flags"])
    assert stored == ["VLLM_API_KEY=***", "HF_TOKEN=***", "TOKENIZERS_PARALLELISM=false", "vllm", "serve", "/m",
                      "--api_key", "***", "--hf_token=***", "--API-KEY", "***", "--HF-TOKEN=***",
                      "--max-num-batched-tokens", "512", "--port", "8000"]
    for secret in ("envkey1", "envtok2", "undkey3", "undtok4", "upkey5", "uptok6"):
        assert secret not in str(tags)
    assert dropped == ["credentials in --flags (e.g. --api-key VALUE) are stored as ***"]


def test_docker_env_options_and_a_valueless_hf_token():
    import json

    tags, _ = engine_tags("http://127.0.0.1:8000", ["env", "OPENAI_API_KEY=k1", "docker", "run", "-e", "HF_TOKEN=k2",
                                                    "--env=PGPASSWORD=k3", "img", "--hf-token", "--port", "8000"])
    assert json.loads(tags["engine_flags"]) == ["env", "OPENAI_API_KEY=***", "docker", "run", "-e", "HF_TOKEN=***",
                                                "--env=PGPASSWORD=***", "img", "--hf-token", "--port", "8000"]
