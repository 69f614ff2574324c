"""Engine URLs are joined as URLs (issue 51): an OpenAI base URL (``http://host/v1``) was joined by string into
``/v1/v1/models``. The real engine clients talk to a real HTTP server on 127.0.0.1 (the scripted llama.cpp-shaped
engine, which answers ``/v1/models``, ``/props`` and ``/metrics`` at its root and 404 elsewhere)."""

from __future__ import annotations

import pytest

from specdec.engines.client import EngineClient
from specdec.engines.errors import EngineRequestError
from specdec.engines.http import engine_root, join_url
from specdec.engines.vllm_server import VllmClient
from tests.support.scripted_engine import ScriptedEngine


@pytest.fixture()
def engine():
    with ScriptedEngine(lambda ids, n: ([1] * n, 0, 0)) as e:
        yield e


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
def test_llamacpp_client_reaches_the_engine_from_an_openai_base_url(engine, suffix):
    client = EngineClient(engine.url + suffix, timeout_s=10)
    try:
        assert client.models()["data"][0]["meta"]["n_vocab"] == 103
        assert client.props()["build_info"] == "b0-scripted"
        assert "llamacpp:spec_decode_num_drafts_total" in client.metrics_text()
    finally:
        client.close()


@pytest.mark.parametrize("suffix", ["", "/v1", "/v1/"])
def test_vllm_client_reaches_the_engine_from_an_openai_base_url(engine, suffix):
    client = VllmClient(engine.url + suffix, timeout_s=10)
    try:
        assert client.model_name() == "target"
        assert "llamacpp:spec_decode_num_drafts_total" in client.metrics_text()
    finally:
        client.close()


def test_a_missing_path_is_named_as_one_url(engine):
    client = EngineClient(engine.url + "/v1", timeout_s=10)
    try:
        with pytest.raises(EngineRequestError, match=r"GET http://127\.0\.0\.1:\d+/slotz failed: HTTP 404"):
            client.request("GET", "/slotz")
    finally:
        client.close()


def test_a_proxy_prefix_is_kept_and_queries_travel_with_the_path():
    assert engine_root("http://gw:81/llama/v1/?x=1") == "http://gw:81/llama"
    assert join_url("http://gw:81/llama", "/v1/models") == "http://gw:81/llama/v1/models"
    assert join_url(engine_root("http://h/v1"), "/server_info?config_format=json") == \
        "http://h/server_info?config_format=json"
    with pytest.raises(EngineRequestError, match="bad engine URL"):
        VllmClient("http://[::1")
