"""The serving-config round trip through a real ``vllm serve`` (skipped with one line where vLLM is not installed):
for every drafter kind vLLM loads here (draft_model, ngram, and an EAGLE-3 head in the speculators format), the ``--speculative-config`` that ``specdec pair show`` prints for the real
pair starts a server, the server reports that config back (``/server_info``), and the pair's acceptance is counted
from that server's own counters."""

from __future__ import annotations

import json

import pytest

from specdec.engines.metrics import VLLM_METRICS, counters_of
from specdec.engines.vllm_server import VllmClient
from tests.support.vllm import K, MAX_TOKENS, draft_dir

pytestmark = [pytest.mark.server, pytest.mark.slow]
REPEAT = "Repeat this sentence three times: The quick brown fox jumps over the lazy dog."


def _chat_ids(tok, text: str) -> list[int]:
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def test_pair_show_prints_a_config_vllm_reads_as_validated(printed_configs):
    draft, ngram = printed_configs["draft_model"], printed_configs["ngram"]
    assert draft["speculative_config"] == {"method": "draft_model", "model": str(draft_dir()), "num_speculative_tokens": K,
                                           "draft_sample_method": "greedy"}
    assert ngram["speculative_config"] == {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 3,
                                           "prompt_lookup_min": 2}
    eagle3 = printed_configs["eagle3"]  # a head stored in MLflow: a local directory and the command that writes it
    assert eagle3["speculative_config"] == {"method": "eagle3", "model": "./smol-eagle3-eagle3-v1",
                                            "num_speculative_tokens": K, "draft_sample_method": "greedy"}
    assert eagle3["download"] == [f"mlflow artifacts download --artifact-uri models:/smol-eagle3-eagle3/1 "
                                  f"--dst-path ./smol-eagle3-eagle3-v1"]
    assert (printed_configs["cwd"] / "smol-eagle3-eagle3-v1" / "config.json").is_file()
    for cfg in (draft, ngram, printed_configs["eagle3"]):
        assert cfg["args"] == ["--speculative-config", json.dumps(cfg["speculative_config"], separators=(",", ":"))]


@pytest.mark.parametrize("method", ["draft_model", "ngram", "eagle3"])
def test_every_printed_config_starts_vllm_serve_and_counts_the_pairs_acceptance(method, request, printed_configs,
                                                                                  real_pair):
    server = request.getfixturevalue({"draft_model": "serve_draft", "ngram": "serve_ngram", "eagle3": "serve_eagle3"}[method])
    printed = printed_configs[method]["speculative_config"]
    client = VllmClient(server.url)
    try:
        served = client.server_info()["vllm_config"]["speculative_config"]
        assert {k: served[k] for k in printed} == printed  # vLLM runs exactly the printed config
        before = counters_of(client.metrics_text(), VLLM_METRICS)
        ids = _chat_ids(real_pair[0].tokenizer, REPEAT)  # a prompt the n-gram lookup can copy from
        out = client.complete(ids, max_tokens=MAX_TOKENS, temperature=0.0)
        delta = counters_of(client.metrics_text(), VLLM_METRICS).minus(before)
    finally:
        client.close()
    assert delta.drafts > 0 and 0 <= delta.accepted <= delta.draft_tokens <= K * delta.drafts
    assert delta.accepted > 0 or method == "eagle3"  # the EAGLE-3 head has random weights: it drafts, accepts ~nothing
    assert delta.draft_tokens == out.per_request["num_draft_tokens"]
    assert delta.accepted == out.per_request["num_accepted_draft_tokens"] and len(delta.per_position) == K
