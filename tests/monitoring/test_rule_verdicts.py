"""The floor judges the pair's served acceptance rule and names it, with the other rule's number beside it (issue
49): in the rule result, the alert's first line and facts; the history row carries the served rule and both
rules' rates; MLflow metrics carry both rules overall, per category and per draft position."""

from __future__ import annotations

import datetime as dt

import pytest

from monitoring import history, pipeline, rules
from monitoring.db import Database
from monitoring.history import Lineage, RunKey
from monitoring.receiver import WebhookReceiver
from monitoring.settings import ChannelConfig, DeliverySettings, MonitoringSettings, RuleSettings
from registry.runs import report_metrics
from tests.support.reports import make_report

FAST = DeliverySettings(max_attempts=2, backoff_initial_s=0.01, backoff_max_s=0.05, timeout_s=2)


def _night(rate: float, served: str | None, exact: float, by_argmax: float):
    r = make_report(rate, ci_half=0.035, alpha_hat=rate + 0.2, hat_half=0.05, alpha_tf=exact, k=4,
                    num_draft_tokens=1200, categories={"chat": rate, "code": rate})
    r.acceptance_rule = served
    for g in [r.overall, *r.categories.values()]:
        g.exact_rule_acceptance, g.exact_rule_acceptance_ci = exact, [exact - 0.03, exact + 0.03]
        g.argmax_rule_acceptance, g.argmax_rule_acceptance_ci = by_argmax, [by_argmax - 0.04, by_argmax + 0.04]
        g.exact_rule_per_position = [exact, exact ** 2, exact ** 3, exact ** 4]
        g.argmax_rule_per_position = [by_argmax, by_argmax ** 2, by_argmax ** 3, by_argmax ** 4]
    return r


@pytest.mark.parametrize("served, own, other, other_value", [
    ("argmax", "argmax rule p(argmax q)", "exact rule Σmin(p,q)", "0.710"),
    ("exact", "exact rule Σmin(p,q)", "argmax rule p(argmax q)", "0.460"),
])
def test_the_floor_names_the_served_rule_and_the_other_beside_it(served, own, other, other_value):
    res = rules.evaluate(_night(0.296, served, 0.71, 0.46), None, RuleSettings())
    for scope in ("overall", "chat", "code"):
        (floor,) = [r for r in res if r.rule == "absolute" and r.scope == scope]
        assert floor.firing
        assert f"judged under the {own} (served)" in floor.message
        assert f"{other} {other_value} beside it (teacher-forced, per token" in floor.message


def test_a_run_without_a_served_rule_names_none():
    res = rules.evaluate(_night(0.296, None, 0.71, 0.46), None, RuleSettings())
    (floor,) = [r for r in res if r.rule == "absolute" and r.scope == "overall"]
    assert floor.firing and "rule" not in floor.message.split("floor 0.400")[1]


def test_alert_and_history_row_carry_both_rules(tmp_path):
    with WebhookReceiver() as receiver:
        s = MonitoringSettings(db_url=f"sqlite:///{tmp_path / 'h.db'}", delivery=FAST, alert_channels=[
            ChannelConfig(type="webhook", url=receiver.url("/hook"), name="ops")])
        db = Database(s.db_url)
        db.upgrade()
        key = RunKey.build("specdec-pair", "1", "spec_bench_demo", "1", {"num_speculative_tokens": 4}, dt.date(2026, 12, 7))
        out = pipeline.record_and_evaluate(db, _night(0.296, "argmax", 0.71, 0.46), key, Lineage("t", "d", "1", "0.1"),
                                           alias="champion", settings=s, evidently=False)
        assert out.alert.transition == "fire"
        row = history.get_run(db, out.run_id)
        assert (row.acceptance_rule, row.exact_rule_acceptance, row.argmax_rule_acceptance) == ("argmax", 0.71, 0.46)
        assert history.snapshot_of(row).acceptance_rule == "argmax"
        body = receiver.accepted[0].body
        assert body["text"].splitlines()[1].startswith("acceptance rate 29.6% under the argmax rule < 40% at k = 4")
        assert "exact rule Σmin(p,q) 0.710 beside it" in body["facts"]["Acceptance rate"]
        assert "judged under the argmax rule p(argmax q) (served)" in body["text"]


def test_mlflow_metrics_carry_both_rules():
    m = report_metrics(_night(0.296, "argmax", 0.71, 0.46))
    assert (m["exact_rule_acceptance"], m["argmax_rule_acceptance"]) == (0.71, 0.46)
    assert (m["argmax_rule_acceptance_ci_low"], m["exact_rule_acceptance_ci_high"]) == pytest.approx((0.42, 0.74))
    assert m["exact_rule_acceptance.pos_1"] == pytest.approx(0.71 ** 2) and m["argmax_rule_acceptance.pos_3"] == pytest.approx(0.46 ** 4)
    assert (m["exact_rule_acceptance.chat"], m["argmax_rule_acceptance.code"]) == (0.71, 0.46)


def _with_length(report, tokens_per_prompt: int):
    report.overall.num_emitted_tokens = tokens_per_prompt * report.overall.num_prompts
    return report


def test_a_night_with_much_shorter_outputs_is_named_as_such_not_drift():
    baseline = _with_length(make_report(0.80, alpha_hat=0.90, hat_half=0.02, alpha_tf=0.90, k=4), 64)
    dropped = dict(alpha_hat=0.60, hat_half=0.02, alpha_tf=0.60, k=4)  # per-token acceptance 0.90 -> 0.60: past the 15% drop
    same = rules.evaluate(_with_length(make_report(0.55, **dropped), 62), baseline, RuleSettings())
    (rel,) = [r for r in same if r.rule == "relative"]
    assert rel.firing and rules.verdict(same) == "failed" and "shorter" not in rel.message
    shorter = rules.evaluate(_with_length(make_report(0.55, **dropped), 20), baseline, RuleSettings())
    (rel,) = [r for r in shorter if r.rule == "relative"]
    assert rel.status == rules.INSUFFICIENT and rules.verdict(shorter) == "inconclusive"
    assert rel.message.startswith("not judged as drift: outputs 69% shorter than the baseline's (20.0 against 64.0 "
                                  "tokens per prompt)")
    longer = rules.evaluate(_with_length(make_report(0.80, alpha_hat=0.90, hat_half=0.02, alpha_tf=0.90, k=4), 100),
                            baseline, RuleSettings())
    (rel,) = [r for r in longer if r.rule == "relative"]
    assert rel.status == rules.OK and rel.message.endswith("; outputs 56% longer than the baseline's (100.0 against "
                                                           "64.0 tokens per prompt)")


def test_the_measurement_rule_compares_alpha_hat_with_the_served_rule():
    # argmax-served at T > 0: the decoded α̂ counts p(argmax q) (0.46), alpha_tf is Σ min(p, q) (0.71)
    night = _night(0.40, "argmax", 0.71, 0.46)
    night.overall.alpha_hat, night.overall.alpha_hat_ci = 0.47, [0.44, 0.50]
    (m,) = [r for r in rules.evaluate(night, None, RuleSettings()) if r.rule == "measurement" and r.scope == "overall"]
    assert m.status == rules.OK and m.metric == "argmax_rule_acceptance" and m.value == pytest.approx(0.46)
    night.acceptance_rule = "exact"  # the same numbers read as exact-rule counters disagree
    (m,) = [r for r in rules.evaluate(night, None, RuleSettings()) if r.rule == "measurement" and r.scope == "overall"]
    assert m.firing and m.metric == "alpha_tf" and "alpha_tf 0.710" in m.message
