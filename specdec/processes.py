"""One lifecycle for the child processes the product starts (the Prefect API server, ``llama-server``,
``vllm serve``, vLLM's offline worker): each runs in a process group of its own (:func:`spawn`), and
:func:`stop` ends the whole group: SIGTERM, a wait with a deadline, SIGKILL, the leader reaped.

A server's own children (vLLM's engine core, a worker's helpers) are in its group, so they end with it even
when they ignore SIGTERM or outlive their parent; nothing is left running or unreaped after :func:`stop`.
POSIX only (``start_new_session``, ``killpg``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any

__all__ = ["spawn", "stop"]


def spawn(argv: list[str], **popen: Any) -> subprocess.Popen:
    """``subprocess.Popen(argv, **popen)`` as the leader of a new session and process group (``start_new_session``),
    so :func:`stop` reaches its children too. Raises what ``Popen`` raises (OSError: no such program)."""
    return subprocess.Popen(argv, start_new_session=True, **popen)


def _signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to process group ``pgid``; False when no process is left in it."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member that changed its credentials: the leader at least
        return True
    return True


def _group_alive(pgid: int) -> bool:
    return _signal_group(pgid, 0)


def stop(proc: subprocess.Popen | None, *, grace_s: float) -> int | None:
    """Stop ``proc`` (started by :func:`spawn`) and every process of its group: SIGTERM to the group, wait until the
    group is empty or ``grace_s`` seconds have passed, then SIGKILL to what is left; the leader is always reaped.

    Args:
        proc: the group leader, or None (nothing to do). Already exited: its leftover group members are killed.
        grace_s: seconds the group has to exit on SIGTERM (>= 0).
    Returns:
        The leader's exit code (negative: the signal that ended it), None for ``proc`` None.
    """
    if proc is None:
        return None
    pgid = proc.pid  # the leader of its own session: its pid is the group id
    deadline = time.monotonic() + max(0.0, grace_s)
    if _signal_group(pgid, signal.SIGTERM):
        while time.monotonic() < deadline:
            proc.poll()  # reaps the leader as soon as it exits (a zombie leader keeps the group alive)
            if not _group_alive(pgid):
                break
            time.sleep(0.05)
        _signal_group(pgid, signal.SIGKILL)
    return proc.wait()
