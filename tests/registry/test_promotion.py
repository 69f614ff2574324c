"""The promotion gate and aliases on a real SQLite MLflow store; clear errors for missing things."""

from __future__ import annotations

import pytest

from tests.support.mlflow_server import sqlite_store
from tests.support.net import free_port
from tests.support.reports import tiny_report
from tests.support.models import save_tiny_checkpoint
from tests.support.gate import policy_gate
from tests.support.registry import open_registry_at


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("promo-ckpt") / "t", seed=3)


@pytest.fixture()
def env(tmp_path, monkeypatch, ckpt):
    """A store with one target and two ngram pair versions (k=3 and k=5)."""
    import registry as R

    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    uri = sqlite_store(tmp_path / "store")
    registry = open_registry_at(uri)
    t = R.register_model_version("target", ckpt, registry=registry)
    for k in (3, 5):
        R.register_pair(t, None, drafter_kind="ngram", config=R.SpeculativeConfig(k), registry=registry)
    return uri


def test_refused_then_passing_promotion(env, tmp_path):
    import registry as R

    uri, pair = env, "specdec-pair"
    registry = open_registry_at(uri)
    with pytest.raises(R.PromotionRefused) as never:
        R.promote(pair, "1", registry=registry, gate=policy_gate())
    assert never.value.reasons == ["version 1 was never validated (no finished validation run)"]

    # low acceptance (CI lower bound under 0.40 although the point estimate is above) and a failed audit
    bad = tiny_report(0.45, (0.33, 0.57), exactness_mismatches=1, num_speculative_tokens=3)
    R.log_validation(pair, "1", bad, tmp_path / "bad", registry=registry, gate=policy_gate())
    pv = R.get_pair_version(pair, "1", download=False, registry=registry)
    assert pv.validation_status == "failed" and pv.tags["acceptance_rate"] == "0.450"
    assert pv.description.startswith("failed: acc 0.45 [0.33-0.57] at k=3 (α 0.45) · floor 0.40 (policy default)")
    with pytest.raises(R.PromotionRefused) as refused:
        R.promote(pair, "1", registry=registry, gate=policy_gate())
    assert len(refused.value.reasons) == 2
    assert ("acceptance rate (acceptance_rate) at k=3 CI lower bound 0.330 < floor 0.40 (policy default)"
            in refused.value.reasons[0])
    assert "per-token acceptance 0.450" in refused.value.reasons[0]  # shown beside it
    assert "inconclusive against the floor" in refused.value.reasons[0]  # its CI reaches 0.40: not credibly below
    assert "exactness audit found 1 mismatch" in refused.value.reasons[1]
    with pytest.raises(R.AliasNotFound):
        R.resolve_alias(pair, "champion", registry=registry)

    # a newer, passing validation of the same version: the gate judges the latest run
    good = tiny_report(0.8, (0.72, 0.86), num_speculative_tokens=3)
    run_good = R.log_validation(pair, "1", good, tmp_path / "good", registry=registry, gate=policy_gate())
    res = R.promote(pair, "1", actor="alice", registry=registry, gate=policy_gate())
    assert res.gate.passed and res.gate.run_id == run_good and not res.forced and res.previous_version is None
    assert R.resolve_alias(pair, "champion", registry=registry) == "1"
    tags = R.get_pair_version(pair, "1", download=False, registry=registry).tags
    assert tags["promotion"].startswith("champion 20") and tags["promotion"].endswith(" by alice (gate passed)")
    assert tags["validation_status"] == "passed"

    # the optional speedup criterion (off by default)
    gate = policy_gate(min_predicted_speedup=2.0)
    with pytest.raises(R.PromotionRefused, match=r"predicted speedup 1.50 < 2.00"):
        R.promote(pair, "1", gate=gate, registry=registry)

    # a validation run with another k than the pair serves does not count as validating this pair
    other_k = tiny_report(0.9, (0.85, 0.95), num_speculative_tokens=5)
    run_k = R.log_validation(pair, "1", other_k, tmp_path / "k5", registry=registry, gate=policy_gate())
    from mlflow import MlflowClient

    assert MlflowClient(uri).get_run(run_k).data.tags["specdec.config_mismatch"] == "num_speculative_tokens: validated 5, pair serves 3"
    with pytest.raises(R.PromotionRefused, match="different decoding config"):
        R.promote(pair, "1", registry=registry, gate=policy_gate())
    assert R.promote(pair, "1", gate=policy_gate(require_matching_config=False), registry=registry).gate.passed

    # a later failing validation of the champion blocks re-promotion of that version
    R.log_validation(pair, "1", bad, tmp_path / "bad2", registry=registry, gate=policy_gate())
    assert not R.check_gate(pair, "1", registry=registry, gate=policy_gate()).passed


def test_force_records_who_and_why(env):
    import registry as R

    uri, pair = env, "specdec-pair"
    registry = open_registry_at(uri)
    with pytest.raises(ValueError, match="needs a reason"):
        R.promote(pair, "2", force=True, registry=registry, gate=policy_gate())
    res = R.promote(pair, "2", force=True, reason="hotfix: v1 target withdrawn", actor="bob", registry=registry, gate=policy_gate())
    assert res.forced and res.reasons_overridden and res.gate.run_id is None
    tags = R.get_pair_version(pair, "2", download=False, registry=registry).tags
    assert tags["promotion"].endswith(" by bob, forced: hotfix: v1 target withdrawn")
    assert "@champion" in R.get_pair_version(pair, "2", download=False, registry=registry).description
    assert R.resolve_alias(pair, "champion", registry=registry) == "2"


def test_challenger_is_not_gated_and_ui_alias_moves_are_seen(env):
    from mlflow import MlflowClient

    import registry as R

    uri, pair = env, "specdec-pair"
    registry = open_registry_at(uri)
    res = R.promote(pair, "2", alias="challenger", registry=registry, gate=policy_gate())
    assert not res.forced and res.gate.run_id is None
    assert R.resolve_alias(pair, "challenger", registry=registry) == "2"
    # a person moves the aliases in the MLflow UI (same REST call the UI makes)
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.set_registered_model_alias(pair, "challenger", "1")
    client.set_registered_model_alias(pair, "champion", "2")
    assert R.resolve_alias(pair, "challenger", registry=registry) == "1"
    assert R.get_pair_version(pair, "champion", download=False, registry=registry).version == "2"
    client.delete_registered_model_alias(pair, "challenger")
    with pytest.raises(R.AliasNotFound, match=r"no alias @challenger \(aliases: @champion -> v2\)"):
        R.resolve_alias(pair, "challenger", registry=registry)


def test_missing_things_give_clear_errors(env, tmp_path):
    import registry as R

    uri = env
    registry = open_registry_at(uri)
    with pytest.raises(R.PairNotFound, match="pair 'nope' is not registered"):
        R.resolve_alias("nope", "champion", registry=registry)
    with pytest.raises(R.PairNotFound, match="nope"):
        R.get_pair_version("nope", "1", registry=registry)
    with pytest.raises(R.PairNotFound, match="models:/specdec-pair/9"):
        R.get_pair_version("specdec-pair", "9", registry=registry)
    with pytest.raises(R.AliasNotFound, match="@champion"):
        R.get_pair_version("specdec-pair", "champion", registry=registry)
    with pytest.raises(R.PairNotFound):
        R.promote("specdec-pair", "9", registry=registry, gate=policy_gate())
    with pytest.raises(R.PairNotFound):
        R.log_validation("specdec-pair", "9", tiny_report(), tmp_path / "r", registry=registry, gate=policy_gate())
    with pytest.raises(R.ModelNotFound, match="models:/ghost/1"):
        R.get_model_version("models:/ghost/1", registry=registry)
    with pytest.raises(R.ModelNotFound, match="models:/target/7"):
        R.register_pair("models:/target/7", None, drafter_kind="ngram", registry=registry)
    with pytest.raises(R.ModelNotFound, match="models:/target@prod"):
        R.register_pair("models:/target@prod", None, drafter_kind="ngram", registry=registry)
    with pytest.raises(FileNotFoundError):
        R.register_model_version("target", tmp_path / "missing", registry=registry)
    with pytest.raises(ValueError, match="invalid registered model name"):
        R.register_pair("models:/target/1", None, drafter_kind="ngram", name="bad'name", registry=registry)
    assert isinstance(R.PairNotFound("x"), R.RegistryError) and isinstance(R.AliasNotFound("x"), R.RegistryError)


def test_unreachable_server_fails_fast(monkeypatch, tmp_path):
    import time

    import registry as R

    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    dead = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(R.RegistryUnavailable, match="unreachable"):
        R.resolve_alias("specdec-pair", "champion", registry=open_registry_at(dead))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", dead)  # the standard MLflow variable is respected
    with pytest.raises(R.RegistryUnavailable, match=dead.removeprefix("http://")):
        R.list_pair_versions(registry=open_registry_at())
    assert time.monotonic() - t0 < 30


def test_gate_is_a_pure_function_of_metrics():
    from registry.gate import evaluate_gate

    ok = {"acceptance_rate": 0.6, "acceptance_rate_ci_low": 0.41, "per_token_acceptance": 0.7,
          "exactness_mismatches": 0.0, "num_prompts": 12.0, "num_draft_tokens": 400.0}
    assert evaluate_gate(ok, gate=policy_gate()).passed
    few = evaluate_gate({**ok, "num_prompts": 4.0}, gate=policy_gate())
    assert not few.passed and "4 prompts" in few.reasons[0] and few.status == "inconclusive"  # too little evidence
    assert not evaluate_gate({**ok, "num_draft_tokens": 60.0}, gate=policy_gate()).passed
    assert evaluate_gate({**ok, "num_prompts": 1.0}, policy_gate(min_num_prompts=0)).passed
    assert evaluate_gate({**ok, "acceptance_rate_ci_low": 0.399}, gate=policy_gate()).reasons[0].startswith(
        "acceptance rate (acceptance_rate) CI lower bound 0.399 < floor 0.40 (policy default)")
    assert "missing" in evaluate_gate({"per_token_acceptance": 0.9}, gate=policy_gate()).reasons[0]
    assert evaluate_gate({**ok, "acceptance_rate_ci_low": float("nan")}, gate=policy_gate()).passed is False
    credibly_below = {**ok, "acceptance_rate": 0.30, "acceptance_rate_ci_low": 0.25, "acceptance_rate_ci_high": 0.35}
    assert evaluate_gate(credibly_below, gate=policy_gate()).status == "failed"  # the same judgement as the drift rules' floor
    assert evaluate_gate({**ok, "exactness_mismatches": 2.0}, policy_gate(require_exactness_clean=False)).passed
    assert not evaluate_gate(ok, policy_gate(min_acceptance_rate=0.5)).passed
    assert not evaluate_gate(ok, policy_gate(min_predicted_speedup=1.1)).passed  # speedup missing
