"""Which draft the demo's story runs with (flows.demo._story_draft), from a recommendation."""

from __future__ import annotations

import io

from rich.console import Console

from flows.demo import NO_SPEED_K, _Demo, _story_draft
from flows.settings import DemoSettings
from specdec.validation.recommend import CandidateResult, Recommendation


def _rec(*cands: CandidateResult, best: str | None) -> Recommendation:
    return Recommendation(target_ref="t", device="cpu", dtype="float32", native_bf16={"native": True},
                          candidates=list(cands), best=best, fallback=best, summary="", num_prompts=6,
                          categories=[], max_new_tokens=48, target_step_ms=30.0, verify_cost_by_k={},
                          load_avg_1m=[], num_cpus=2, seconds=1.0)


def _cand(spec: str, speedup: float, c: float = 0.5, k: int = 3) -> CandidateResult:
    return CandidateResult(spec=spec, cost_ratio=c, k=k, measured_speedup=speedup, speedup_ci=[speedup - 0.1, speedup + 0.1],
                           identical_outputs=6, compared_outputs=6,
                           reason=None if speedup > 1 else f"not cheaper than the target here (c = {c:.2f} of a target pass)")


class _Receiver:
    def url(self, path: str) -> str:
        return "http://127.0.0.1:9" + path


def _demo(tmp_path, monkeypatch) -> tuple[_Demo, io.StringIO]:
    """The demo's console (to a buffer) and settings tree (under ``tmp_path``), without models or servers."""
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    out = io.StringIO()
    demo = _Demo.__new__(_Demo)
    demo.con, demo.receiver, demo.opts, demo._rules = Console(file=out, width=200), _Receiver(), DemoSettings(), {}
    demo.settings = demo.tree()
    return demo, out


def test_a_paying_derived_draft_is_taken_even_when_ngram_ranks_first(tmp_path, monkeypatch):
    demo, out = _demo(tmp_path, monkeypatch)
    rec = _rec(_cand("derived:bf16", 1.2), _cand("derived:int8", 0.7, c=1.3), _cand("ngram", 1.3, c=float("nan")),
               best="ngram")
    assert _story_draft(rec, demo) == "derived:bf16"
    assert "going on with derived:bf16" in out.getvalue()
    assert demo.settings.monitoring.rules.speed_enabled  # the speed rule stays on for the demo's nights


def test_where_no_derived_draft_pays_the_demo_says_why_and_turns_the_speed_rule_off(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_RULES__SPEED_ENABLED", "true")
    demo, out = _demo(tmp_path, monkeypatch)
    rec = _rec(_cand("derived:bf16", 0.82, c=0.96), _cand("derived:int8", 0.73, c=1.37),
               _cand("ngram", 1.16, c=float("nan")), best="ngram")
    assert _story_draft(rec, demo) == "derived:bf16"  # the fastest derived draft
    text = " ".join(out.getvalue().split())
    assert "no derived draft pays on this machine" in text
    assert "c = 0.96" in text and "c = 1.37" in text  # the why
    assert f"k={NO_SPEED_K}" in text and "SPECDEC_RULES__SPEED_ENABLED=false" in text
    assert demo.settings.monitoring.rules.speed_enabled is False  # in the tree the demo's nights run with
    assert "slower" not in text and "timing suspect" not in text


def test_a_speed_check_taken_on_a_busy_machine_is_not_called_slower(tmp_path, monkeypatch):
    """Walk-through (issue 43): under load recommend said "timing suspect ... re-run on an idle machine" and the demo
    went on to say "speculation with a derived draft is slower than target-only here on every night"."""
    demo, out = _demo(tmp_path, monkeypatch)
    suspect = _cand("derived:bf16", 0.94, c=0.62)
    suspect.timing_suspect, suspect.reason = True, "timing suspect: the measured speedup is not a finding"
    rec = _rec(suspect, _cand("ngram", 0.87, c=float("nan")), best=None)
    assert _story_draft(rec, demo) == "derived:bf16"
    text = " ".join(out.getvalue().split())
    assert "no derived draft was shown to pay on this machine" in text and "slower" not in text
    assert "could not tell on this busy machine" in text and "re-run on an idle machine" in text


def test_a_draft_that_costs_a_target_pass_is_not_timed(tmp_path, monkeypatch):
    """Issue 48: on an EPYC without native bf16 the bf16 copy is emulated and costs more than the fp32 target;
    no k can pay, so the demo skips the candidates' timing (a third of its time there) and says why."""
    from flows.demo import _choose_draft

    demo, out = _demo(tmp_path, monkeypatch)
    demo.budget, demo.max_new = {"draft_cost_ratio": 2.7, "native_bf16": False}, 24
    assert _choose_draft(demo, tmp_path / "no-model-needed", held=None) == ("derived:bf16", NO_SPEED_K, None)
    text = " ".join(out.getvalue().split())
    assert "costs 2.70 of the fp32 target's" in text and "no k can pay" in text
    assert demo.settings.monitoring.rules.speed_enabled is False
    from flows.demo import _draft_cannot_pay

    demo.budget = {"draft_cost_ratio": 0.39, "native_bf16": False}  # a paying draft: the candidates are timed
    assert _draft_cannot_pay(demo) is False
    # with native bf16 they are timed whatever c reads: under load 10 on this EPYC it read 2.54 (0.39 idle)
    demo.budget = {"draft_cost_ratio": 2.54, "native_bf16": True}
    assert _draft_cannot_pay(demo) is False
