"""``specdec model fetch`` / ``specdec model info`` on tiny checkpoints."""

from __future__ import annotations

import json
from importlib.metadata import entry_points

import typer
from typer.testing import CliRunner

from specdec.models import tokenizer_sha256, weights_sha256
from specdec.models.cli import register
from tests.support.models import save_tiny_checkpoint


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:  # keep "model" as a sub-command even with one group
        pass

    register(app)
    return app


def test_entry_point_installed():
    eps = {ep.name: ep.value for ep in entry_points(group="specdec.cli")}
    assert eps.get("model") == "specdec.models.cli:register"


def test_fetch_and_info_json(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    ckpt = save_tiny_checkpoint(tmp_path / "tiny")
    runner = CliRunner()
    res = runner.invoke(_app(), ["model", "fetch", str(ckpt), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["path"] == str(ckpt.resolve()) and out["source"]["kind"] == "local"
    assert out["weights_sha256"] == weights_sha256(ckpt) and out["tokenizer_sha256"] == tokenizer_sha256(ckpt)

    res = runner.invoke(_app(), ["model", "info", str(ckpt), "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    assert info["architecture"] == "LlamaForCausalLM" and info["config_vocab_size"] == 103
    assert info["special_tokens"]["eos"] == ["</s>", 2] and info["chat_template"] is True

    res = runner.invoke(_app(), ["model", "info", str(ckpt)])
    assert res.exit_code == 0 and "LlamaForCausalLM" in res.stdout


def test_missing_model_is_a_clean_error(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    res = CliRunner().invoke(_app(), ["model", "info", str(tmp_path / "nope")])
    assert res.exit_code == 1
    assert "error" in res.stderr and "not found" in res.stderr and "Traceback" not in res.output
