"""Each CLI mistake a new user made (issue 24) gives one clear line on stderr, a non-zero exit, no
traceback and no secret. Real SQLite MLflow store; nothing is loaded before the arguments are checked."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tests.support.mlflow_server import sqlite_store

SECRET = "never-print-this-secret-0123456789"


@pytest.fixture()
def run(tmp_path, monkeypatch):
    from specdec.cli import app

    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SPECDEC_TRACKING_URI", sqlite_store(tmp_path / "store"))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)

    def invoke(*args: str):
        r = CliRunner().invoke(app, list(args))
        err = r.stderr if r.stderr_bytes is not None else r.output
        return r.exit_code, err.strip(), r.output

    return invoke


def _one_line(code: int, err: str, out: str, *words: str) -> None:
    assert code != 0, out
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err + out and SECRET not in err + out
    for w in words:
        assert w in err, err


def test_alias_typos_are_refused(run):
    _one_line(*run("pair", "promote", "specdec-pair", "1", "--alias", "champoin"), "unknown alias 'champoin'", "champion, challenger")
    _one_line(*run("nightly", "run", "--alias", "champ"), "unknown alias 'champ'")
    _one_line(*run("pair", "register", "--target", "/nonexistent", "--draft", "ngram", "--alias", "challnger"),
              "unknown alias 'challnger'")


def test_configured_aliases_are_allowed(run, monkeypatch):
    monkeypatch.setenv("SPECDEC_ALIASES", '["champion", "challenger", "canary"]')
    code, err, _ = run("pair", "promote", "specdec-pair", "1", "--alias", "canary")
    assert code == 1 and "unknown alias" not in err and "not registered" in err  # past the alias check


def test_watch_mistakes(run, monkeypatch):
    monkeypatch.delenv("SPECDEC_WATCH_SECRET", raising=False)
    _one_line(*run("pair", "watch"), "SPECDEC_WATCH_SECRET")
    monkeypatch.setenv("SPECDEC_WATCH_SECRET", SECRET)
    _one_line(*run("pair", "watch", "--listen", "nowhere"), "--listen must be HOST:PORT")
    _one_line(*run("pair", "watch"), "need an MLflow server")
    _one_line(*run("pair", "watch", "--tracking-uri", "http://127.0.0.1:9"), "PREFECT_API_URL is not set")


def test_bad_derived_draft_is_refused_before_the_target_loads(run, tmp_path):
    # the target does not exist: had it been loaded first, the error would name the target
    _one_line(*run("validate", "--target", str(tmp_path / "no-such-target"), "--draft", "derived:int3",
                   "--out", str(tmp_path / "out")), "--draft derived:int3", "derived:int8")


def test_unknown_engine_and_a_rule_the_engine_does_not_use_are_refused_before_loading(run):
    _one_line(*run("pair", "register", "--target", "/nonexistent", "--draft", "ngram", "--engine", "tgi"),
              "unknown engine 'tgi'")
    _one_line(*run("pair", "register", "--target", "/nonexistent", "--draft", "ngram", "--engine", "transformers",
                   "--temperature", "0.7", "--draft-sampling", "argmax"), "engine transformers proposes drafts by sampled")


def test_home_that_is_a_file_and_a_bad_channel_url_are_one_line(run, tmp_path, monkeypatch):
    afile = tmp_path / "afile"
    afile.write_text("x")
    monkeypatch.setenv("SPECDEC_HOME", str(afile))
    _one_line(*run("history"), "is not a directory")
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SPECDEC_ALERT_CHANNELS", f'[{{"type": "webhook", "url": "https://hooks.example.com:{SECRET}/x"}}]')
    _one_line(*run("alerts", "test"), "alert_channels.0.url", "invalid host or port")


def test_tracking_uri_flag_with_a_token_where_the_port_goes(run):
    _one_line(*run("pair", "list", "--tracking-uri", f"http://admin:pw@127.0.0.1:{SECRET}/"), "cannot be parsed")


def test_a_budget_no_prompt_can_fit_is_refused(run, tmp_path):
    """issue 32, minor: ``--max-new-tokens 1000000000`` was accepted although no prompt fits the context."""
    from tests.support.models import save_tiny_checkpoint

    ckpt = save_tiny_checkpoint(tmp_path / "tiny")
    code, err, out = run("pair", "register", "--target", str(ckpt), "--draft", "ngram", "--max-new-tokens",
                         "1000000000")
    _one_line(code, err, out, "max_new_tokens 1000000000", "context of")


def test_register_help_names_the_draft_sampling_default_it_records(run):
    """issue 32, first use: ``--help`` said ``[default: sampled]`` while a plain register records vLLM's argmax."""
    from typer.testing import CliRunner

    from specdec.cli import app

    out = CliRunner().invoke(app, ["pair", "register", "--help"], env={"COLUMNS": "400"}).output
    assert "default: sampled" not in out and "without --engine: argmax (vllm)" in " ".join(out.split())
