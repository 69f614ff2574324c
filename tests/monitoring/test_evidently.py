"""Evidently report (real evidently 0.7.23) and the end-to-end record -> evaluate -> report -> alert."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from monitoring import evidently_report, history, pipeline
from monitoring.db import connect
from monitoring.history import Lineage, RunKey
from monitoring.settings import ChannelConfig, DeliverySettings, MonitoringSettings
from monitoring.receiver import WebhookReceiver
from tests.support.reports import make_report

T0 = dt.datetime(2026, 11, 29, 2, 0, tzinfo=dt.timezone.utc)


def test_report_detects_drift_and_verdict_is_read_from_json(tmp_path):
    baseline = make_report(0.63, num_prompts=40, seed=1).prompts
    current = make_report(0.29, num_prompts=40, seed=2).prompts
    v = evidently_report.build_report(current, baseline, tmp_path / "rep")
    assert (tmp_path / "rep" / "drift.html").stat().st_size > 10_000
    data = json.loads((tmp_path / "rep" / "drift.json").read_text())
    assert {"metrics", "tests"} <= set(data)
    assert set(v.columns) == {"acceptance_rate", "per_token_acceptance", "alpha_tf", "top1_agreement"}
    for c in v.columns.values():
        assert c.method == "ks" and c.threshold == 0.05 and c.drifted and c.score < 0.05
    assert not v.tests_passed
    names = {t["name"]: t["status"] for t in v.tests}
    # the threshold tests judge the policy's metric, and their names say which (the acceptance rate, issue 41)
    assert any("Mean value of 'acceptance_rate'" in n and s == "FAIL" for n, s in names.items())
    assert not any("Mean value of 'per_token_acceptance'" in n for n in names)
    alpha = evidently_report.build_report(current, baseline, tmp_path / "alpha", judged="per_token_acceptance")
    assert any("Mean value of 'per_token_acceptance'" in t["name"] and t["status"] == "FAIL" for t in alpha.tests)
    # the page says what is compared with what, and that "Drift score" is a p-value (small = drift)
    page = (tmp_path / "rep" / "drift.html").read_text()
    assert "<b>Current</b>: this run (40 prompts)" in page and "<b>Reference</b>: its baseline run (40 prompts)" in page
    assert "is the K-S p-value</b>" in page and page.index("<body") < page.index("specdec drift report") < page.index("<div id=\"root_")
    # reading the saved JSON again gives the same verdict (no HTML parsing anywhere)
    again = evidently_report.read_verdict(tmp_path / "rep" / "drift.json")
    assert again.to_dict() == v.to_dict()


def test_same_distribution_no_drift_and_tests_pass(tmp_path):
    baseline = make_report(0.63, num_prompts=40, seed=1).prompts
    current = make_report(0.63, num_prompts=40, seed=1).prompts  # the same pair re-run: identical
    v = evidently_report.build_report(current, baseline, tmp_path)
    assert v.drifted_columns == [] and v.tests_passed
    assert all(c.score == pytest.approx(1.0) for c in v.columns.values())


def test_unmeasured_columns_are_left_out_and_nothing_to_compare_gives_none(tmp_path):
    base = make_report(0.6, num_prompts=10).prompts
    cur = make_report(0.6, num_prompts=10).prompts
    for p in base + cur:
        p.alpha_tf = float("nan")  # e.g. an n-gram drafter has no teacher-forced alpha
    v = evidently_report.build_report(cur, base, tmp_path)
    assert set(v.columns) == {"acceptance_rate", "per_token_acceptance", "top1_agreement"}
    assert evidently_report.build_report(cur[:1], base, tmp_path / "x") is None


def test_record_and_evaluate_end_to_end_fire_then_resolve(tmp_path):
    with WebhookReceiver() as receiver:
        s = MonitoringSettings(
            db_url=f"sqlite:///{tmp_path / 'history.db'}", reports_dir=tmp_path / "reports",
            alert_channels=[ChannelConfig(type="webhook", url=receiver.url("/hook"))],
            delivery=DeliverySettings(max_attempts=2, backoff_initial_s=0.01, timeout_s=2),
        )
        db = connect(s)
        cfg = {"num_draft_tokens": 4, "max_new_tokens": 64}

        def nightly(version, day, acc, target, draft, alias):
            rep = make_report(acc, num_prompts=30, seed=day)
            key = RunKey.build("pair-a", version, rep.heldout_name, rep.heldout_version, cfg, T0.date() + dt.timedelta(days=day))
            claim = history.claim_run(db, key, alias=alias, now=T0 + dt.timedelta(days=day))
            return pipeline.record_and_evaluate(
                db, rep, key, Lineage.from_report(rep, target_hash=target, draft_hash=draft), claim=claim,
                alias=alias, links={"MLflow run": f"http://mlflow.local/runs/{version}"}, settings=s,
                now=T0 + dt.timedelta(days=day))

        v1 = nightly("1", 0, 0.63, "t1", "d1", "champion")
        assert v1.evaluation.verdict == "passed" and v1.drift is None and v1.alert.transition is None
        # target-only fine-tune: v2 keeps the old draft, acceptance collapses
        v2 = nightly("2", 1, 0.29, "t2", "d1", "challenger")
        assert v2.evaluation.verdict == "failed" and v2.evaluation.baseline_run_id == v1.run_id
        assert v2.evaluation.root_cause_hint.startswith("target changed since the last passing run, draft unchanged")
        assert {r.rule for r in v2.evaluation.firing} >= {"absolute", "relative"}
        assert v2.drift is not None and "acceptance_rate" in v2.drift.drifted_columns
        assert v2.alert.transition == "fire" and len(receiver.accepted) == 1
        msg = receiver.accepted[0].body
        assert msg["links"]["Evidently report"].endswith("drift.html")
        assert "re-derive or retrain the draft" in msg["text"]
        row = history.get_run(db, v2.run_id)
        assert row.status == "failed" and row.evidently_verdict["drifted_columns"]
        assert row.rule_results and row.baseline_run_id == v1.run_id
        # the v2 nightly retried the same day (e.g. crashed after alerting): one row, no second alert
        retry = nightly("2", 1, 0.29, "t2", "d1", "challenger")
        assert retry.run_id == v2.run_id and retry.alert.transition is None and len(receiver.requests) == 1
        # re-derived draft: v3 passes and the incident resolves
        v3 = nightly("3", 2, 0.62, "t2", "d2", "challenger")
        assert v3.evaluation.verdict == "passed" and v3.alert.transition == "resolve"
        assert [r.body["event"] for r in receiver.accepted] == ["fire", "resolve"]
        # the v2 nightly retried late (after v3 resolved): same row, no incident flip, no message
        again = nightly("2", 1, 0.29, "t2", "d1", "challenger")
        assert again.run_id == v2.run_id and len(history.list_runs(db)) == 3
        assert again.alert.transition is None and len(receiver.requests) == 2
        db.dispose()
