"""The drafter wrappers are drafters under Python 3.12 and 3.13 too (issue 39: ``validate --method both``
crashed there with "RecordingDrafter lacks members of the drafter protocol").

Only a cp311 CPU torch lies on this machine's disk and PyPI's cp312 torch needs the CUDA libraries (several GB),
so the full suite runs under 3.11 only (docs/gpu.md, "Supported Pythons"). This test runs the real drafter
classes under every 3.12+ interpreter it finds (pyenv's, or ``python3.12``/``python3.13`` on PATH), with every
third-party module stubbed (tests/support/protocol_probe.py), so ``isinstance`` is that interpreter's own.
With the old ``__getattr__``-forwarding RecordingDrafter it printed False under 3.12.1 and 3.13.0.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "tests" / "support" / "protocol_probe.py"


def newer_pythons() -> dict[str, str]:
    """``{"3.12": path, "3.13": path}`` of the interpreters found (pyenv's versions first, then PATH)."""
    found: dict[str, str] = {}
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    for minor in ("3.12", "3.13"):
        for d in sorted(pyenv.glob(f"{minor}.*"), reverse=True) if pyenv.is_dir() else []:
            if (d / "bin" / "python").exists():
                found[minor] = str(d / "bin" / "python")
                break
        else:
            exe = shutil.which(f"python{minor}")
            if exe:
                found[minor] = exe
    return found


PYTHONS = newer_pythons()


@pytest.mark.parametrize("minor", ["3.12", "3.13"])
def test_wrappers_are_drafters_under_newer_python(minor):
    if minor not in PYTHONS:
        pytest.skip(f"no Python {minor} here (pyenv install {minor} to run this check)")
    out = subprocess.run([PYTHONS[minor], str(PROBE), str(ROOT)], capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["python"] == [int(x) for x in minor.split(".")]
    assert got["results"] == {"DrafterWrapper": True, "RecordingDrafter": True, "StepRecorder": True,
                              "NgramDrafter": True}


def test_probe_runs_here_too():
    """The probe itself works under this interpreter (so a failure above is the newer Python's semantics)."""
    out = subprocess.run([sys.executable, str(PROBE), str(ROOT)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert all(json.loads(out.stdout.strip().splitlines()[-1])["results"].values())
