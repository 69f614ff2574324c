"""@champion moved outside specdec (as the MLflow UI does: set_registered_model_alias) to a version the
gate never let through is noticed; moves made by specdec, or to a version that passed, are not.
Real SQLite MLflow store."""

from __future__ import annotations

import datetime as dt

import pytest

from tests.support.mlflow_server import sqlite_store
from tests.support.reports import tiny_report
from tests.support.models import save_tiny_checkpoint
from tests.support.gate import policy_gate
from tests.support.registry import open_registry_at

T0 = dt.datetime(2026, 11, 30, 2, 0, tzinfo=dt.timezone.utc)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("ungated-ckpt") / "t", seed=3)


@pytest.fixture()
def store(tmp_path, monkeypatch, ckpt):
    """Three ngram pair versions (k = 2, 3, 4); v1 validated (passes) and promoted through the gate."""
    import registry as R

    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    uri = sqlite_store(tmp_path / "store")
    registry = open_registry_at(uri)
    t = R.register_model_version("target", ckpt, registry=registry)
    for k in (2, 3, 4):
        R.register_pair(t, None, drafter_kind="ngram", config=R.SpeculativeConfig(k), registry=registry)
    R.log_validation("specdec-pair", "1", tiny_report(0.8, (0.7, 0.9), num_speculative_tokens=2), tmp_path / "v1",
                     registry=registry, gate=policy_gate())
    R.promote("specdec-pair", "1", actor="alice", registry=registry, gate=policy_gate())
    return uri


def _ui_move(uri: str, version: str) -> None:
    from mlflow import MlflowClient

    MlflowClient(uri, registry_uri=uri).set_registered_model_alias("specdec-pair", "champion", version)


def test_hand_move_to_unvalidated_version_is_noticed_once(store, tmp_path):
    import registry as R
    from registry.ungated import check_alias

    registry = open_registry_at(store)
    assert check_alias("specdec-pair", registry=registry, now=T0, gate=policy_gate()) is None  # promoted by specdec
    _ui_move(store, "2")
    found = check_alias("specdec-pair", registry=registry, now=T0, gate=policy_gate())
    assert found is not None
    assert (found.version, found.recorded_version, found.gate_state, found.noticed_at) == (
        "2", "1", "never validated", "2026-11-30T02:00:00+00:00")
    msg = found.message()
    assert "specdec-pair@champion points at v2" in msg and "specdec last set v1" in msg
    assert "Noticed 2026-11-30 02:00:00 UTC" in msg
    pv = R.get_pair_version("specdec-pair", "2", download=False, registry=registry)
    assert pv.tags["promotion"] == "champion outside specdec, noticed 2026-11-30T02:00:00+00:00"
    assert pv.description.startswith("not validated at k=3") and "@champion outside specdec, noticed 2026-11-30" in pv.description

    # the next check (still unvalidated) keeps the first time it was noticed
    again = check_alias("specdec-pair", registry=registry, now=T0 + dt.timedelta(days=1), gate=policy_gate())
    assert again is not None and again.noticed_at == found.noticed_at

    # a failing validation keeps it ungated, with the gate's reasons
    R.log_validation("specdec-pair", "2", tiny_report(0.3, (0.2, 0.4), num_speculative_tokens=3), tmp_path / "f",
                     registry=registry, gate=policy_gate())
    failed = check_alias("specdec-pair", registry=registry, gate=policy_gate())
    assert failed.gate_state == "failed" and "acceptance rate (acceptance_rate) at k=3 CI lower bound 0.200 < floor 0.40 (policy default)" in failed.reasons[0]

    # a passing validation adopts it; a later failure is then drift, not an ungated promotion
    R.log_validation("specdec-pair", "2", tiny_report(0.8, (0.7, 0.9), num_speculative_tokens=3), tmp_path / "p",
                     registry=registry, gate=policy_gate())
    assert check_alias("specdec-pair", registry=registry, gate=policy_gate()) is None
    R.log_validation("specdec-pair", "2", tiny_report(0.3, (0.2, 0.4), num_speculative_tokens=3), tmp_path / "f2",
                     registry=registry, gate=policy_gate())
    assert check_alias("specdec-pair", registry=registry, gate=policy_gate()) is None


def test_moves_the_gate_allowed_or_specdec_made_are_not_ungated(store, tmp_path):
    import registry as R
    from registry.ungated import check_alias

    registry = open_registry_at(store)
    R.log_validation("specdec-pair", "3", tiny_report(0.8, (0.7, 0.9), num_speculative_tokens=4), tmp_path / "v3",
                     registry=registry, gate=policy_gate())
    _ui_move(store, "3")  # by hand, but to a version that passed
    assert check_alias("specdec-pair", registry=registry, gate=policy_gate()) is None
    _ui_move(store, "1")  # back by hand to v1, which also passed
    assert check_alias("specdec-pair", registry=registry, gate=policy_gate()) is None
    R.promote("specdec-pair", "2", force=True, reason="hotfix", actor="bob", registry=registry, gate=policy_gate())  # forced, recorded
    assert check_alias("specdec-pair", registry=registry, gate=policy_gate()) is None
    R.demote("specdec-pair", "champion", registry=registry)
    assert check_alias("specdec-pair", registry=registry, gate=policy_gate()) is None  # no champion at all
