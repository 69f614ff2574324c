"""``specdec draft train eagle3`` end to end on a tiny target (typer's CliRunner, the real ``specdec`` app
with its plugins): one-line errors before any model loads, training, --register with lineage."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tests.training.eagle3_support import tiny_target_dir
from tests.support.registry import open_registry_at

runner = CliRunner()
QUICK = ["--sequences", "8", "--response-tokens", "40", "--draft-vocab-size", "64", "--epochs", "1",
         "--aux-layer-ids", "0,1,2", "--quiet"]


@pytest.fixture(scope="module")
def app():
    from specdec.cli import app

    return app


@pytest.mark.parametrize("args,message", [
    (["--recipe", "web"], "unknown data recipe 'web'"),
    (["--from", "/nonexistent/head"], "--from /nonexistent/head: no EAGLE-3 head there"),
    (["--corpus", "/nonexistent.jsonl"], "--corpus /nonexistent.jsonl: no such file"),
    (["--aux-layer-ids", "2,x"], "expected comma-separated integers"),
])
def test_bad_arguments_fail_in_one_line_before_loading(app, tmp_path, args, message):
    res = runner.invoke(app, ["draft", "train", "eagle3", "--target", "/nonexistent/target", "--out",
                              str(tmp_path / "h"), *args])
    assert res.exit_code == 1, res.output
    assert message in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_train_writes_a_head_and_registers_it_with_lineage(app, tmp_path, monkeypatch):
    from tests.support.mlflow_server import sqlite_store

    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SPECDEC_TRACKING_URI", sqlite_store(tmp_path / "store"))
    target = tiny_target_dir(tmp_path / "t")
    bad = runner.invoke(app, ["draft", "train", "eagle3", "--target", str(target), "--out", str(tmp_path / "x"),
                              "--sequences", "8", "--quiet", "--aux-layer-ids", "0,1,9"])
    assert bad.exit_code == 1 and "outside" in bad.output and len(bad.output.strip().splitlines()) == 1
    res = runner.invoke(app, ["draft", "train", "eagle3", "--target", str(target), "--out", str(tmp_path / "h"),
                              *QUICK, "--register", "pair-cli"])
    assert res.exit_code == 0, res.output
    assert "head written" in res.output and "registered pair-cli v1 (eagle3, head models:/pair-cli-eagle3/1) as @challenger" in res.output
    assert json.loads((tmp_path / "h" / "config.json").read_text())["speculators_model_type"] == "eagle3"
    again = runner.invoke(app, ["draft", "train", "eagle3", "--target", str(target), "--out", str(tmp_path / "h2"),
                                *QUICK, "--from", "models:/pair-cli@challenger", "--register", "pair-cli"])
    assert again.exit_code == 0, again.output
    from specdec.training.eagle3 import WARM_START_DEFAULTS, Eagle3TrainConfig

    fresh, warm = (json.loads((tmp_path / d / "training.json").read_text())["config"] for d in ("h", "h2"))
    assert fresh["lr"] == Eagle3TrainConfig().lr and fresh["max_minutes"] == Eagle3TrainConfig().max_minutes
    assert warm["lr"] == WARM_START_DEFAULTS["lr"] and warm["max_minutes"] == WARM_START_DEFAULTS["max_minutes"]
    assert warm["epochs"] == fresh["epochs"] == 1  # given options win over either default set
    import registry as R

    registry = open_registry_at()
    head = R.get_model_version(R.get_pair_version("pair-cli", "challenger", download=False, registry=registry).draft_uri, registry=registry)
    assert head.tags["eagle3.parent"] == "models:/pair-cli-eagle3/1"
