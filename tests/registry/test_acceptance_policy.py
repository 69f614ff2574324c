"""One acceptance policy (issue 12, item 5): the drift rules, the promotion gate, the plots and the
Evidently threshold read the same object; setting it (or the older SPECDEC_RULES__ABSOLUTE_THRESHOLD)
moves all of them, and it is recorded with each MLflow run."""

from __future__ import annotations

import json

import pytest

from monitoring import rules
from monitoring.settings import MonitoringSettings
from tests.support.reports import make_report
from registry.gate import evaluate_gate
from specdec.policy import AcceptancePolicy
from specdec.settings.policy import get_policy
from tests.support.gate import policy_gate
from tests.support.registry import open_registry_at

OK = {"acceptance_rate": 0.62, "acceptance_rate_ci_low": 0.55, "acceptance_rate_ci_high": 0.69,
      "per_token_acceptance": 0.66, "per_token_acceptance_ci_low": 0.60, "per_token_acceptance_ci_high": 0.72, "num_speculative_tokens": 4.0,
      "exactness_mismatches": 0.0, "num_prompts": 40.0, "num_draft_tokens": 2000.0}


@pytest.mark.parametrize("var", ["SPECDEC_POLICY__THRESHOLD", "SPECDEC_RULES__ABSOLUTE_THRESHOLD"])
def test_one_threshold_moves_alerts_and_gate_together(monkeypatch, var):
    assert evaluate_gate(OK, gate=policy_gate()).passed and MonitoringSettings().rules.policy.threshold == 0.40
    monkeypatch.setenv(var, "0.7")
    assert get_policy().threshold == 0.7
    assert MonitoringSettings().rules.policy.threshold == 0.7
    assert policy_gate().min_acceptance_rate == 0.7
    verdict = evaluate_gate(OK, gate=policy_gate())
    assert not verdict.passed and "0.70" in verdict.reasons[0]
    # the reason names the metric it judged (the acceptance rate at k, issue 41) and the floor with its
    # source, with the per-token acceptance beside it
    assert verdict.reasons[0].startswith("acceptance rate (acceptance_rate) at k=4 CI lower bound 0.550 < floor 0.70 "
                                         "(SPECDEC_POLICY__THRESHOLD)")
    assert "per-token acceptance 0.660" in verdict.reasons[0] and verdict.status == "failed"
    results = rules.evaluate(make_report(0.62, ci_half=0.03), None, MonitoringSettings().rules)
    assert rules.verdict(results) == "failed"  # CI upper 0.65 < 0.70


def test_sides_and_evidence_are_policy(monkeypatch):
    report = make_report(0.38, ci_half=0.05)  # point below 0.40, CI reaches above: upper side does not alert
    assert rules.verdict(rules.evaluate(report, None, MonitoringSettings().rules)) == "inconclusive"
    monkeypatch.setenv("SPECDEC_POLICY__ALERT_SIDE", "point")
    assert rules.verdict(rules.evaluate(report, None, MonitoringSettings().rules)) == "failed"
    monkeypatch.setenv("SPECDEC_POLICY__GATE_SIDE", "point")
    monkeypatch.setenv("SPECDEC_POLICY__MIN_DRAFT_TOKENS", "5000")
    g = policy_gate()
    assert (g.gate_side, g.min_draft_tokens) == ("point", 5000)
    assert any("too little evidence" in r for r in evaluate_gate(OK, gate=policy_gate()).reasons)
    assert MonitoringSettings().rules.policy.min_draft_tokens == 5000


@pytest.mark.parametrize("env,msg", [({"SPECDEC_POLICY__THRESHOLD": "high"}, "THRESHOLD"),
                                     ({"SPECDEC_POLICY__ALERT_SIDE": "middle"}, "alert_side"),
                                     ({"SPECDEC_POLICY__THRESHOLD": "1.5"}, "threshold")])
def test_bad_policy_is_refused_with_its_name(env, msg, monkeypatch):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=msg):  # pydantic's ValidationError is a ValueError
        get_policy()


def test_old_threshold_name_warns_once(monkeypatch):
    from specdec.settings import aliases

    monkeypatch.setattr(aliases, "_warned", set())
    monkeypatch.setenv("SPECDEC_RULES__ABSOLUTE_THRESHOLD", "0.6")
    with pytest.warns(FutureWarning, match="SPECDEC_POLICY__THRESHOLD") as seen:
        assert get_policy().threshold == 0.6
        assert get_policy().threshold == 0.6
    assert len([w for w in seen if issubclass(w.category, FutureWarning)]) == 1
    monkeypatch.setenv("SPECDEC_POLICY__THRESHOLD", "0.5")  # the documented name wins
    assert get_policy().threshold == 0.5


def test_policy_recorded_with_the_mlflow_run(tmp_path, monkeypatch):
    from tests.support.mlflow_server import sqlite_store

    uri = sqlite_store(tmp_path / "ml")
    monkeypatch.setenv("SPECDEC_POLICY__THRESHOLD", "0.55")
    import registry as R
    from tests.support.models import save_tiny_checkpoint

    registry = open_registry_at(uri)
    t = R.register_model_version("target", save_tiny_checkpoint(tmp_path / "tiny"), registry=registry)
    pv = R.register_pair(t, None, drafter_kind="ngram", name="pol-pair", registry=registry)
    run_id = R.log_validation("pol-pair", pv.version, make_report(0.62), tmp_path / "r", registry=registry, gate=policy_gate())
    from mlflow import MlflowClient

    tags = MlflowClient(uri).get_run(run_id).data.tags
    assert json.loads(tags["specdec.acceptance_policy"])["threshold"] == 0.55


def test_estimator_is_policy_and_every_verdict_names_its_metric(monkeypatch):
    """The floor judges the acceptance rate at k by default (issue 41); ``SPECDEC_POLICY__ESTIMATOR=per_token``
    judges the per-token acceptance in the rules and the gate alike; the other metric is always beside it."""
    assert get_policy().estimator == "pooled" and get_policy().metric == "acceptance_rate"
    report = make_report(0.30, ci_half=0.03, alpha_hat=0.60, hat_half=0.03)  # k=4: a healthy per-token 0.60
    res = rules.evaluate(report, None, MonitoringSettings().rules)
    (ab,) = [r for r in res if r.rule == "absolute" and r.scope == "overall"]
    assert ab.status == "firing" and ab.metric == "acceptance_rate"
    assert ab.message.startswith("overall: acceptance rate 0.300 (95% CI 0.270-0.330) at k=4 < floor 0.400 (policy default)")
    assert "per-token acceptance 0.600" in ab.message
    g = policy_gate()
    assert g.estimator == "pooled"
    assert evaluate_gate({**OK, "acceptance_rate_ci_low": 0.35}, g).reasons[0].startswith(
        "acceptance rate (acceptance_rate) at k=4 CI lower bound 0.350 < floor 0.40 (policy default)")
    monkeypatch.setenv("SPECDEC_POLICY__ESTIMATOR", "per_token")
    res = rules.evaluate(report, None, MonitoringSettings().rules)
    (ab,) = [r for r in res if r.rule == "absolute" and r.scope == "overall"]
    assert ab.status == "ok" and ab.metric == "per_token_acceptance"
    assert "per-token acceptance 0.600" in ab.message and "acceptance rate 0.300 at k=4" in ab.message
    assert policy_gate().estimator == "per_token"
    with pytest.raises(ValueError, match="estimator"):
        AcceptancePolicy(estimator="mean")
