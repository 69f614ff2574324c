"""``specdec pair ...`` end to end through typer's CliRunner on a real SQLite MLflow store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.support.mlflow_server import sqlite_store
from tests.support.reports import tiny_report
from tests.support.models import save_tiny_checkpoint
from tests.support.gate import policy_gate
from tests.support.registry import open_registry_at


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-ckpts")
    return {"target": save_tiny_checkpoint(root / "tiny-target", seed=0),
            "draft": save_tiny_checkpoint(root / "tiny-draft", seed=0, perturb=0.1),
            # 90 embedding rows for a 103-id tokenizer: the draft cannot represent every token id
            "bad": save_tiny_checkpoint(root / "bad-draft", seed=0, vocab_size=90)}


@pytest.fixture()
def cli(tmp_path, monkeypatch):
    from specdec.cli import app

    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "200")  # a wide terminal, so table cells are not folded
    monkeypatch.setenv("SPECDEC_TRACKING_URI", sqlite_store(tmp_path / "store"))
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, ["pair", *map(str, args)], catch_exceptions=False)

    return invoke


def test_register_list_show_promote(cli, ckpts, tmp_path):
    import registry as R

    r = cli("register", "--target", ckpts["target"], "--draft", ckpts["draft"], "-k", 3)
    assert r.exit_code == 0, r.output
    assert "registered models:/specdec-pair/1" in r.output and "(changed: initial)" in r.output
    # local directories are registered under the pair's name, not as server-wide "tiny-target" / "tiny-draft"
    assert "models:/specdec-pair-target/1" in r.output and "models:/specdec-pair-draft/1" in r.output

    again = cli("register", "--target", ckpts["target"], "--draft", f"model:{ckpts['draft']}", "-k", 3)
    assert again.exit_code == 0 and "already registered as models:/specdec-pair/1" in again.output
    assert "(reused)" in again.output

    r = cli("register", "--target", "models:/specdec-pair-target/1", "--draft", "derived:int8", "-k", 3)
    assert r.exit_code == 0, r.output
    assert "registered models:/specdec-pair/2" in r.output and "models:/specdec-pair-target-derived-int8/1" in r.output
    r = cli("register", "--target", ckpts["target"], "--draft", "ngram", "--temperature", 0.7, "--top-p", 0.9)
    assert r.exit_code == 0 and "models:/specdec-pair/3" in r.output

    registry = open_registry_at()
    pv3 = R.get_pair_version("specdec-pair", "3", download=False, registry=registry)
    assert pv3.drafter_kind == "ngram" and pv3.config.sampling.temperature == 0.7 and pv3.config.sampling.top_p == 0.9
    pv2 = R.get_pair_version("specdec-pair", "2", download=False, registry=registry)
    assert pv2.compatibility["compatible"] is True and pv2.drafter_kind == "derived:int8"

    R.log_validation("specdec-pair", "1", tiny_report(0.75, (0.7, 0.8), num_speculative_tokens=3), tmp_path / "rep", gate=policy_gate(), registry=registry)

    r = cli("list")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    row1 = next(line for line in lines if line.strip().startswith("│ 1 "))
    assert "passed acceptance 0.750" in row1 and "model" in row1 and "k=3 T=0" in row1
    assert "passed: acc 0.75 [0.70-0.80] at k=3" in row1  # the version's description
    row3 = next(line for line in lines if line.strip().startswith("│ 3 "))
    assert "ngram" in row3 and "never" in row3

    r = cli("promote", "specdec-pair", "2")
    assert r.exit_code == 1 and "never validated" in r.output and "--force" in r.output
    r = cli("promote", "specdec-pair", "2", "--force")
    assert r.exit_code == 1 and "needs a reason" in r.output
    r = cli("promote", "specdec-pair", "1")
    assert r.exit_code == 0 and "specdec-pair@champion -> version 1" in r.output and "gate passed" in r.output
    r = cli("promote", "specdec-pair", "2", "--force", "--reason", "demo override", "--actor", "carol")
    assert r.exit_code == 0 and "(was v1)" in r.output and "forced by carol" in r.output
    r = cli("promote", "specdec-pair", "3", "--alias", "challenger")
    assert r.exit_code == 0

    r = cli("show", "specdec-pair", "champion", "--json")
    assert r.exit_code == 0, r.output
    shown = json.loads(r.stdout)
    assert shown["version"] == "2" and shown["aliases"] == ["champion"]
    assert shown["tags"]["promotion"].endswith("by carol, forced: demo override")
    assert shown["recipe"]["kind"] == "int8" and shown["latest_validation"] is None
    r = cli("show", "specdec-pair", "1")
    assert r.exit_code == 0 and "acceptance_rate" in r.output and "models:/specdec-pair-target/1" in r.output
    newest = json.loads(cli("show", "specdec-pair", "--json").stdout)  # no version: the newest
    assert newest["version"] == "3", newest["version"]
    assert "vllm" in r.output and "--speculative-config" in r.output  # what to copy into serving
    sc = json.loads(cli("show", "specdec-pair", "1", "--json").stdout)["serving_config"]
    assert sc["engine"] == "vllm" and sc["speculative_config"] == {  # the checkpoint vLLM loads, not an MLflow URI
        "method": "draft_model", "model": str(Path(ckpts["draft"]).resolve()), "num_speculative_tokens": 3,
        "draft_sample_method": "greedy"}
    r = cli("list")
    assert "@challenger" in r.output and "@champion" in r.output


def test_incompatible_draft_is_refused_before_registering(cli, ckpts):
    import registry as R

    r = cli("register", "--target", ckpts["target"], "--draft", ckpts["bad"])
    assert r.exit_code == 1
    assert "incompatible draft/target pair" in r.output and "90 embedding rows" in r.output
    assert "Traceback" not in r.output
    with pytest.raises(R.ModelNotFound):  # nothing was registered
        R.get_model_version("models:/specdec-pair-target/1", registry=open_registry_at())


def test_clear_errors(cli, ckpts, tmp_path):
    r = cli("list", "no-such-pair")
    assert r.exit_code == 1 and "pair 'no-such-pair' is not registered" in r.output
    r = cli("show", "specdec-pair", "1")
    assert r.exit_code == 1 and "not registered" in r.output
    r = cli("register", "--target", tmp_path / "nowhere", "--draft", "ngram")
    assert r.exit_code == 1 and "not found" in r.output
    r = cli("register", "--target", ckpts["target"], "--draft", "derived:int3")
    assert r.exit_code == 1 and "derived:int8" in r.output
    r = cli("register", "--target", ckpts["target"], "--draft", "ngram", "--name", "bad name")
    assert r.exit_code == 1 and "invalid registered model name" in r.output
    r = cli("register", "--target", "models:/ghost/3", "--draft", "ngram")
    assert r.exit_code == 1 and "models:/ghost/3 not found" in r.output
    r = cli("list", "--tracking-uri", "http://127.0.0.1:9")
    assert r.exit_code == 1 and "unreachable" in r.output
    # an unknown engine is refused first (the target does not exist either): one line, no traceback
    r = cli("register", "--target", tmp_path / "nowhere", "--draft", "ngram", "--engine", "tgi")
    assert r.exit_code == 1 and "unknown engine 'tgi': use vllm, sglang, transformers or llamacpp" in r.output
    assert "not found" not in r.output and "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1


def test_register_records_the_engine(cli, ckpts):
    r = cli("register", "--target", ckpts["target"], "--draft", "ngram", "--engine", "sglang")
    assert r.exit_code == 0, r.output
    assert "engine  sglang" in r.output
    shown = json.loads(cli("show", "specdec-pair", "1", "--json").stdout)
    assert shown["tags"]["engine"] == "sglang"


def test_pair_list_without_a_name_lists_every_pair(cli, ckpts):
    """issue 32, first use: ``pair list`` without a name failed on the default pair name (a user's pair
    has another name) instead of listing."""
    r = cli("list")
    assert r.exit_code == 0 and "no pairs registered yet" in r.output, r.output
    assert cli("register", "--target", ckpts["target"], "--draft", "ngram", "--name", "my-pair").exit_code == 0
    r = cli("list")
    assert r.exit_code == 0 and "my-pair versions" in r.output and "specdec-pair" not in r.output, r.output
