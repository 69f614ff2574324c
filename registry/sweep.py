"""Registration runs left RUNNING by a killed ``pair register`` are marked FAILED.

:func:`registry.models.log_and_register` marks its run FAILED on any exception, but ``kill -9``
(or a lost machine) skips that. Every registration run therefore carries the process that owns it
(tags ``specdec.pid``, ``specdec.pid_start``, ``specdec.host``); the next registration calls
:func:`sweep_dead_registration_runs`, which ends RUNNING runs whose process is gone (same host:
pid and start time checked, so a reused pid is never mistaken; another host: after
``STALE_ELSEWHERE_S``).
"""

from __future__ import annotations

import logging
import os
import socket
import time

import psutil

log = logging.getLogger(__name__)
STALE_ELSEWHERE_S = 6 * 3600.0  # a registration on another host that has run this long is dead


def owner_tags() -> dict[str, str]:
    """Tags naming this process as the owner of a run."""
    try:
        start = psutil.Process(os.getpid()).create_time()
    except psutil.Error:
        start = time.time()
    return {"specdec.pid": str(os.getpid()), "specdec.pid_start": f"{start:.3f}", "specdec.host": socket.gethostname()}


def _owner_dead(tags: dict[str, str], started_ms: int | None) -> bool:
    if not tags.get("specdec.pid"):
        return False  # a run from before owner tags: left alone
    if tags.get("specdec.host") != socket.gethostname():
        return bool(started_ms) and time.time() - started_ms / 1000.0 > STALE_ELSEWHERE_S
    try:
        p = psutil.Process(int(tags["specdec.pid"]))
        return abs(p.create_time() - float(tags.get("specdec.pid_start", "0"))) > 1.0
    except (psutil.NoSuchProcess, ValueError):
        return True
    except psutil.Error:
        return False


def sweep_dead_registration_runs(client, experiment_id: str) -> list[str]:
    """Mark FAILED every RUNNING run of ``experiment_id`` whose owner process is dead; returns their ids."""
    done = []
    for run in client.search_runs([experiment_id], "attributes.status = 'RUNNING'", max_results=200):
        if run.info.run_id and _owner_dead(run.data.tags, run.info.start_time):
            client.set_terminated(run.info.run_id, "FAILED")
            log.warning("registration run %s of a dead process (pid %s) marked FAILED", run.info.run_id,
                        run.data.tags.get("specdec.pid"))
            done.append(run.info.run_id)
    return done
