"""Storage faults at the command line: one clear line and exit 1, no traceback, no log flood.

A full disk, a read-only or unwritable ``SPECDEC_HOME`` or a file-size limit surfaces deep inside
SQLite, Prefect's API server, MLflow or the log handler, usually wrapped in another exception.
:func:`storage_fault` recognises one from the exception chain (``OSError`` with ENOSPC, EDQUOT,
EROFS, EACCES, EPERM or EFBIG, SQLite's "database or disk is full" / "readonly database" / "disk
I/O error") or, failing that, from the state of the home directory itself (not writable, or less
than :data:`LOW_SPACE_BYTES` free); :func:`run_cli` turns it into one line.
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
from pathlib import Path
from typing import Callable

LOW_SPACE_BYTES = 1 << 20  # below 1 MiB free, an unexplained failure is blamed on the full disk
_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
           errno.EROFS: "read-only file system", errno.EACCES: "permission denied", errno.EPERM: "not permitted",
           errno.EFBIG: "file too large (file-size limit)"}
_SQLITE = {"database or disk is full": "no space left on device", "readonly database": "read-only database",
           "disk i/o error": "disk I/O error", "unable to open database file": "cannot open the database file"}


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _home_state(home: Path) -> str | None:
    """Why ``home`` (or its nearest existing parent) cannot take writes, or None."""
    p = home
    while not p.exists() and p != p.parent:
        p = p.parent
    if not os.access(p, os.W_OK):
        return "not writable"
    try:
        if shutil.disk_usage(p).free < LOW_SPACE_BYTES:
            return "no space left on device"
    except OSError:
        return None
    return None


def storage_fault(exc: BaseException, home: Path | None) -> str | None:
    """A one-line description of the storage fault behind ``exc``, or None when it is not one."""
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno in _ERRNOS:
            where = f" at {e.filename}" if getattr(e, "filename", None) else ""
            return f"{_ERRNOS[e.errno]}{where}"
        low = str(e).lower()
        for needle, what in _SQLITE.items():
            if needle in low and type(e).__module__.startswith(("sqlite3", "sqlalchemy")):
                return f"{what} (SQLite)"
    if home is not None:
        state = _home_state(home)
        if state:
            return f"SPECDEC_HOME {home}: {state}"
    return None


def run_cli(app: Callable[[], object], home: Callable[[], Path]) -> None:
    """Run the typer ``app``; a storage fault becomes ``error: <what> (<exception type>)`` and exit 1."""
    import logging

    logging.raiseExceptions = False  # a handler that cannot write must not print a traceback per record
    try:
        app()
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as e:  # noqa: BLE001 (classified below; anything else is re-raised as it was)
        if type(e).__name__ == "ValidationError":  # settings read outside a command's own handler: one line
            from specdec.settings.home import settings_error_line

            print(f"error: invalid settings: {settings_error_line(e)}", file=sys.stderr)
            sys.exit(1)
        try:
            h = home()
        except Exception:  # noqa: BLE001
            h = None
        what = storage_fault(e, h)
        if what is None:
            raise
        print(f"error: {what} ({type(e).__name__}); free space or fix permissions, then re-run", file=sys.stderr)
        sys.exit(1)
