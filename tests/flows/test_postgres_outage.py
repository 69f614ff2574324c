"""A real PostgreSQL outage during a real ``specdec nightly run`` (issue 32, item 1).

The history lives on a throwaway PostgreSQL cluster (:mod:`tests.postgres`). The nightly is held in
validation (:mod:`tests.support.held_nightly`), the server is stopped (``pg_ctl -m immediate``), the
nightly goes on and can neither record its row nor mark it ``error``. With the server back, the same
night re-run at once must take the row over and validate (before: "already-running ... exit 4" for the
whole stale-claim window, because the claim had been dropped from the lease).
"""

from __future__ import annotations

import subprocess
import time

import pytest

from monitoring.receiver import WebhookReceiver
from tests.flows.test_nightly_crash_recovery import _env, _nightly_cmd, _register, setup  # noqa: F401 (fixture)
from tests.postgres import postgres_cluster, start_cluster, stop_cluster

pytestmark = pytest.mark.server


def _wait_for(path, proc, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, "nightly exited before reaching the step"
        assert time.monotonic() < deadline, f"nightly never reached {path.name}"
        time.sleep(0.2)


def test_postgres_down_during_validation_does_not_block_the_rerun(setup, tmp_path):  # noqa: F811
    home = tmp_path / "home"
    home.mkdir()
    _register(setup, home)
    with postgres_cluster("specdec") as (port, root), WebhookReceiver() as rx:
        env = _env(home, rx, SPECDEC_DB_URL=f"postgresql+psycopg://specdec@127.0.0.1:{port}/postgres")
        cmd = _nightly_cmd(setup)  # the real CLI with the test-only step subscriber
        first = subprocess.Popen(cmd, env={**env, "SPECDEC_TEST_HOLD_AT": "validation"}, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
        try:
            _wait_for(home / "held-validation", first)
            stop_cluster(root)  # the outage: the claim exists, the row cannot be written any more
            (home / "resume-validation").write_text("")
            out1 = first.communicate(timeout=600)[0]
        finally:
            if first.poll() is None:
                first.kill()
        assert first.returncode != 0, out1[-3000:]
        start_cluster(root, port)
        second = subprocess.run(_nightly_cmd(setup, "specdec.cli"), env=env, capture_output=True, text=True, timeout=900)
        out = second.stdout + second.stderr
        assert "already-running" not in out and second.returncode == 0, out1[-2000:] + "\n----\n" + out[-3000:]
        assert "failed" in out  # validated and recorded (threshold 1.0 fails it)

        from monitoring import history
        from monitoring.db import connect

        db = connect(url=env["SPECDEC_DB_URL"])
        assert [r.status for r in history.list_runs(db)] == ["failed"]
        db.dispose()
