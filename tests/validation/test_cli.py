"""`specdec validate` end to end on tiny local checkpoints (in-process via typer's CliRunner)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specdec.cli import app
from specdec.validation.report import ValidationReport
from tests.support.models import save_tiny_checkpoint

runner = CliRunner()


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return save_tiny_checkpoint(root / "target", seed=0), save_tiny_checkpoint(root / "draft", seed=0, perturb=0.03)


@pytest.fixture(scope="module")
def heldout_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("heldout") / "mine.jsonl"
    rows = [{"id": f"q{i}", "category": ["chat", "code"][i % 2], "prompt": f"tell me about item {i} please"} for i in range(6)]
    rows.append({"id": "too-long", "category": "chat", "text": "y" * 700})
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def _invoke(*args):
    return runner.invoke(app, ["validate", *map(str, args)], env={"COLUMNS": "200"})


def test_validate_model_drafter_end_to_end(ckpts, heldout_file, tmp_path):
    target, draft = ckpts
    out = tmp_path / "out"
    res = _invoke(
        "--target", target, "--draft", f"model:{draft}", "--heldout", heldout_file,
        "--max-new-tokens", 12, "--num-speculative-tokens", 3, "--device", "cpu", "--out", out,
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "overall" in res.output and "chat" in res.output and "code" in res.output
    assert "acceptance" in res.output and "α_tf" in res.output
    report = ValidationReport.read(out)
    assert report.drafter_kind == "model" and report.drafter_ref == str(draft)
    assert report.heldout_name == "mine" and report.config["num_speculative_tokens"] == 3
    assert report.dtype == "float32" and report.device == "cpu"
    assert report.overall.num_prompts == 6 and report.overall.num_skipped == 1
    assert 0 < report.alpha_tf < 1 and report.overall.exactness_mismatches == 0
    assert (out / "prompts.csv").read_text().count("\n") == 1 + 7
    # the serving config for the validated k (greedy, sampled rule -> vLLM), written and printed
    serving = json.loads((out / "serving_config.json").read_text())
    assert serving["engine"] == "vllm" and serving["speculative_config"] == {
        "method": "draft_model", "model": str(draft), "num_speculative_tokens": 3, "draft_sample_method": "greedy"}
    assert "--speculative-config" in res.output
    # refuses to overwrite an existing report unless asked
    again = _invoke("--target", target, "--draft", "ngram", "--heldout", heldout_file, "--out", out)
    assert again.exit_code == 1 and "already exists" in again.output


def test_validate_several_drafters_shipped_set(ckpts, tmp_path):
    target, _ = ckpts
    res = _invoke(
        "--target", target, "--draft", "ngram", "--draft", "derived:int8", "--heldout", "spec_bench",
        "--limit", 6, "--max-new-tokens", 8, "--out", tmp_path,
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    ngram = ValidationReport.read(tmp_path / "ngram")
    int8 = ValidationReport.read(tmp_path / "derived_int8")
    assert ngram.drafter_kind == "ngram" and int8.drafter_kind == "derived:int8"
    assert int8.drafter_recipe["kind"] == "int8"
    # one category per Spec-Bench subtask; the 512-token tiny context skips the long ones
    assert len(ngram.prompts) == 6 and {p.category for p in ngram.prompts} == {
        "mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"
    }  # fmt: skip
    assert any(p.status == "skipped" and "too long" in p.skip_reason for p in ngram.prompts)
    assert [p.target_only_seconds for p in ngram.prompts] == [p.target_only_seconds for p in int8.prompts]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--draft", "derived:int3"], "derived:int3"),
        (["--draft", "ngram:x"], "--draft ngram:x: bad n-gram spec"),  # ':x:' printed as text, not as an emoji
        (["--draft", "ngram", "--top-p", "1.5"], "top_p"),
        (["--draft", "model:/nonexistent/draft"], "not found"),
        (["--draft", "ngram", "--device", "tpu"], "unknown device"),
    ],
)
def test_bad_input_exits_1_with_a_message(ckpts, heldout_file, tmp_path, args, message):
    target, _ = ckpts
    res = _invoke("--target", target, "--heldout", heldout_file, "--out", tmp_path / "o", *args)
    assert res.exit_code == 1, res.output
    assert message in res.output and "Traceback" not in res.output


def test_malformed_heldout_and_missing_target(ckpts, tmp_path):
    target, _ = ckpts
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "category": "c", "prompt": "ok"}\n{"id": "2", "category": "c", "prompt": \n')
    res = _invoke("--target", target, "--draft", "ngram", "--heldout", bad, "--out", tmp_path / "o")
    assert res.exit_code == 1 and f"{bad}:2" in res.output.replace("\n", "")
    res = _invoke("--target", tmp_path / "no-model", "--draft", "ngram", "--heldout", "humaneval", "--out", tmp_path / "o")
    assert res.exit_code == 1 and "target" in res.output


def test_all_prompts_skipped_writes_report_and_exits_1(ckpts, tmp_path):
    target, _ = ckpts
    f = tmp_path / "long.jsonl"
    f.write_text(json.dumps({"id": "1", "category": "c", "text": "z" * 900}) + "\n")
    res = _invoke("--target", target, "--draft", "ngram", "--heldout", f, "--out", tmp_path / "o")
    assert res.exit_code == 1 and "no prompt could be validated" in res.output
    report = ValidationReport.read(tmp_path / "o")  # nothing already measured is lost
    assert report.prompts[0].status == "skipped" and report.overall.num_prompts == 0
