"""``flow.serve()`` (``specdec nightly serve``, the watch test's runner) runs the nightly flow in a
spawned process from a cloudpickle of the flow, which carries only the globals the flow's body names;
its parameter annotations (``dt.date``) must still resolve there, or every served run fails with
"Nightly_Validation_FlowModel is not fully defined"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOAD = ("import sys, cloudpickle; f = cloudpickle.loads(sys.stdin.buffer.read()); "
        "p = f.validate_parameters({'pairs': ['x'], 'versions': ['3'], 'scheduled_date': '2026-12-01'}); "
        "print(p['versions'], p['scheduled_date'])")


def test_nightly_flow_parameters_validate_after_cloudpickle():
    import cloudpickle

    from flows.nightly import nightly_validation_flow

    r = subprocess.run([sys.executable, "-c", LOAD], input=cloudpickle.dumps(nightly_validation_flow),
                       capture_output=True, cwd=REPO, timeout=300, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert r.stdout.decode().split() == ["['3']", "2026-12-01"]
