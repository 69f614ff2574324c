"""A readable terminal (issue 12, item 7): ``specdec nightly run`` as a real process with a bad
held-out file prints one error line of ours, no traceback; the traceback is in the log file,
and ``--debug`` shows it on the terminal."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.server


def test_bad_heldout_is_one_line_and_the_traceback_goes_to_the_log_file(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "category": "x", "prompt": "hi"}\n{not json\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_TRACKING", "SPECDEC_"))}
    env.update({"SPECDEC_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "true",
                "MLFLOW_DISABLE_TELEMETRY": "true", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
    cmd = [sys.executable, "-m", "specdec.cli", "nightly", "run", "--heldout", str(bad), "--device", "cpu"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert "Traceback" not in out, out
    assert "bad.jsonl" in out and "error:" in out
    logs = list((tmp_path / "home" / "logs").glob("nightly-*.log"))
    assert len(logs) == 1 and "Traceback" in logs[0].read_text()
    assert re.search(r"log file: .*nightly-", out)

    d = subprocess.run(cmd + ["--debug"], capture_output=True, text=True, env=env, timeout=600)
    assert d.returncode == 1 and "Traceback" in d.stdout + d.stderr
