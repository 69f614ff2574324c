"""The speed benchmark script runs end to end (tiny checkpoints, CPU) and writes its contract.

Speed itself is never asserted here (DEVELOPERS.md: speed goes in the benchmark's result files);
this checks that ``benchmarks/perf.py`` still runs against the current decoding core, that our
speculative decoding, transformers' assisted generation and target-only decoding produce the
same greedy tokens, and that the result JSON has the top-level floats ``p1``, ``p2``, ``p3``,
``p5`` (or a stated reason) next to the details.
"""

import json
import math
import sys
from pathlib import Path

import pytest

from tests.support.models import save_tiny_checkpoint

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def perf_main():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import perf

        yield perf.main
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_perf_script_quick_run_on_tiny_models(perf_main, tmp_path):
    target = save_tiny_checkpoint(tmp_path / "target", seed=0, hidden_size=64)
    draft = save_tiny_checkpoint(tmp_path / "draft", seed=0, hidden_size=64, perturb=0.02)
    out = tmp_path / "results"
    rc = perf_main([
        "--quick", "--target", str(target), "--drafters", "ngram", "--draft", str(draft),
        "--batch-sizes", "1,2", "--threads", "1", "--out-dir", str(out), "--tag=-test", "--passes", "static",
    ])
    assert rc == 0
    files = sorted(out.glob("*-cpu-test.json"))
    assert len(files) == 1 and files[0].with_suffix(".md").exists()
    res = json.loads(files[0].read_text())
    for key in ("p1", "p2", "p3", "p5"):
        assert key in res
        assert isinstance(res[key], float) or res.get(f"{key}_reason"), key
    assert res["machine"]
    # --passes static ran our decoding through the static cache; every method was warmed up first
    assert res["config"]["passes"] == "static" and res["static_passes"]["target"]["uncaptured"] > 0
    assert {"target_only", "ours ngram"} <= set(res["warmup_seconds"])
    assert len(res["drafters"]) == 2 and "ngram" in res["drafters"]
    assert res["per_prompt"]
    for prompt in res["per_prompt"]:
        for name, d in prompt["drafters"].items():
            # greedy: ours, transformers' assisted generation and target-only emit the same tokens
            assert d["ours_identical_to_target_only"] is True, (prompt["prompt_id"], name)
            assert d["hf_identical_to_target_only"] is True, (prompt["prompt_id"], name)
    assert isinstance(res["p5"], float) and math.isfinite(res["p5"])
    for name, d in res["drafters"].items():  # the speed contract of issue 14
        assert d["compared_outputs"] >= 1 and d["identical_outputs"] == d["compared_outputs"], name
        assert d["measured_speedup"] > 0 and len(d["measured_speedup_ci"]) == 2, name
        assert d["per_category"] and all("hf" in v for v in d["per_category"].values()), name
        # issue 33: the prediction is the product's one speed model on calibrated costs, P1 its ratio
        assert math.isfinite(d["predicted_speedup"]) and d["p1"] == d["measured_speedup"] / d["predicted_speedup"], name
        assert d["by_context"]["short"]["verify_cost"][0] == 1.0 and "ratio" in d["ours_over_hf"], name
    assert res["runs"]["calibration"]["short"]["c"].keys() == res["drafters"].keys()
