"""`specdec draft recommend` / `validate --draft auto` on tiny local checkpoints: every phase runs,
fp8 is listed as unavailable with its reason, greedy outputs are compared, JSON round-trips.
Speed numbers of tiny models mean nothing; only the structure and the exactness are asserted."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from specdec.cli import app
from specdec.validation.heldout import load_heldout
from specdec.models import load_causal_lm
from specdec.validation.recommend import CandidateResult, recommend_draft
from specdec.validation.report import ValidationReport
from specdec.validation.short_prompts import short_prompts
from tests.support.models import save_tiny_checkpoint
from tests.support.continuations import home_continuations
from tests.support.store import model_store

runner = CliRunner()


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "target", seed=0, hidden_size=64, init_std=0.05)


@pytest.fixture(scope="module")
def heldout_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("heldout") / "mine.jsonl"
    rows = [{"id": f"q{i}", "category": ["chat", "code", "math"][i % 3],
             "prompt": ("abc " * (3 + i)) + f"item {i}"} for i in range(9)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_short_prompts_keeps_every_category_and_prefers_short(target_dir, heldout_file):
    tgt = load_causal_lm(str(target_dir), device="cpu", store=model_store())
    held = load_heldout(str(heldout_file))
    from specdec.validation.heldout import prompt_token_ids

    lengths = {p.id: len(prompt_token_ids(p, tgt.tokenizer)) for p in held.prompts}
    assert lengths["q2"] <= 30 < lengths["q3"]  # one prompt per category is that short
    one = short_prompts(held, tgt.tokenizer, per_category=1, max_prompt_tokens=30, seed=0)
    assert [p.id for p in one.prompts] == ["q0", "q1", "q2"]
    # two per category: the short one plus the next shortest of its category
    two = short_prompts(held, tgt.tokenizer, per_category=2, max_prompt_tokens=30, seed=0)
    assert two.category_counts() == {"chat": 2, "code": 2, "math": 2}
    assert [p.id for p in two.prompts] == ["q0", "q1", "q2", "q3", "q4", "q5"]
    anylen = short_prompts(held, tgt.tokenizer, per_category=3, max_prompt_tokens=None, seed=0)
    assert len(anylen) == 9 and anylen.subset_spec["per_category"] == 3
    with pytest.raises(ValueError):
        short_prompts(held, tgt.tokenizer, per_category=0, max_prompt_tokens=None)


def test_recommend_draft_phases_on_tiny_models(target_dir, heldout_file):
    tgt = load_causal_lm(str(target_dir), device="cpu", store=model_store())
    held = short_prompts(load_heldout(str(heldout_file)), tgt.tokenizer, per_category=1, max_prompt_tokens=None)
    lines = []
    rec = recommend_draft(tgt, held, candidates=["derived:bf16", "derived:int8", "ngram", "derived:fp8"],
                          max_new_tokens=12, k_values=(1, 2, 3), cost_reps=3, bootstrap_resamples=200,
                          progress=lines.append, cache=home_continuations(), store=model_store())
    assert any("phase 4/4" in x for x in lines) and any("replay" in x for x in lines)
    by = {c.spec: c for c in rec.candidates}
    assert not by["derived:fp8"].available and "CUDA" in by["derived:fp8"].reason
    for spec in ("derived:bf16", "derived:int8", "ngram"):
        c = by[spec]
        assert c.available and c.k in (1, 2, 3)  # chosen by the one speed model on the replayed counters
        assert c.compared_outputs == 3 and c.identical_outputs == 3  # greedy: exact
        assert c.measured_speedup > 0 and len(c.speedup_ci) == 2
    for spec in ("derived:bf16", "derived:int8"):
        c = by[spec]
        assert c.cost_ratio > 0 and 0.5 <= c.alpha <= 1 and c.verify_cost >= 1
        assert not math.isnan(c.predicted_speedup) and c.measured_over_predicted > 0 and c.timing_suspect is not None
        kt = c.best_k_tau  # the replayed best (k, tau) next to the best fixed k
        assert kt["num_speculative_tokens"] in (1, 2, 3) and "assistant_confidence_threshold" in kt
    assert by["ngram"].cost_ratio >= 0  # measured in the decoding check (an n-gram has no model pass)
    assert set(rec.verify_cost_by_k) == {1, 2, 3} and rec.verify_cost_by_k[1] > 0
    assert rec.categories == ["chat", "code", "math"] and rec.num_prompts == 3
    assert rec.best in (None, *[c.spec for c in rec.candidates if c.pays])
    assert rec.fallback in by and "native" in rec.native_bf16
    d = json.loads(json.dumps(rec.to_dict()))
    assert {c["spec"] for c in d["candidates"]} == set(by) and "pays" in d["candidates"][0]
    assert rec.summary


def test_pays_needs_identical_outputs_and_a_gain():
    ok = CandidateResult(spec="x", measured_speedup=1.2, identical_outputs=4, compared_outputs=4)
    assert ok.pays
    assert not CandidateResult(spec="x", measured_speedup=1.2, identical_outputs=3, compared_outputs=4).pays
    assert not CandidateResult(spec="x", measured_speedup=0.99, identical_outputs=4, compared_outputs=4).pays
    # faster on average, but the CI includes 1.0x: not credibly faster
    assert not CandidateResult(spec="x", measured_speedup=1.15, speedup_ci=[0.89, 1.95], identical_outputs=4,
                               compared_outputs=4).pays
    assert CandidateResult(spec="x", measured_speedup=1.27, speedup_ci=[1.13, 1.41], identical_outputs=4,
                           compared_outputs=4).pays


def test_cli_recommend_and_validate_auto(target_dir, heldout_file, tmp_path):
    out = tmp_path / "rec.json"
    res = runner.invoke(app, ["draft", "recommend", "--target", str(target_dir), "--heldout", str(heldout_file),
                              "--candidate", "derived:bf16", "--candidate", "ngram", "--max-new-tokens", "8",
                              "--k-max", "3", "--max-prompt-tokens", "0", "--device", "cpu", "--json", str(out)],
                        env={"COLUMNS": "220"})
    assert res.exit_code == 0, res.output
    assert "derived:bf16" in res.output and "recommendation:" in res.output and "native bf16:" in res.output
    assert json.loads(out.read_text())["num_prompts"] == 3
    bad = runner.invoke(app, ["draft", "recommend", "--target", str(tmp_path / "missing"), "--device", "cpu"])
    assert bad.exit_code == 1 and "target" in bad.output
    # validate --draft auto measures, then validates the chosen drafter
    vout = tmp_path / "val"
    res = runner.invoke(app, ["validate", "--target", str(target_dir), "--draft", "auto", "--heldout",
                              str(heldout_file), "--max-new-tokens", "8", "--device", "cpu", "--out", str(vout)],
                        env={"COLUMNS": "220"})
    assert res.exit_code == 0, res.output
    rep = ValidationReport.read(vout)
    assert rep.drafter_kind in ("derived:bf16", "derived:int8", "derived:int4", "ngram")


def test_ranking_prefers_the_credible_gain():
    from specdec.validation.recommend import _rank

    steady = CandidateResult(spec="derived:bf16", measured_speedup=1.10, speedup_ci=[1.05, 1.15],
                             identical_outputs=6, compared_outputs=6)
    jumpy = CandidateResult(spec="ngram", measured_speedup=1.12, speedup_ci=[0.85, 1.40],
                            identical_outputs=6, compared_outputs=6)
    assert max([jumpy, steady], key=_rank) is steady
