"""A model whose logits are NaN through the real ``specdec validate`` and ``specdec draft recommend``
processes (issue 43, item 5): greedy and sampled, decode and replay.

Before: a NaN draft at temperature 0.8 through ``specdec validate`` (not the nightly, which named the side)
ended in a traceback from the untimed warm-up generation (``NonFiniteLogits`` raised outside any prompt),
and ``draft recommend`` with a NaN target in one from its pass-cost timing. Now each is one line naming the
broken side, exit 1, and no report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.flows.test_broken_model import _nan_checkpoint
from tests.support.models import save_tiny_checkpoint


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nan")
    rows = [{"id": f"p{i}", "category": "a", "prompt": f"abc abc abc {i} abc"} for i in range(3)]
    (tmp / "h.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return {"ok": str(save_tiny_checkpoint(tmp / "ok")), "nan": str(_nan_checkpoint(tmp / "nan")),
            "heldout": str(tmp / "h.jsonl")}


def _specdec(args: list[str], tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPECDEC_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "specdec.cli", *args], capture_output=True, text=True, env=env,
                          timeout=600)


@pytest.mark.parametrize("side,temperature,method", [("draft", 0.8, "decode"), ("draft", 0.0, "decode"),
                                                     ("target", 0.8, "decode"), ("draft", 0.8, "replay")])
def test_validate_names_the_broken_side_in_one_line(models, tmp_path, side, temperature, method):
    target, draft = (models["nan"], models["ok"]) if side == "target" else (models["ok"], models["nan"])
    p = _specdec(["validate", "--target", target, "--draft", draft, "--heldout", models["heldout"],
                  "--temperature", str(temperature), "--method", method, "--max-new-tokens", "8", "--device", "cpu",
                  "--out", str(tmp_path / "out")], tmp_path)
    said = p.stdout + p.stderr
    assert p.returncode == 1, said[-3000:]
    assert "Traceback" not in said and "│" not in said, said[-3000:]  # no plain or rich traceback
    errors = [line for line in said.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"the {side} model is broken" in errors[0], said[-3000:]
    assert not (tmp_path / "out" / "report.json").exists()


def test_recommend_names_the_broken_target_in_one_line(models, tmp_path):
    p = _specdec(["draft", "recommend", "--target", models["nan"], "--candidate", "ngram", "--heldout",
                  models["heldout"], "--max-new-tokens", "8", "--k-max", "2", "--device", "cpu"], tmp_path)
    said = p.stdout + p.stderr
    assert p.returncode == 1, said[-3000:]
    assert "Traceback" not in said and "│" not in said, said[-3000:]
    errors = [line for line in said.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "the target model is broken" in errors[0], said[-3000:]
