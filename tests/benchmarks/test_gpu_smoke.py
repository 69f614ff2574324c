"""The GPU smoke check cannot rot: ``benchmarks/gpu/smoke.py --device cpu`` runs here, in ``make test``.

It is the script the remote GPU machine runs first (benchmarks/gpu/README.md); on the CPU it checks the same
things in fp32 (imports of the carried packages, KV crop, derived and layer-skip drafts token-identical to
target-only decoding, B = 2 rows == single rows, static passes == eager) and must exit 0.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_smoke_script_passes_on_cpu():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "smoke.py"), "--device", "cpu",
                          "--dtype", "float32", "--kinds", "int8"], capture_output=True, text=True, timeout=900,
                         cwd=ROOT, env=env)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-3000:]
    assert "smoke OK" in out.stdout
    for check in ("derived:int8 greedy token-identical=True", "layerskip:1 greedy token-identical=True",
                  "batch B=2 rows == single-row runs: True", "passes=static token-identical to eager=True"):
        assert check in out.stdout, check
