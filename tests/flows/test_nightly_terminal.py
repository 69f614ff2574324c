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


PROGRESS = r"""
import logging, sys
from specdec.terminal import ReadableTerminal
with ReadableTerminal(sys.argv[1], "nightly") as term:
    import prefect  # noqa: F401 (configures its own loggers, not the root's terminal)
    term.refresh()
    logging.getLogger("prefect.task_runs").info("np v1: replay 3/6")
    logging.getLogger("flows.nightly").warning("ungated promotion: np@champion points at v2")
    logging.getLogger("httpx").info("HTTP Request: GET http://127.0.0.1/api/health")
"""


def test_progress_and_our_warnings_reach_the_terminal(tmp_path):
    """`nightly run` showed nothing for a whole run: the root logger had no terminal handler."""
    env = {**os.environ, "SPECDEC_HOME": str(tmp_path)}
    p = subprocess.run([sys.executable, "-c", PROGRESS, str(tmp_path)], capture_output=True, text=True, env=env,
                       timeout=300, cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert p.returncode == 0, p.stderr[-2000:]
    assert "np v1: replay 3/6" in p.stderr and "WARNING ungated promotion: np@champion points at v2" in p.stderr
    assert "HTTP Request" not in p.stderr  # third-party INFO stays in the log file
    log = next(tmp_path.glob("logs/nightly-*.log")).read_text()
    assert "HTTP Request" in log and "replay 3/6" in log


def test_a_settings_error_inside_the_flow_is_printed_once(tmp_path):
    """issue 32, minor: a malformed rule setting was printed twice (Prefect's engine logger and ours)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_TRACKING", "SPECDEC_"))}
    env.update({"SPECDEC_HOME": str(tmp_path / "home"), "SPECDEC_RULES__ABSOLUTE_THRESHOLD": "abc",
                "COLUMNS": "200", "HF_HUB_OFFLINE": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
    p = subprocess.run([sys.executable, "-m", "specdec.cli", "nightly", "run", "--pair", "x", "--device", "cpu"],
                       env=env, capture_output=True, text=True, timeout=400)
    out = p.stdout + p.stderr
    assert p.returncode == 2 and out.count("valid number") == 1 and "Traceback" not in out, out[-3000:]
    assert "(got 'abc')" in out
