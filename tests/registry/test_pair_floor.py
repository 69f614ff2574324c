"""A pair version's own floor (issue 41): ``specdec pair register --acceptance-floor`` tags the version,
``pair show``, the gate, the MLflow run and the description name the floor and where it came from; a
registration at a k whose validated acceptance rate is already below the floor says so at once, with
the rate at smaller k. Through typer's CliRunner on a real SQLite MLflow store."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tests.support.mlflow_server import sqlite_store
from tests.support.models import save_tiny_checkpoint
from tests.support.reports import tiny_report
from tests.support.gate import policy_gate
from tests.support.registry import open_registry_at


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return str(save_tiny_checkpoint(tmp_path_factory.mktemp("floor-ckpt") / "t", seed=5))


@pytest.fixture()
def cli(tmp_path, monkeypatch):
    from specdec.cli import app

    uri = sqlite_store(tmp_path / "store")
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "220")
    monkeypatch.setenv("SPECDEC_TRACKING_URI", uri)
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, ["pair", *map(str, args)], catch_exceptions=False)

    invoke.uri = uri
    return invoke


def test_own_floor_is_tagged_shown_and_judged_by(cli, target, tmp_path):
    from mlflow import MlflowClient

    import registry as R

    r = cli("register", "--target", target, "--draft", "derived:int8", "-k", 5, "--acceptance-floor", 0.2)
    assert r.exit_code == 0, r.output
    assert "floor   floor 0.20 (pair version tag acceptance_floor)" in r.output and "warning" not in r.output
    client = MlflowClient(cli.uri, registry_uri=cli.uri)
    assert client.get_model_version("specdec-pair", "1").tags["acceptance_floor"] == "0.2"
    # an EAGLE-3-like rate: 0.23 at k 5, CI 0.21-0.25: passes its own floor of 0.20, and says which floor
    R.log_validation("specdec-pair", "1", tiny_report(0.23, (0.21, 0.25), num_speculative_tokens=5), tmp_path / "r1",
                     registry=open_registry_at(cli.uri), gate=policy_gate())
    run = R.latest_validation_run("specdec-pair", "1", registry=open_registry_at(cli.uri))
    assert run.data.tags["validation_status"] == "passed"
    policy = json.loads(run.data.tags["specdec.acceptance_policy"])
    assert (policy["threshold"], policy["floor_source"]) == (0.2, "pair version tag acceptance_floor")
    mv = client.get_model_version("specdec-pair", "1")
    assert mv.description.startswith("passed: acc 0.23 [0.21-0.25] at k=5") and "floor 0.20 (pair version tag acceptance_floor)" in mv.description
    assert mv.tags["policy"] == "acceptance_rate ci_low>=0.20 (pair floor)"
    shown = cli("show", "specdec-pair", "1")
    assert "floor 0.20 (pair version tag acceptance_floor)" in shown.output and "passed (the run's verdict; gate passed)" in shown.output
    assert R.promote("specdec-pair", "1", registry=open_registry_at(cli.uri), gate=policy_gate()).gate.passed  # the gate uses the same floor
    with pytest.raises(R.PromotionRefused, match="< floor 0.40 \\(policy default\\)"):  # the policy's floor refuses it
        client.delete_model_version_tag("specdec-pair", "1", "acceptance_floor")
        R.promote("specdec-pair", "1", registry=open_registry_at(cli.uri), gate=policy_gate())


def test_registering_a_k_already_below_the_floor_says_so_with_the_rate_at_smaller_k(cli, target, tmp_path):
    import registry as R

    assert cli("register", "--target", target, "--draft", "derived:int8", "-k", 5).exit_code == 0
    # validated at k 5: per-position acceptance 0.55, 0.30, 0.16, 0.09, 0.05 (tiny_report's 0.3 ** (0.5 + i / 2))
    R.log_validation("specdec-pair", "1", tiny_report(0.30, (0.26, 0.34), num_speculative_tokens=5), tmp_path / "r",
                     registry=open_registry_at(cli.uri), gate=policy_gate())
    r = cli("register", "--target", target, "--draft", "derived:int8", "-k", 4)
    assert r.exit_code == 0, r.output
    assert ("warning: acceptance rate 0.28 at k = 4 is already below floor 0.40 (policy default); at smaller k: "
            "0.55 at k = 1, 0.42 at k = 2, 0.34 at k = 3 (highest k at or above the floor: 2)") in " ".join(r.output.split())
    ok = cli("register", "--target", target, "--draft", "derived:int8", "-k", 2)
    assert ok.exit_code == 0 and "warning" not in ok.output  # 0.42 at k = 2: above the floor
    bad = cli("register", "--target", target, "--draft", "derived:int8", "-k", 3, "--acceptance-floor", 1.5)
    assert bad.exit_code == 2 and "acceptance-floor" in bad.output  # refused before any model loads
