"""Ctrl-C (a real SIGINT) to real ``specdec nightly run`` and ``specdec validate`` processes (issue 43, item 1).

Once: the current prompt finishes, then the command stops; twice: it stops at once. Either way it ends
within seconds with exit 130 (128 + SIGINT, as SIGTERM ends with 128 + 15), one ``stopped: SIGINT received``
line and no traceback, and the night's history claim is taken over by the next run at once, as after
SIGTERM (tests/flows/test_sigterm.py). Before: a SIGINT landed as a KeyboardInterrupt somewhere in Prefect's
engine, and the night went on (still running 120 s after two).

The nightly holds at its first ``validation`` step (a prompt just decoded) through the test-only
subscriber (:mod:`tests.support.held_nightly`): the first SIGINT arrives there, and the process must
neither stop in the middle nor decode the next prompt.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from monitoring.receiver import WebhookReceiver
from tests.flows.test_nightly_crash_recovery import _env, _nightly_cmd, _register, setup  # noqa: F401 (fixture)
from tests.support.lines import read_until
from tests.support.models import save_tiny_checkpoint

pytestmark = pytest.mark.server


def _wait_for(path: Path, p: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert p.poll() is None, p.communicate()[0][-3000:]
        assert time.monotonic() < deadline, f"never reached {path.name}"
        time.sleep(0.1)


def _finish(p: subprocess.Popen, within: float = 90) -> tuple[str, float]:
    t0 = time.monotonic()
    try:
        out = p.communicate(timeout=within)[0]
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail(f"still running {within:.0f} s after SIGINT")
    return out, time.monotonic() - t0


def _logs(home: Path) -> str:
    return "".join(f.read_text(errors="replace") for f in sorted((home / "logs").glob("nightly-*.log")))


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_stops_the_night_with_130_and_the_rerun_takes_over(setup, tmp_path, presses):  # noqa: F811
    home = tmp_path / "home"
    home.mkdir()
    _register(setup, home)
    with WebhookReceiver() as rx:
        p = subprocess.Popen(_nightly_cmd(setup), env={**_env(home, rx), "SPECDEC_TEST_HOLD_AT": "validation"},
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            _wait_for(home / "held-validation", p)
            time.sleep(0.5)
            os.kill(p.pid, signal.SIGINT)
            if presses == 1:
                time.sleep(3)  # the held prompt is still being finished: the first Ctrl-C does not cut it
                assert p.poll() is None, p.communicate()[0][-3000:]
                (home / "resume-validation").write_text("")  # the prompt ends: the night stops at once
            else:
                time.sleep(0.5)
                os.kill(p.pid, signal.SIGINT)  # the second: now, while the prompt is still held
            out, waited = _finish(p)
        finally:
            if p.poll() is None:
                p.kill()
        assert p.returncode == 130, (p.returncode, out[-3000:])
        assert waited < 60, waited  # "within seconds" (the watchdog's grace is 15 s), not a timing measurement
        assert "Traceback" not in out and out.count("SIGINT received") == 1, out[-3000:]
        assert "prompt 2/6" not in _logs(home)  # the night did not go on to the next prompt

        again = subprocess.run(_nightly_cmd(setup, "specdec.cli"), env=_env(home, rx), capture_output=True, text=True,
                               timeout=900)
        out2 = again.stdout + again.stderr
        assert again.returncode == 0 and "already-running" not in out2, out2[-3000:]
        assert "failed" in out2  # validated and recorded (threshold 1.0 fails it)


def test_ctrl_c_stops_validate_after_the_current_prompt(tmp_path):
    """``specdec validate`` without a terminal prints one ``[i/N]`` line per decoded prompt: after the
    first one, one Ctrl-C lets at most the prompt in flight finish, then one line and exit 130."""
    ckpt = save_tiny_checkpoint(tmp_path / "tiny")
    rows = "\n".join(f'{{"id": "p{i}", "category": "a", "prompt": "abc abc abc {i} abc"}}' for i in range(40))
    (tmp_path / "h.jsonl").write_text(rows + "\n")
    env = {**os.environ, "SPECDEC_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}
    p = subprocess.Popen([sys.executable, "-m", "specdec.cli", "validate", "--target", str(ckpt), "--draft", "ngram:3:1",
                          "--heldout", str(tmp_path / "h.jsonl"), "--max-new-tokens", "48", "--device", "cpu",
                          "--out", str(tmp_path / "out")],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen = read_until(p, "[1/40]", 600)
        os.kill(p.pid, signal.SIGINT)
        out, waited = _finish(p)
    finally:
        if p.poll() is None:
            p.kill()
    after = [line for line in out.splitlines() if line.startswith("[")]
    assert p.returncode == 130, (p.returncode, out[-3000:])
    assert waited < 60, waited
    assert len(after) <= 1, after  # at most the prompt in flight, then stop
    assert "Traceback" not in out and "SIGINT received" in out, out[-3000:]
    assert not (tmp_path / "out" / "report.json").exists()
