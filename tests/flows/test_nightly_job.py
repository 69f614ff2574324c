"""One mapping from the nightly section (``SPECDEC_NIGHTLY_*``) to the flow's parameters,
:meth:`flows.nightly.NightlyJob.from_settings`, shared by ``nightly run``, ``nightly serve`` and the
deployments: before it, ``SPECDEC_NIGHTLY_METHOD`` changed ``nightly serve`` and ``nightly run`` ignored it."""

from __future__ import annotations

import inspect

import pytest

from flows.cli import NightlyRun
from flows.deploy import deployment_parameters
from flows.nightly import NightlyJob, nightly_validation_flow
from flows.settings import NightlySettings

NOT_GIVEN = {"pairs": None, "aliases": None, "heldout": None, "limit": None, "device": None, "batch_size": None}


@pytest.fixture
def section(monkeypatch):
    for k, v in {"SPECDEC_NIGHTLY_METHOD": "decode", "SPECDEC_NIGHTLY_DECODE_FRACTION": "0.5",
                 "SPECDEC_NIGHTLY_LIMIT": "24", "SPECDEC_NIGHTLY_PAIRS": '["p1", "p2"]',
                 "SPECDEC_NIGHTLY_DTYPE": "float32", "SPECDEC_NIGHTLY_BATCH_SIZE": "3"}.items():
        monkeypatch.setenv(k, v)
    return NightlySettings()


def test_nightly_run_and_serve_take_the_same_parameters_from_the_section(section):
    run = NightlyRun(section=section, options=NOT_GIVEN).parameters()
    served = deployment_parameters(section)
    assert run["method"] == served["method"] == "decode"
    assert run["decode_fraction"] == served["decode_fraction"] == 0.5
    assert (run["limit"], run["pairs"], run["dtype"], run["batch_size"]) == (24, ["p1", "p2"], "float32", 3)
    assert {k: v for k, v in run.items() if k != "fail_on_failure"} == {
        k: v for k, v in served.items() if k != "fail_on_failure"}
    assert (run["fail_on_failure"], served["fail_on_failure"]) == (False, True)


def test_the_commands_options_win_over_the_section(section):
    options = {**NOT_GIVEN, "pairs": ["mine"], "limit": 6, "device": "cpu", "batch_size": 1}
    p = NightlyRun(section=section, options=options).parameters()
    assert (p["pairs"], p["limit"], p["device"], p["batch_size"], p["method"]) == (["mine"], 6, "cpu", 1, "decode")


def test_parameters_are_the_flows_own_and_round_trip(section):
    job = NightlyJob.from_settings(section, versions=["4"], revert_ungated=True)
    params = job.parameters()
    assert set(params) <= set(inspect.signature(nightly_validation_flow.fn).parameters)
    assert NightlyJob.from_settings(section, **params) == job
    assert job.validation.method == "decode" and job.versions == ("4",)


def test_a_key_the_flow_does_not_take_is_refused(section):
    with pytest.raises(TypeError, match="mehtod"):
        NightlyJob.from_settings(section, mehtod="replay")
