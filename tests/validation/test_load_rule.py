"""``validate`` applies the nightly's load rule (issue 43, item 8): a speedup below 1 measured while the
machine ran at more than ``OVERLOADED_LOAD_PER_CPU`` (1.25) load per CPU is "speed inconclusive ... re-run on
an idle machine", as the nightly's speed rule calls it, not "SLOWER than target-only" as a fact (before: the
fact, at load 3-4 per CPU). On an idle machine the same numbers still say SLOWER."""

from __future__ import annotations

import pytest

from specdec.validation.findings import findings
from specdec.validation.report import GroupMetrics, ValidationReport
from tests.support.reports import make_report


def _notes(load: float, cpus: int = 2) -> list[str]:
    g = GroupMetrics(num_prompts=5, num_speculative_tokens=4, speedup=0.6, predicted_speedup=0.7,
                     predicted_speedup_at_recommended=0.8, recommended_num_speculative_tokens=1,
                     predicted_cost_ratio=1.4, verify_cost_by_n=[1.0, 1.1, 1.15, 1.2, 1.25], load_avg_1m=load,
                     num_cpus=cpus)
    d = make_report().to_dict()
    d["overall"] = {**d["overall"], **g.__dict__}
    return findings(ValidationReport.from_dict(d))


@pytest.mark.parametrize("load", [3.0, 8.0])
def test_slower_on_a_loaded_machine_is_inconclusive(load):
    notes = _notes(load)
    assert not any("SLOWER" in n for n in notes), notes
    assert any(n.startswith("speed inconclusive") and f"{load / 2:.2f} per CPU > 1.25" in n for n in notes), notes


@pytest.mark.parametrize("load", [0.5, 2.4])
def test_slower_on_an_idle_machine_is_a_finding(load):
    assert any("SLOWER than target-only" in n for n in _notes(load))
