"""A process that ends, however it ends, leaves nothing that blocks or misreports the next run
(issue 25, item 6).

- A nightly process whose history DB failed mid-validation could not mark its claim ``error``; it
  then exited normally and removed its lease, so re-runs said "already-running" (exit 0) for the
  whole stale-claim window. Here a real process takes a claim on a real SQLite history, cannot
  free it (as with the DB down), releases its lease and exits 0; the next claim of the same key
  must be taken over at once.
- Two first ``nightly run`` processes at once on an empty Prefect home: neither may crash in
  Prefect's own database setup.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import textwrap

import pytest

from monitoring import history
from monitoring.db import connect
from tests.support.reports import make_report

pytestmark = pytest.mark.server


def _key():
    rep = make_report(0.6)
    return history.RunKey.build("pair-o", "1", rep.heldout_name, rep.heldout_version, rep.config, dt.date(2026, 11, 9))


def test_a_claim_left_by_a_process_that_exited_is_taken_over_at_once(tmp_path):
    from flows.recovery import holder_dead

    home = tmp_path / "home"
    url = f"sqlite:///{tmp_path / 'history.db'}"
    code = textwrap.dedent(f"""
        import datetime as dt
        from flows.recovery import NightlyLease
        from monitoring import history
        from monitoring.db import connect
        from tests.support.reports import make_report
        rep = make_report(0.6)
        key = history.RunKey.build("pair-o", "1", rep.heldout_name, rep.heldout_version, rep.config, dt.date(2026, 11, 9))
        db = connect(url={url!r})
        lease = NightlyLease.mine({str(home)!r})
        claim = history.claim_run(db, key, alias="champion")
        lease.add_claim(claim.run_id, claim.token)
        # validation fails and the history DB is down: mark_error raises, drop_claim is never reached
        lease.release()  # the CLI's finally on a normal exit
    """)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)
    db = connect(url=url)
    claim = history.claim_run(db, _key(), alias="champion", stale_after_s=3600, holder_dead=holder_dead(home))
    assert claim.previous_status and claim.previous_status.startswith("running"), claim


def test_two_first_nightlies_at_once_on_an_empty_prefect_home(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_TRACKING", "SPECDEC_"))}
    env.update({"PREFECT_HOME": str(tmp_path / "prefect"), "HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "true",
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "COLUMNS": "1000"})
    procs = [subprocess.Popen([sys.executable, "-m", "specdec.cli", "nightly", "run", "--pair", "no-such-pair",
                               "--alias", "champion", "--device", "cpu"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env={**env, "SPECDEC_HOME": str(tmp_path / f"h{i}")})
             for i in range(2)]
    outs = [p.communicate(timeout=400)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert "Prefect API server exited" not in out and "Traceback" not in out, out[-3000:]
        assert "no-such-pair" in out, out[-3000:]


def test_already_running_with_nothing_validated_is_not_exit_0(tmp_path):
    """A live nightly (paused in validation) holds tonight's claim; a second one validates nothing
    and says so with exit 4 (before: exit 0)."""
    import json
    import signal
    import time

    from monitoring.receiver import WebhookReceiver
    from tests.flows.test_nightly_crash_recovery import _env, _nightly_cmd, _register
    from tests.support.models import save_tiny_checkpoint

    rows = [{"id": f"p{i}", "category": "a", "prompt": f"abc abc abc {i} abc abc"} for i in range(6)]
    (tmp_path / "h.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    setup = {"tmp": tmp_path, "ckpt": str(save_tiny_checkpoint(tmp_path / "tiny")), "heldout": str(tmp_path / "h.jsonl")}
    home = tmp_path / "home"
    home.mkdir()
    _register(setup, home)
    with WebhookReceiver() as rx:
        first = subprocess.Popen(_nightly_cmd(setup), env=_env(home, rx, SPECDEC_TEST_PAUSE_AT="validation"),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 600
            while not (home / "paused-validation").exists():
                assert first.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
            second = subprocess.run(_nightly_cmd(setup, "specdec.cli"), env=_env(home, rx), capture_output=True, text=True, timeout=600)
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(30)
    out = second.stdout + second.stderr
    assert "already-running" in out and second.returncode == 4, out[-3000:]
