"""The one PostgreSQL starter of the test suite: a throwaway cluster on 127.0.0.1.

Skips the calling test (``pytest.skip``) only where no PostgreSQL server binaries exist
(``initdb``/``pg_ctl`` on PATH or under ``/usr/lib/postgresql/*/bin``), or where it runs as root
without a ``postgres`` user; as root the cluster runs as ``postgres``.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.net import free_port


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    cands = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return cands[-1] if cands else None


def _as_pg(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@contextlib.contextmanager
def postgres_cluster(user: str, prefix: str = "specdec-pg-") -> Iterator[tuple[int, Path]]:
    """Start a cluster (``trust`` auth, superuser ``user``, fsync off); yield ``(port, root dir)``.

    The cluster is stopped (immediate) and its directory removed on exit.
    """
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not initdb or not pg_ctl:
        pytest.skip("PostgreSQL server binaries not installed")
    if os.geteuid() == 0 and subprocess.run(["id", "postgres"], capture_output=True).returncode:
        pytest.skip("running as root without a 'postgres' user")
    root = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(root, 0o777)
    data, port = root / "pgdata", free_port()
    subprocess.run(_as_pg([initdb, "-D", str(data), "-A", "trust", "-U", user, "--no-sync"]),
                   check=True, capture_output=True, timeout=120)
    start_cluster(root, port)
    try:
        yield port, root
    finally:
        subprocess.run(_as_pg([pg_ctl, "-D", str(data), "-m", "immediate", "stop"]), capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)


def stop_cluster(root: Path) -> None:
    """Stop the cluster under ``root`` at once (``-m immediate``: a database outage, connections cut)."""
    subprocess.run(_as_pg([_pg_bin("pg_ctl"), "-D", str(root / "pgdata"), "-m", "immediate", "-w", "stop"]),
                   check=True, capture_output=True, timeout=60)


def start_cluster(root: Path, port: int) -> None:
    """Start the cluster under ``root`` again on ``port`` (after :func:`stop_cluster`)."""
    subprocess.run(_as_pg([_pg_bin("pg_ctl"), "-D", str(root / "pgdata"), "-w", "-t", "60", "-l",
                           str(root / "pg.log"), "-o",
                           f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off", "start"]),
                   check=True, capture_output=True, timeout=120)
