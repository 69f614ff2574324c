"""The one process lifecycle (:mod:`specdec.processes`) against real child process groups: a server that ignores
SIGTERM, and one whose child outlives it ignoring SIGTERM, are both gone after :func:`stop`, children included,
the leader reaped."""

from __future__ import annotations

import subprocess
import time

import psutil
import pytest

from specdec import processes


def _gone(pid: int) -> bool:
    """The process no longer runs (gone, or a zombie its new parent has not reaped yet)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_gone(pid: int, within_s: float = 10.0) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        if _gone(pid):
            return True
        time.sleep(0.05)
    return _gone(pid)


def _started(script: str) -> tuple[subprocess.Popen, int]:
    """A ``sh`` group leader running ``script`` (which prints its child's pid first), and that child's pid."""
    proc = processes.spawn(["sh", "-c", script], stdout=subprocess.PIPE, text=True)
    child = int(proc.stdout.readline())
    assert not _gone(child) and proc.poll() is None
    return proc, child


@pytest.mark.parametrize("script, signal_that_ended_it", [
    ("trap '' TERM; sleep 300 & echo $!; wait; wait", -9),  # the leader and its child ignore SIGTERM: killed
    ("(trap '' TERM; exec sleep 300) & echo $!; wait", -15),  # the leader ends on SIGTERM, its child does not
])
def test_stop_ends_the_whole_group_within_the_deadline(script, signal_that_ended_it):
    proc, child = _started(script)
    assert processes.stop(proc, grace_s=0.5) == signal_that_ended_it
    assert proc.returncode == signal_that_ended_it  # reaped: no zombie leader left behind
    assert _wait_gone(child), f"the child {child} still runs after stop()"
    proc.stdout.close()


def test_a_group_that_exits_on_sigterm_is_not_killed():
    proc, child = _started("sleep 300 & echo $!; wait")
    assert processes.stop(proc, grace_s=30) == -15 and _wait_gone(child)
    proc.stdout.close()


def test_stop_of_nothing_or_of_an_exited_process():
    assert processes.stop(None, grace_s=1) is None
    proc = processes.spawn(["sh", "-c", "exit 3"])
    proc.wait()
    assert processes.stop(proc, grace_s=1) == 3
