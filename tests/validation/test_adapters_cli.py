"""`specdec validate --target BASE --target-adapter DIR`: the same greedy acceptance, prompt by prompt, as validating
the merged checkpoint; the report names the adapter; a base the adapter does not fit is one error line."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specdec.cli import app
from specdec.models.hashes import weights_sha256
from specdec.validation.report import ValidationReport
from tests.support.adapters import save_lora_adapter, save_merged
from tests.support.models import save_tiny_checkpoint

runner = CliRunner()
COUNTERS = ("status", "new_tokens", "num_drafts", "num_draft_tokens", "num_accepted_tokens", "exact_match")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapter-cli")
    base = save_tiny_checkpoint(root / "base", seed=0, init_std=0.1)  # greedy output repeats: n-grams hit
    adapter = save_lora_adapter(base, root / "support-v3", seed=1)
    heldout = root / "mine.jsonl"
    rows = [{"id": f"q{i}", "category": ["chat", "code"][i % 2], "prompt": f"tell me about item {i} {i} {i} please"}
            for i in range(6)]
    heldout.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return {"base": base, "adapter": adapter, "merged": save_merged(base, adapter, root / "merged"), "root": root,
            "heldout": heldout}


def _validate(dirs, out, *target_args, method="decode"):
    args = ["validate", *target_args, "--draft", "ngram", "--heldout", dirs["heldout"], "--max-new-tokens", 48,
            "-k", 3, "--device", "cpu", "--out", out, "--bootstrap-resamples", 50, "--method", method]
    return runner.invoke(app, list(map(str, args)), env={"COLUMNS": "200", "SPECDEC_HOME": str(dirs["root"] / "home")})


def _counters(report):
    return [tuple(getattr(p, c) for c in COUNTERS) for p in report.prompts]


def test_adapted_target_validates_as_the_merged_checkpoint(dirs, tmp_path):
    runs = {"adapted": ("--target", dirs["base"], "--target-adapter", dirs["adapter"]),
            "merged": ("--target", dirs["merged"]), "base": ("--target", dirs["base"])}
    reports, printed = {}, {}
    for name, args in runs.items():
        res = _validate(dirs, tmp_path / name, *args)
        assert res.exit_code == 0, res.output
        reports[name], printed[name] = ValidationReport.read(tmp_path / name), res.output
    adapted, merged, base = reports["adapted"], reports["merged"], reports["base"]
    assert adapted.overall.acceptance_rate == merged.overall.acceptance_rate
    assert adapted.overall.num_accepted_tokens == merged.overall.num_accepted_tokens > 0
    assert _counters(adapted) == _counters(merged)  # prompt by prompt: the same tokens, the same drafts accepted
    assert _counters(adapted) != _counters(base)  # and the adapter does move the output
    assert adapted.overall.exactness_mismatches == 0
    assert adapted.target_adapter == {"name": "support-v3", "ref": str(dirs["adapter"].resolve()),
                                      "weights_hash": weights_sha256(dirs["adapter"]), "base_hash": None, "rank": 4,
                                      "target_modules": ["q_proj", "v_proj"]}
    assert adapted.draft_adapter is None and merged.target_adapter is None
    assert f"ngram drafter for {dirs['base']} + adapter support-v3 on mine" in printed["adapted"]


def test_a_base_the_adapter_does_not_fit_is_one_error_line(dirs, tmp_path):
    wider = save_tiny_checkpoint(dirs["root"] / "wider", seed=0, hidden_size=48)
    res = _validate(dirs, tmp_path / "wider", "--target", wider, "--target-adapter", dirs["adapter"])
    assert res.exit_code == 1
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    err = [ln for ln in lines if ln.startswith("error:")]
    assert err == [ln for ln in lines if "does not fit" in ln] and len(err) == 1, res.output
    assert "error: target: adapter support-v3 does not fit base LlamaForCausalLM: model.layers.0.self_attn.q_proj" in err[0]
    assert "Traceback" not in res.output and not (tmp_path / "wider" / "report.json").exists()
    res = _validate(dirs, tmp_path / "x", "--target", dirs["base"], "--draft-adapter", dirs["adapter"])
    assert res.exit_code == 1 and "error: drafter ngram: a draft adapter adapts a draft model" in res.output


def test_replay_of_the_adapted_target_never_reads_the_bases_continuations(dirs, tmp_path):
    """The continuation cache keys an adapted target by base + adapter: replaying the base first (its continuations
    cached) and then base + adapter gives the merged checkpoint's replay, not the base's."""
    reports = {}
    for name, args in (("base", ("--target", dirs["base"])),
                       ("adapted", ("--target", dirs["base"], "--target-adapter", dirs["adapter"])),
                       ("merged", ("--target", dirs["merged"]))):
        res = _validate(dirs, tmp_path / name, *args, method="replay")
        assert res.exit_code == 0, res.output
        reports[name] = ValidationReport.read(tmp_path / name)
    counts = {n: (r.overall.num_draft_tokens, r.overall.num_accepted_tokens) for n, r in reports.items()}
    assert counts["adapted"] == counts["merged"] != counts["base"]
