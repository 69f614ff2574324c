"""Each drift rule, the verdict, and the root-cause hints (pure functions, reports built directly)."""

from __future__ import annotations

import math

import pytest

from monitoring import rules
from monitoring.history import Lineage, RunSnapshot
from monitoring.rules import FIRING, INSUFFICIENT, NOT_APPLICABLE, OK
from monitoring.settings import RuleSettings
from specdec.policy import AcceptancePolicy
from tests.support.reports import make_report

S = RuleSettings()


def snap(report, **lineage) -> RunSnapshot:
    return RunSnapshot.from_report(report, Lineage(**lineage))


def by(results, rule, scope="overall"):
    (r,) = [x for x in results if x.rule == rule and x.scope == scope]
    return r


def test_defaults_are_the_issue_values():
    assert S.policy.threshold == 0.40 and S.relative_drop == 0.15
    assert S.policy.min_draft_tokens == 200 and S.collapse_drop == 0.30


def test_absolute_fires_when_ci_upper_bound_is_below_threshold():
    cur = make_report(0.29, ci_half=0.04, num_draft_tokens=2000)
    r = by(rules.evaluate(cur, None, S), "absolute")
    assert r.status == FIRING and r.value == pytest.approx(0.29) and r.ci == pytest.approx((0.25, 0.33))
    assert r.threshold == 0.40 and r.num_draft_tokens == 2000
    assert rules.verdict(rules.evaluate(cur, None, S)) == "failed"


def test_ci_too_wide_no_alert_yet():
    cur = make_report(0.35, ci_half=0.10, num_draft_tokens=2000)  # CI 0.25-0.45 reaches above 0.40
    results = rules.evaluate(cur, None, S)
    r = by(results, "absolute")
    assert r.status == INSUFFICIENT and "CI too wide: no alert yet" in r.message
    assert not any(x.firing for x in results)
    assert rules.verdict(results) == "inconclusive"


def test_too_few_draft_tokens_no_alert_even_with_a_tight_ci():
    cur = make_report(0.10, ci_half=0.01, num_draft_tokens=150)  # < 200 tokens measured
    r = by(rules.evaluate(cur, None, S), "absolute")
    assert r.status == INSUFFICIENT and "150 draft tokens" in r.message
    # lowering N makes the same evidence enough
    r2 = by(rules.evaluate(cur, None, RuleSettings(policy=AcceptancePolicy(min_draft_tokens=100))), "absolute")
    assert r2.status == FIRING


def test_healthy_pair_passes():
    results = rules.evaluate(make_report(0.63), None, S)
    assert by(results, "absolute").status == OK
    assert by(results, "relative").status == NOT_APPLICABLE  # no baseline yet
    assert by(results, "collapse").status == NOT_APPLICABLE
    assert by(results, "measurement").status == OK
    assert rules.verdict(results) == "passed"


def test_per_category_thresholds():
    cur = make_report(0.55, categories={"chat": 0.60, "code": 0.45, "math": 0.20}, category_tokens=600)
    settings = RuleSettings(category_thresholds={"code": 0.55})
    results = rules.evaluate(cur, None, settings)
    assert by(results, "absolute").status == OK
    assert by(results, "absolute", "chat").status == OK
    code = by(results, "absolute", "code")  # 0.45 (CI 0.39-0.51) < own threshold 0.55
    assert code.status == FIRING and code.threshold == 0.55
    assert by(results, "absolute", "math").status == FIRING and by(results, "absolute", "math").threshold == 0.40
    # a small category lacks evidence: reported, no alert, does not block passing
    small = make_report(0.6, categories={"chat": 0.6, "rare": 0.1}, category_tokens=50)
    res = rules.evaluate(small, None, S)
    assert by(res, "absolute", "rare").status == INSUFFICIENT
    assert rules.verdict(res) == "passed"


def test_relative_drop_against_baseline():
    base = snap(make_report(0.63))
    # 0.50 is above 0.40 but more than 15% below 0.63 (limit 0.5355); CI 0.47-0.53 is below it
    results = rules.evaluate(snap(make_report(0.50)), base, S)
    rel = by(results, "relative")
    assert by(results, "absolute").status == OK
    assert rel.status == FIRING and rel.baseline == pytest.approx(0.63)
    assert rel.threshold == pytest.approx(0.63 * 0.85)
    # a 10% drop does not fire
    assert by(rules.evaluate(snap(make_report(0.567)), base, S), "relative").status == OK
    # below the limit but the CI reaches above it: insufficient evidence
    wide = by(rules.evaluate(snap(make_report(0.52, ci_half=0.05)), base, S), "relative")
    assert wide.status == INSUFFICIENT and "CI too wide" in wide.message


def test_relative_rule_judges_per_token_acceptance_whatever_the_floors_estimator():
    base = snap(make_report(0.63, k=4))
    # the per-token acceptance means the same at every k: the baseline at k=4 still judges a run at k=8,
    # whether the floor judges the acceptance rate (the default) or the per-token acceptance (issue 41)
    for settings in (RuleSettings(policy=AcceptancePolicy(estimator="pooled")), RuleSettings(policy=AcceptancePolicy(estimator="per_token"))):
        r = by(rules.evaluate(snap(make_report(0.40, k=8)), base, settings), "relative")
        assert r.metric == "per_token_acceptance" and r.status == FIRING and r.baseline == pytest.approx(0.63)


def test_collapse_fires_even_with_perfect_acceptance():
    base = snap(make_report(0.70, k=4))  # 4 draft tokens per step
    # an n-gram drafter that stopped finding matches: 1.0 acceptance on 1.2 tokens per step
    cur = snap(make_report(1.0, ci_half=0.0, k=4, num_draft_tokens=240, tokens_per_step=1.2))
    results = rules.evaluate(cur, base, S)
    col = by(results, "collapse")
    assert col.status == FIRING and col.value == pytest.approx(1.2, rel=0.05)
    assert col.baseline == pytest.approx(4.0) and col.threshold == pytest.approx(2.8)
    assert by(results, "absolute").status == OK  # acceptance looks perfect
    assert rules.verdict(results) == "failed"
    # a 20% fall is within tolerance
    mild = snap(make_report(0.7, k=4, tokens_per_step=3.2))
    assert by(rules.evaluate(mild, base, S), "collapse").status == OK


def test_measurement_health_compares_alpha_tf_with_alpha_hat():
    ok = make_report(0.55, alpha_tf=0.80, alpha_hat=0.79, tf_half=0.02, hat_half=0.02)
    # for k > 1 the acceptance rate (0.55) differs from alpha; that is not a disagreement
    assert by(rules.evaluate(ok, None, S), "measurement").status == OK
    bad = make_report(0.55, alpha_tf=0.80, alpha_hat=0.60, tf_half=0.03, hat_half=0.03)
    m = by(rules.evaluate(bad, None, S), "measurement")
    assert m.status == FIRING and "alpha_hat" in m.message
    overlap = make_report(0.55, alpha_tf=0.80, alpha_hat=0.74, tf_half=0.04, hat_half=0.04)
    assert by(rules.evaluate(overlap, None, S), "measurement").status == OK
    missing = make_report(0.55)
    missing.overall.alpha_tf_ci = [math.nan, math.nan]
    assert by(rules.evaluate(missing, None, S), "measurement").status == NOT_APPLICABLE


def test_rule_results_round_trip_through_dicts():
    for r in rules.evaluate(make_report(0.3), snap(make_report(0.6)), S):
        assert rules.RuleResult.from_dict(r.to_dict()) == r


@pytest.mark.parametrize("cur,base,expected", [
    (dict(target_hash="t2", draft_hash="d1"), dict(target_hash="t1", draft_hash="d1"),
     "target changed since the last passing run, draft unchanged: re-derive or retrain the draft"),
    (dict(target_hash="t1", draft_hash="d2"), dict(target_hash="t1", draft_hash="d1"), "draft changed"),
    (dict(target_hash="t2", draft_hash="d2"), dict(target_hash="t1", draft_hash="d1"), "both target and draft changed"),
    (dict(target_hash="t1", draft_hash="d1", heldout_version="2"),
     dict(target_hash="t1", draft_hash="d1", heldout_version="1"), "held-out set changed"),
    (dict(target_hash="t1", draft_hash="d1", code_version="0.2"),
     dict(target_hash="t1", draft_hash="d1", code_version="0.1"),
     "nothing changed in the pair or held-out set: the environment or code changed (code 0.1 -> 0.2)"),
    (dict(target_hash="t1", draft_hash=None), dict(target_hash="t1", draft_hash=None), "nothing changed"),
])
def test_root_cause_hint(cur, base, expected):
    hint = rules.root_cause_hint(Lineage(**cur), Lineage(**base))
    assert hint.startswith(expected)


def test_root_cause_hint_mentions_heldout_change_alongside_model_change_and_no_baseline():
    h = rules.root_cause_hint(Lineage("t2", "d1", "2"), Lineage("t1", "d1", "1"))
    assert h.startswith("target changed") and "held-out set also changed (1 -> 2)" in h
    assert "no passing baseline" in rules.root_cause_hint(Lineage("t1"), None)


def test_root_cause_hint_names_the_head_to_retrain_for_an_eagle3_pair():
    cur, base = Lineage("t2", "h1", "1"), Lineage("t1", "h1", "1")
    hint = rules.root_cause_hint(cur, base, drafter_kind="eagle3", drafter_ref="models:/t1-eagle3/3")
    assert hint == "target changed since the head was trained: re-train from head v3 (models:/t1-eagle3/3)"
    # other drafters keep the generic hint; a changed head is "the draft changed"
    assert "re-derive or retrain" in rules.root_cause_hint(cur, base, drafter_kind="derived:int8")
    assert rules.root_cause_hint(Lineage("t1", "h2", "1"), base, drafter_kind="eagle3").startswith("draft changed")
