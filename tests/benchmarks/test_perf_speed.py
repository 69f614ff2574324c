"""The benchmark predicts with the product's one speed model (issue 33): no formula of its own."""

import math
import sys
from pathlib import Path

import pytest

from specdec.validation.speed import StepCounters, VerifyCost, predicted_speedup

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def perf_speed():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import perf_speed

        yield perf_speed
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


CAL = {"short": {"c": {"d": 0.3}, "verify_cost": [1.0, 1.1, 1.2, 1.3, 1.4]},
       "long": {"c": {"d": 0.5}, "verify_cost": [1.0, 1.5, 2.0, 2.5, 3.0]}}
STEPS = [(0, 0), (4, 4), (4, 1), (2, 0), (0, 0), (4, 3)]


def _rows(prompt_tokens: int, prefill: float):
    t = {"prompt_id": "p", "repeat": 0, "new_tokens": 33, "seconds": 2.0 + prefill, "prefill_seconds": prefill,
         "prompt_tokens": prompt_tokens}
    o = {"prompt_id": "p", "repeat": 0, "new_tokens": 33, "seconds": 1.0, "prompt_tokens": prompt_tokens, "steps": STEPS}
    return [t], [o]


@pytest.mark.parametrize("tokens,bucket", [(40, "short"), (900, "long")])
def test_prediction_is_the_one_model_at_the_prompts_context(perf_speed, tokens, bucket):
    t, o = _rows(tokens, 0.0)
    got = perf_speed.predicted_speed(t, o, CAL, "d")
    want = predicted_speedup(StepCounters.from_steps(STEPS[1:]), CAL[bucket]["c"]["d"],
                             VerifyCost.from_list(CAL[bucket]["verify_cost"]))
    # no prefill, one token from the prefill step on both sides: the pooled prediction is the model's
    assert got["predicted_speedup"] == pytest.approx(want, rel=1e-12)
    assert got["predicted_by_prompt"] == {"p": pytest.approx(want, rel=1e-12)}


def test_prefill_is_added_on_both_sides(perf_speed):
    t, o = _rows(40, 1.0)  # 1 s prefill + 2 s decode target-only
    s = predicted_speedup(StepCounters.from_steps(STEPS[1:]), 0.3, VerifyCost.from_list(CAL["short"]["verify_cost"]))
    pred_s = 1.0 + 32 / (s * 32 / 2.0)
    assert perf_speed.predicted_speed(t, o, CAL, "d")["predicted_speedup"] == pytest.approx(3.0 / pred_s, rel=1e-12)


def test_no_prediction_without_prefill_timing_or_costs(perf_speed):
    t, o = _rows(40, math.nan)
    assert math.isnan(perf_speed.predicted_speed(t, o, CAL, "d")["predicted_speedup"])
    t, o = _rows(40, 0.0)
    assert math.isnan(perf_speed.predicted_speed(t, o, {}, "d")["predicted_speedup"])


def test_the_benchmark_has_no_speed_model_of_its_own():
    import ast

    from tests.validation.test_one_speed_model import _predicts_speedup

    found = []
    for path in sorted((ROOT / "benchmarks").glob("perf*.py")):
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, ast.FunctionDef) and _predicts_speedup(fn):
                found.append(f"{path.name}:{fn.name}")
    assert found == []
