"""``specdec pair show`` carries both acceptance rules of the latest validation (issue 49): the served rule, each
rule's rate with its CI and per draft position, from the MLflow run (real SQLite store)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tests.support.gate import policy_gate
from tests.support.mlflow_server import sqlite_store
from tests.support.models import save_tiny_checkpoint
from tests.support.registry import open_registry_at
from tests.support.reports import tiny_report


def test_pair_show_names_the_served_rule_and_both_rates(tmp_path, monkeypatch):
    import registry as R
    from specdec.cli import app

    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "220")
    monkeypatch.setenv("SPECDEC_TRACKING_URI", sqlite_store(tmp_path / "store"))
    target = save_tiny_checkpoint(tmp_path / "tiny-target", seed=0)
    runner = CliRunner()

    def cli(*args):
        return runner.invoke(app, ["pair", *map(str, args)], catch_exceptions=False)

    assert cli("register", "--target", target, "--draft", "ngram", "-k", 3).exit_code == 0
    report = tiny_report(0.75, (0.7, 0.8), num_speculative_tokens=3)
    report.acceptance_rule = "argmax"
    g = report.overall
    g.exact_rule_acceptance, g.exact_rule_acceptance_ci, g.exact_rule_per_position = 0.81, [0.78, 0.84], [0.81, 0.66, 0.53]
    g.argmax_rule_acceptance, g.argmax_rule_acceptance_ci, g.argmax_rule_per_position = 0.62, [0.57, 0.67], [0.62, 0.38, 0.24]
    R.log_validation("specdec-pair", "1", report, tmp_path / "rep", gate=policy_gate(), registry=open_registry_at())

    shown = cli("show", "specdec-pair", "1")
    assert shown.exit_code == 0, shown.output
    assert "argmax (served; the floor judges it)" in shown.output
    assert "exact_rule_acceptance" in shown.output and "0.8100 [0.780, 0.840]; per position 0.81 0.66 0.53" in shown.output
    assert "0.6200 [0.570, 0.670]; per position 0.62 0.38 0.24" in shown.output
    latest = json.loads(cli("show", "specdec-pair", "1", "--json").stdout)["latest_validation"]
    assert latest["acceptance_rule"] == "argmax"
    assert (latest["metrics"]["exact_rule_acceptance"], latest["metrics"]["argmax_rule_acceptance"]) == (0.81, 0.62)
