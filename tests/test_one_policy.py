"""One acceptance policy per settings tree (issue 50): the tree reads ``SPECDEC_POLICY__*`` once and builds one
:class:`~specdec.policy.AcceptancePolicy`; the drift rules hold that object (no copies of its values, no read of the
environment per evaluation), the night's one gate is built from it, and the older ``SPECDEC_RULES__*`` names of
its values still work, with one warning each."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest

from monitoring import rules
from monitoring.settings import RuleSettings
from registry.gate import GateConfig
from tests.support.reports import make_report

ROOT = Path(__file__).resolve().parents[1]
SHADOW_FIELDS = {"absolute_threshold", "min_draft_tokens", "alert_side", "floor_source", "estimator"}


@pytest.fixture()
def tree(monkeypatch, tmp_path):
    for var in ("SPECDEC_POLICY__THRESHOLD", "SPECDEC_RULES__ABSOLUTE_THRESHOLD", "SPECDEC_DB_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "h"))
    monkeypatch.chdir(tmp_path)  # no stray .env

    def load():
        from flows.settings import load_settings

        return load_settings()
    return load


def test_the_rules_hold_the_trees_one_policy_and_read_no_environment_when_they_judge(tree, monkeypatch):
    monkeypatch.setenv("SPECDEC_POLICY__THRESHOLD", "0.7")
    s = tree()
    assert s.monitoring.rules.policy is s.policy and s.policy.threshold == 0.7
    assert GateConfig.from_policy(s.policy).floor == s.monitoring.rules.floor
    report = make_report(0.62, ci_half=0.03)  # CI upper 0.65 < 0.70
    monkeypatch.setenv("SPECDEC_POLICY__THRESHOLD", "0.3")  # changed after the tree was built: not seen
    assert rules.verdict(rules.evaluate(report, None, s.monitoring.rules)) == "failed"
    assert s.monitoring.rules.policy.threshold == 0.7


def test_the_rules_keep_no_copy_of_the_policys_values():
    assert SHADOW_FIELDS & set(RuleSettings.model_fields) == set()


@pytest.mark.parametrize("old, new, value, field, expected", [
    ("SPECDEC_RULES__ABSOLUTE_THRESHOLD", "SPECDEC_POLICY__THRESHOLD", "0.55", "threshold", 0.55),
    ("SPECDEC_RULES__MIN_DRAFT_TOKENS", "SPECDEC_POLICY__MIN_DRAFT_TOKENS", "999", "min_draft_tokens", 999),
    ("SPECDEC_RULES__ALERT_SIDE", "SPECDEC_POLICY__ALERT_SIDE", "point", "alert_side", "point"),
    ("SPECDEC_RULES__ESTIMATOR", "SPECDEC_POLICY__ESTIMATOR", "per_token", "estimator", "per_token"),
])
def test_old_names_still_set_the_policy_with_one_warning_and_the_new_name_wins(tree, monkeypatch, old, new, value,
                                                                             field, expected):
    from specdec.settings import aliases

    monkeypatch.setattr(aliases, "_warned", set())
    monkeypatch.setenv(old, value)
    with pytest.warns(FutureWarning, match=f"{old} is an older name for {new}"):
        s = tree()
    assert getattr(s.policy, field) == getattr(s.monitoring.rules.policy, field) == expected
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tree()  # once per process
    monkeypatch.setenv(new, {"threshold": "0.35", "min_draft_tokens": "7", "alert_side": "lower",
                             "estimator": "pooled"}[field])
    assert getattr(tree().policy, field) != expected


def _calls(source: str, name: str) -> int:
    """Calls of a function or method named ``name`` in ``source``."""
    return sum(isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", None)) == name
               for n in ast.walk(ast.parse(source)))


def test_one_gate_per_night_and_the_pair_floor_found_by_it():
    """flows/nightly.py builds the night's gate once (of the tree's policy) and leaves the pair version's floor to
    the gate (``GateConfig.for_pair``: inside ``judge_report``, which the drift rules then take, and once before
    any model loads, ``check_pair_tags``); no second floor computation beside it."""
    nightly = (ROOT / "flows" / "nightly.py").read_text()
    assert _calls(nightly, "from_policy") == 1
    assert _calls(nightly, "floor_for") == 0 and _calls(nightly, "for_pair") == 1
    assert _calls((ROOT / "registry" / "runs.py").read_text(), "for_pair") == 1


def test_the_count_sees_a_call():
    assert _calls("g = GateConfig.from_policy(p)\nh = from_policy(q)\nfrom_policy\n", "from_policy") == 2
