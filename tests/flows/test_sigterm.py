"""A real SIGTERM to a real ``specdec nightly run`` process (issue 32, item 4).

Orchestrators stop jobs with SIGTERM. It must stop the run promptly, every time, with exit 143, and
leave the night's history claim for the next run to take over at once. Two landings:

- ``hold``: the main thread waits in validation (Prefect's handler raises there);
- ``finalizer``: the signal lands while a finalizer (``__del__``) runs in the main thread, where a
  raised exception is printed as "Exception ignored" and dropped (before: the night carried on and
  exited 0). :mod:`tests.support.held_nightly` runs the real CLI with that finalizer at the
  validation step.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from monitoring.receiver import WebhookReceiver
from tests.flows.test_nightly_crash_recovery import _env, _nightly_cmd, _register, setup  # noqa: F401 (fixture)

pytestmark = pytest.mark.server


@pytest.mark.parametrize("landing", ["hold", "finalizer"])
def test_sigterm_stops_the_night_with_143_and_the_rerun_takes_over(setup, tmp_path, landing):  # noqa: F811
    home = tmp_path / "home"
    home.mkdir()
    _register(setup, home)
    control, marker = {"hold": ("SPECDEC_TEST_HOLD_AT", "held-validation"),
                       "finalizer": ("SPECDEC_TEST_FINALIZER_AT", "in-finalizer-validation")}[landing]
    with WebhookReceiver() as rx:
        cmd = _nightly_cmd(setup)  # the real CLI with the test-only step subscriber
        p = subprocess.Popen(cmd, env={**_env(home, rx), control: "validation"}, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 600
            while not (home / marker).exists():
                assert p.poll() is None, p.communicate()[0][-3000:]
                assert time.monotonic() < deadline, "nightly never reached validation"
                time.sleep(0.1)
            time.sleep(0.5)  # well inside the wait / the finalizer's sleep
            os.kill(p.pid, signal.SIGTERM)
            t0 = time.monotonic()
            try:
                out = p.communicate(timeout=90)[0]
            except subprocess.TimeoutExpired:
                pytest.fail("nightly still running 90 s after SIGTERM")
            waited = time.monotonic() - t0
        finally:
            if p.poll() is None:
                p.kill()
        assert p.returncode == 143, (p.returncode, out[-3000:])
        assert waited < 60, waited  # the watchdog's grace is 15 s; "promptly", not a timing measurement
        assert "SIGTERM" in out and "Traceback" not in out, out[-3000:]

        again = subprocess.run(_nightly_cmd(setup, "specdec.cli"), env=_env(home, rx), capture_output=True, text=True, timeout=900)
        out2 = again.stdout + again.stderr
        assert again.returncode == 0 and "already-running" not in out2, out2[-3000:]
        assert "failed" in out2  # validated and recorded (threshold 1.0 fails it)
        # the results table (issue 32, first use): a speedup column, and readable width without a terminal
        assert "speedup [95% CI]" in out2 and max(len(line) for line in again.stdout.splitlines()) <= 200, again.stdout
