"""ValidationReport JSON + prompts.csv round-trip, on a report that validate really produced."""

from __future__ import annotations

import copy
import json
import math

import pytest

from specdec import NgramDrafter
from specdec.validation.heldout import HeldoutPrompt, HeldoutSet, content_version
from specdec.validation.report import SCHEMA_VERSION, GroupMetrics, ValidationReport
from tests.support.models import tiny_llama, tiny_tokenizer
from specdec.validation import ValidationConfig, ValidationRequest, validate


@pytest.fixture(scope="module")
def report():
    prompts = [HeldoutPrompt(id=f"r{i}", category="xy"[i % 2], text="abcabcabc abc " * (i + 1)) for i in range(4)]
    prompts.append(HeldoutPrompt(id="blank", category="x", text=""))
    hs = HeldoutSet("rt", content_version(prompts), prompts)
    cfg = ValidationConfig(num_speculative_tokens=3, max_new_tokens=10, bootstrap_resamples=200)
    return validate(ValidationRequest(tiny_llama(seed=0), [NgramDrafter()], hs, cfg, tokenizer=tiny_tokenizer(), target_ref="tiny"))[0]


def test_json_and_csv_round_trip(report, tmp_path):
    path = report.write(tmp_path)
    data = json.loads(path.read_text())
    assert data["schema_version"] == SCHEMA_VERSION == 4 and "prompts" not in data
    for name in (
        "acceptance_rate", "mean_accepted_length", "alpha_tf", "top1_agreement", "total_variation",
        "kl_divergence", "speedup", "predicted_speedup", "recommended_num_speculative_tokens",
    ):  # fmt: skip
        assert name in data["overall"]
    assert data["overall"]["kl_divergence"] is None  # NaN (undefined for n-gram) -> null
    back = ValidationReport.read(tmp_path)
    assert back.to_dict(include_prompts=True) == report.to_dict(include_prompts=True)
    assert back.prompts[-1].status == "skipped" and back.prompts[-1].skip_reason == "empty prompt"
    assert back.acceptance_rate == report.overall.acceptance_rate  # headline accessor
    assert math.isnan(back.overall.kl_divergence)


def test_reads_reports_without_the_newer_fields(report, tmp_path):
    d = report.to_dict(include_prompts=False)
    for k in ("environment", "notes", "drafter_recipe", "heldout_source_version"):
        d.pop(k)
    for k in ("tf_coverage", "drafted_per_position", "target_pass_seconds", "predicted_speedup_at_recommended"):
        d["overall"].pop(k)
    back = ValidationReport.from_dict(d)
    assert back.notes == [] and isinstance(back.overall, GroupMetrics) and math.isnan(back.overall.tf_coverage)
    assert back.overall.acceptance_rate == report.overall.acceptance_rate
    with pytest.raises(ValueError, match="schema_version"):
        ValidationReport.from_dict({**d, "schema_version": 99})


def test_reads_schema_1_reports_written_before_k_was_renamed(report):
    d = report.to_dict()
    legacy = {**copy.deepcopy(d), "schema_version": 1}
    legacy["config"]["num_draft_tokens"] = legacy["config"].pop("num_speculative_tokens")
    for group in [legacy["overall"], *legacy["categories"].values()]:
        group["num_draft_tokens_k"] = group.pop("num_speculative_tokens")
        group["recommended_num_draft_tokens"] = group.pop("recommended_num_speculative_tokens")
    back = ValidationReport.from_dict(legacy)
    assert back.schema_version == SCHEMA_VERSION and back.method == "decode" and back.replay is None and back.config["num_speculative_tokens"] == 3
    assert back.overall.num_speculative_tokens == 3
    assert back.to_dict() == d


def test_notes_flag_estimator_disagreement_and_slow_drafts(report):
    from specdec.validation.findings import findings

    g = GroupMetrics(
        num_prompts=5, num_speculative_tokens=4, alpha_hat=0.3, alpha_hat_ci=[0.25, 0.35], alpha_tf=0.5,
        alpha_tf_ci=[0.45, 0.55], speedup=0.6, predicted_speedup=0.7, predicted_speedup_at_recommended=0.8,
        recommended_num_speculative_tokens=1, cost_ratio=1.4, verify_cost_ratio=1.2, predicted_cost_ratio=1.4,
        verify_cost_by_n=[1.0, 1.1, 1.15, 1.2, 1.25],
    )  # fmt: skip
    d = report.to_dict()
    d["overall"] = {**d["overall"], **g.__dict__}
    notes = findings(ValidationReport.from_dict(d))
    assert any("disagree beyond their 95% CIs" in n for n in notes)
    assert any("SLOWER than target-only" in n and "0.60x" in n and "v(k)=1.25" in n for n in notes)


def test_a_measurement_far_from_the_prediction_is_flagged_not_reported(report):
    """The issue's case: measured 2.05x against a predicted 1.54x is a timing bias, not a finding."""
    from specdec.validation.findings import findings

    g = GroupMetrics(num_prompts=6, num_speculative_tokens=6, speedup=2.05, predicted_speedup=1.54,
                     measured_over_predicted=2.05 / 1.54, timing_suspect=True, load_avg_1m_max=3.1, num_cpus=2)
    d = report.to_dict()
    d["overall"] = {**d["overall"], **g.__dict__}
    notes = findings(ValidationReport.from_dict(d))
    assert any(n.startswith("timing suspect") and "1.33 of the predicted 1.54x" in n and "load avg 3.1 on 2 CPUs" in n
               for n in notes)


def test_reads_schema_3_reports_with_the_old_speed_fields(report):
    d = copy.deepcopy(report.to_dict())
    d["schema_version"] = 3
    d["overall"]["predicted_speedup_verify_adjusted"] = 1.1  # gone in schema 4: dropped, nothing crashes
    for k in ("verify_cost_by_n", "timing_suspect", "speedup_pooled", "recommended_k_basis"):
        d["overall"].pop(k)
    back = ValidationReport.from_dict(d)
    assert back.overall.verify_cost_by_n == [] and back.overall.timing_suspect is None
    assert back.overall.speedup == report.overall.speedup


def test_speed_evidence_in_the_report(report, tmp_path):
    g = report.overall
    lo, hi = g.speedup_ci
    assert g.speedup > 0 and lo <= hi and lo <= g.speedup * 1.05 and hi >= g.speedup * 0.95
    assert g.num_cpus >= 1 and g.load_avg_1m >= 0 and g.load_avg_1m_max >= g.load_avg_1m
    ok = [p for p in report.prompts if p.status == "ok"]
    assert all(p.load_avg_1m >= 0 for p in ok)
    back = ValidationReport.read(report.write(tmp_path))
    assert back.overall.speedup_ci == pytest.approx(g.speedup_ci)
    assert [p.load_avg_1m for p in back.prompts[:4]] == pytest.approx([p.load_avg_1m for p in ok])


def test_reads_schema_2_reports_as_decode_method(report):
    d = report.to_dict()
    old = {k: v for k, v in copy.deepcopy(d).items() if k not in ("method", "replay")}
    old["schema_version"] = 2
    back = ValidationReport.from_dict(old)
    assert back.method == "decode" and back.replay is None and back.to_dict() == d


def test_the_engine_check_section_round_trips(report, tmp_path):
    """A report's ``engine_check`` section (an :class:`EngineCheckReport`) is written and read back with the report,
    nan included; a report without one (and one written before the section existed) reads it as None."""
    from specdec.validation.engine_delivery import Delivery, EngineFinding, StepFigures
    from specdec.validation.engine_report import EngineCheckReport, EngineGroup, EnginePromptResult

    engine = EngineCheckReport(
        engine="llamacpp", url="http://127.0.0.1:1", heldout_name="rt", heldout_version="1", target_ref="t.gguf",
        drafter_ref="d.gguf", config={"num_speculative_tokens": 3}, concurrency=1, fingerprint={"flags": ("-m", "t")},
        counters_source="per-request timings", overall=EngineGroup(num_prompts=2, engine_acceptance_rate=0.5),
        categories={"x": EngineGroup(num_prompts=1)}, engine_per_position=[3, 1], core_per_position=[3, 1],
        engine_num_drafts=None, audit={"checked": 2}, speed={"speedup": math.nan, "speedup_ci": [math.nan, math.nan]},
        verdict="agrees", prompts=[EnginePromptResult("r0", "x", engine_seconds=0.5)],
        findings=[EngineFinding("delivery", "drafts less")], delivery=Delivery(StepFigures(drafts=4), StepFigures()))
    with_engine = copy.deepcopy(report)
    with_engine.engine_check = engine
    back = ValidationReport.read(with_engine.write(tmp_path / "engine"))
    assert isinstance(back.engine_check, EngineCheckReport) and back.engine_check.to_dict() == engine.to_dict()
    assert math.isnan(back.engine_check.overall.core_acceptance_rate) and back.engine_check.findings[0].kind == "delivery"
    assert back.engine_check.delivery.engine.drafts == 4 and math.isnan(back.engine_check.speed["speedup"])
    assert report.engine_check is None and ValidationReport.read(report.write(tmp_path / "plain")).engine_check is None
    older = report.to_dict()
    older.pop("engine_check")
    assert ValidationReport.from_dict(older).engine_check is None
