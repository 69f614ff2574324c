"""A temporary Prefect API server for ``specdec nightly run`` that dies with the process.

Prefect's own ephemeral server is a child process that outlives a ``kill -9`` of its parent
(~250 MB left running). This starts the same server (uvicorn + ``prefect.server.api.server:
create_app``, UI off, state under ``PREFECT_HOME``) with ``PR_SET_PDEATHSIG = SIGKILL`` on Linux, so
the kernel stops it when the nightly process dies, however it dies. The pid is recorded in the
nightly lease as well, so on other systems the next run stops a leftover server
(:func:`flows.recovery.reap_dead_leases`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from specdec import processes

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:  # noqa: BLE001 (not Linux: the lease-based reaping covers it)
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _setup_lock(timeout_s: float, prefect_home: Path | None):
    """An acquired :class:`filelock.FileLock` in the Prefect home (``PREFECT_HOME``, default
    ``~/.prefect``), held while a server starts, so concurrent first starts do not both create
    Prefect's SQLite database (one crashed in Prefect's own migrations)."""
    from filelock import FileLock

    home = Path(prefect_home or Path.home() / ".prefect").expanduser()
    home.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(home / ".specdec-server-setup.lock"))
    lock.acquire(timeout=timeout_s)
    return lock


class PrefectAPI:
    """``with PrefectAPI(home) as api:`` sets ``PREFECT_API_URL`` to a private server for the block.

    Args:
        log_path: the server's stdout/stderr (kept off the terminal).
        startup_timeout_s: seconds to wait for ``/api/health``.
        prefect_home: Prefect's home (``PREFECT_HOME`` as the caller's settings read it; None: ``~/.prefect``).
    Raises:
        RuntimeError: the server did not come up in time (its log path is in the message).
    """

    def __init__(self, log_path: Path, startup_timeout_s: float = 180.0, *, prefect_home: Path | None = None) -> None:
        self.log_path = Path(log_path)
        self.prefect_home = prefect_home
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen | None = None
        self.url: str | None = None
        self._old_url: str | None = None

    def start(self) -> "PrefectAPI":
        import importlib.util

        # prefect is not imported here: its settings must see PREFECT_API_URL when it first loads
        prefect_dir = Path(importlib.util.find_spec("prefect").origin).parent
        port = _free_port()
        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
               "PREFECT__SERVER_FINAL": "1"}
        env.pop("PREFECT_API_URL", None)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        setup = _setup_lock(self.startup_timeout_s, self.prefect_home)  # two first servers on one empty Prefect home race in its DB setup
        try:
            self._spawn(prefect_dir, port, env)
        finally:
            setup.release()
        self._old_url = os.environ.get("PREFECT_API_URL")
        os.environ["PREFECT_API_URL"] = self.url
        return self

    def _spawn(self, prefect_dir: Path, port: int, env: dict) -> None:
        """Start the server process and wait for ``/health`` (its database is migrated by then)."""
        logf = open(self.log_path, "ab")
        self.proc = processes.spawn(
            [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect_dir.parent),
             "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port),
             "--log-level", "error", "--lifespan", "on"],
            env=env, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        logf.close()
        self.url = f"http://127.0.0.1:{port}/api"
        deadline = time.monotonic() + self.startup_timeout_s
        with httpx.Client(timeout=5) as c:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the Prefect API server exited with code {self.proc.returncode} "
                                       f"(log: {self.log_path})")
                try:
                    if c.get(f"{self.url}/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"the Prefect API server did not start in {self.startup_timeout_s:.0f} s "
                                       f"(log: {self.log_path})")
                time.sleep(0.2)

    def stop(self) -> None:
        processes.stop(self.proc, grace_s=10)  # the server's process group: SIGTERM, SIGKILL after 10 s, reaped
        self.proc = None
        if self.url and os.environ.get("PREFECT_API_URL") == self.url:
            if self._old_url is None:
                os.environ.pop("PREFECT_API_URL", None)
            else:
                os.environ["PREFECT_API_URL"] = self._old_url

    def __enter__(self) -> "PrefectAPI":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
