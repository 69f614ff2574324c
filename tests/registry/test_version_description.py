"""What the MLflow UI shows of a pair version: a one-line description whose first 29 characters
(all the versions table shows) hold the verdict and the acceptance rate with its CI, and at most 10
tags; everything else stays in pair.json and the validation run. Real SQLite MLflow store."""

from __future__ import annotations

import pytest

from registry.describe import (TABLE_DESCRIPTION_CHARS, VERSION_TAG_KEYS, VersionFacts, describe,
                               plain_text, validation_version_tags)
from tests.support.mlflow_server import sqlite_store
from tests.support.reports import tiny_report
from tests.support.models import save_tiny_checkpoint
from tests.support.gate import policy_gate
from tests.support.registry import open_registry_at


def test_headline_fits_the_versions_table():
    f = VersionFacts(status="failed", acceptance_rate=0.4512, acceptance_ci=(0.398, 0.5001), k=4, speedup=1.314,
                     speedup_ci=(1.1, 1.52), heldout="spec_bench", num_prompts=48, changed="target",
                     previous_version="1", date="2026-11-30", promotion="champion 2026-11-30 by bob, forced: hotfix",
                     holds_alias=True)
    line = describe(f)
    assert line == ("failed: acc 0.45 [0.39-0.51] at k=4 · speedup 1.31x [1.10-1.52] · spec_bench, 48 prompts · "
                    "target changed since v1 · 2026-11-30 · \\@champion 2026-11-30 by bob, forced: hotfix")
    # the CI is rounded outwards: a lower end of 0.398 never reads as the 0.40 threshold
    assert line[:TABLE_DESCRIPTION_CHARS] == "failed: acc 0.45 [0.39-0.51] "
    assert "\n" not in line
    # the per-token metric (the policy's default) is named, with vLLM's rate at k beside it, after the headline
    tok = describe(VersionFacts(status="passed", acceptance_rate=0.553, acceptance_ci=(0.51, 0.59), metric="α",
                                rate=0.232, k=5))
    assert tok == "passed: α 0.55 [0.51-0.59] (rate 0.23 at k=5)"
    assert tok[:TABLE_DESCRIPTION_CHARS].startswith("passed: α 0.55 [0.51-0.59]")
    never = describe(VersionFacts(k=3, changed="initial", date="2026-11-29", note="first try\nof int8"))
    assert never == "not validated at k=3 · first version · registered 2026-11-29 · first try of int8"
    nan = describe(VersionFacts(status="failed", acceptance_rate=float("nan"), k=2))
    assert nan == "failed: acc n/a at k=2"
    with pytest.raises(ValueError, match="must be one of"):
        validation_version_tags("ok", {}, None)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("describe-ckpt")
    return save_tiny_checkpoint(root / "t1", seed=3), save_tiny_checkpoint(root / "t2", seed=3, perturb=0.05)


def test_register_validate_promote_keeps_ten_tags_and_one_line(ckpts, tmp_path, monkeypatch):
    from mlflow import MlflowClient

    import registry as R

    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    uri = sqlite_store(tmp_path / "store")
    client = MlflowClient(uri, registry_uri=uri)
    registry = open_registry_at(uri)
    t1 = R.register_model_version("target", ckpts[0], registry=registry)
    t2 = R.register_model_version("target", ckpts[1], registry=registry)
    pv1 = R.register_pair(t1, None, drafter_kind="ngram", config=R.SpeculativeConfig(3), description="baseline",
                          registry=registry)
    pv2 = R.register_pair(t2, None, drafter_kind="ngram", config=R.SpeculativeConfig(3), registry=registry)
    day = pv1.created_at[:10]
    assert client.get_model_version("specdec-pair", "1").description == f"not validated at k=3 · first version · registered {day} · baseline"
    assert client.get_model_version("specdec-pair", "2").description == f"not validated at k=3 · target changed since v1 · registered {day}"

    run1 = R.log_validation("specdec-pair", "1", tiny_report(0.72, (0.65, 0.79), num_speculative_tokens=3), tmp_path / "r1",
                            registry=registry, gate=policy_gate())
    R.log_validation("specdec-pair", "2", tiny_report(0.30, (0.22, 0.38), num_speculative_tokens=3), tmp_path / "r2",
                     registry=registry, gate=policy_gate())
    R.promote("specdec-pair", "1", actor="alice", registry=registry, gate=policy_gate())
    R.promote("specdec-pair", "2", "challenger", actor="alice", registry=registry, gate=policy_gate())

    v1, v2 = (client.get_model_version("specdec-pair", v) for v in ("1", "2"))
    for mv in (v1, v2):
        assert set(mv.tags) <= set(VERSION_TAG_KEYS) and len(mv.tags) <= 10, sorted(mv.tags)
    assert {k: v1.tags[k] for k in ("validation_status", "acceptance_rate", "speedup", "policy", "changed",
                                      "drafter_kind", "target", "draft", "num_speculative_tokens")} == {
        "validation_status": "passed", "acceptance_rate": "0.720", "speedup": "1.35", "policy": "acceptance_rate ci_low>=0.40",
        "changed": "initial", "drafter_kind": "ngram", "target": "models:/target/1", "draft": "none",
        "num_speculative_tokens": "3"}
    assert v1.tags["promotion"].endswith("by alice (gate passed)") and v2.tags["changed"] == "target"
    assert v1.description.startswith("passed: acc 0.72 [0.65-0.79] at k=3 (α 0.72) · floor 0.40 (policy default) · "
                                      "speedup 1.35x · tiny-heldout, 9 prompts · "
                                      "first version · 2026-01-01 · \\@champion ")
    # the path from the version to its evidence: a link to its latest validation run (not the registration run)
    run1_route = f"#/experiments/{client.get_run(run1).info.experiment_id}/runs/{run1}?workflowType=machine_learning"
    assert v1.description.endswith(f"by alice (gate passed) · baseline · [validation run]({run1_route})")
    assert v2.description.startswith("failed: acc 0.30 [0.22-0.38] at k=3 (α 0.30) · floor 0.40 (policy default) · "
                                      "speedup 1.35x · tiny-heldout, 9 prompts · "
                                      "target changed since v1 · 2026-01-01 · \\@challenger ")

    # what left the version tags is still in pair.json, and the API reads it back
    back = R.get_pair_version("specdec-pair", "2", download=False, registry=registry)
    assert back.tags["target.weights_sha256"] == t2.weights_sha256 and "target.weights_sha256" not in v2.tags
    assert back.config == R.SpeculativeConfig(3) and back.description == plain_text(v2.description) and "[validation run]" not in back.description
    listed = R.list_pair_versions("specdec-pair", registry=registry)
    assert [x.target_weights_sha256 for x in listed] == [t2.weights_sha256, t1.weights_sha256]

    # the validation run: readable name, the same line plus links as its description
    run = client.get_run(run1)
    assert run.info.run_name == "specdec-pair v1 night 2026-01-01"
    note = run.data.tags["mlflow.note.content"]
    assert note.startswith("passed: acc 0.72 [0.65-0.79] at k=3 (α 0.72)") and "(#/models/specdec-pair/versions/1)" in note
    assert f"(#/experiments/{run.info.experiment_id}/runs/{run1}/artifactPath/report.json?workflowType=machine_learning)" in note

    # promotion moved @champion to v2 by force: both descriptions follow (v1 no longer holds it)
    R.promote("specdec-pair", "2", force=True, reason="hotfix", actor="bob", registry=registry, gate=policy_gate())
    v1, v2 = (client.get_model_version("specdec-pair", v) for v in ("1", "2"))
    # stored as Markdown: "\@" keeps the MLflow UI from linking @champion to a GitHub user; plain in the CLI
    assert " · was \\@champion " in v1.description and "by bob, forced: hotfix · [validation run](#/" in v2.description
    assert " @champion " in v2.description.replace("\\@", "@") and " @champion" not in v2.description
    assert " · was @champion " in R.get_pair_version("specdec-pair", "1", download=False, registry=registry).description
    assert v1.tags["promotion"].startswith("was champion ")  # no stale "promotion: champion" chip


def test_sampling_mismatch_is_caught_from_pair_json(ckpts, tmp_path, monkeypatch):
    """temperature is not a version tag any more; the gate still sees that a validation used another one."""
    from mlflow import MlflowClient

    import registry as R
    from specdec import SamplingConfig

    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    uri = sqlite_store(tmp_path / "store")
    registry = open_registry_at(uri)
    t = R.register_model_version("target", ckpts[0], registry=registry)
    R.register_pair(t, None, drafter_kind="ngram", config=R.SpeculativeConfig(3, SamplingConfig(temperature=0.7)),
                    registry=registry)
    assert "temperature" not in MlflowClient(uri, registry_uri=uri).get_model_version("specdec-pair", "1").tags
    run = R.log_validation("specdec-pair", "1", tiny_report(0.9, (0.85, 0.95), num_speculative_tokens=3), tmp_path / "r",
                           registry=registry, gate=policy_gate())
    assert "temperature: validated 0.0, pair serves 0.7" in MlflowClient(uri).get_run(run).data.tags["specdec.config_mismatch"]
    assert not R.check_gate("specdec-pair", "1", registry=registry, gate=policy_gate()).passed
