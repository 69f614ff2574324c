"""``specdec validate`` as a real process with a derived (torchao) draft: the terminal holds our own
output only: no torchao "Failed to load" / Triton lines, no torch pytree notes, no weight-loading
or download bars (issue 24)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.models import save_tiny_checkpoint

REPO = Path(__file__).resolve().parents[2]


def test_validate_terminal_has_no_library_noise(tmp_path):
    target = save_tiny_checkpoint(tmp_path / "target", seed=0)
    held = tmp_path / "h.jsonl"
    held.write_text("\n".join(json.dumps({"id": f"q{i}", "category": "chat", "prompt": f"say {i} things"})
                              for i in range(3)) + "\n")
    env = {**os.environ, "SPECDEC_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-m", "specdec.cli", "validate", "--target", str(target), "--draft", "derived:int8",
                        "--heldout", str(held), "--max-new-tokens", "8", "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    for noise in ("Failed to load", "Triton", "_pytree", "register_constant", "Loading weights", "it/s]"):
        assert noise not in out, f"{noise!r} on the terminal:\n{out[-3000:]}"
    assert (tmp_path / "out" / "report.json").exists()
    # without a terminal (logs, CI) each phase says what it is doing before the first prompt ends
    for step in ("loading target", "preparing drafter derived:int8", "warming up and timing", "[1/3]"):
        assert step in p.stderr, p.stderr[-3000:]
    # a derived copy: the target's checkpoint with the recipe, as `pair show` says (issue 43: one answer per kind)
    assert "serving (vllm):" in p.stdout and "derived draft: derived:int8 is the target with int8 weights" in p.stdout
