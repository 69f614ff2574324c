"""SIGTERM stops ``specdec nightly run`` promptly, every time, with exit 143.

Orchestrators stop jobs with SIGTERM (Kubernetes, Prefect workers, systemd). Prefect's flow engine
turns it into a ``TerminationSignal`` raised wherever the main thread is; raised inside a finalizer
(``__del__``, a weakref callback) Python prints "Exception ignored" and carries on, and raised after the
flow body returned the engine drops it. So a SIGTERM is also *remembered* here:

- :func:`install` (the CLI, main thread) makes SIGTERM raise :class:`Terminated`;
- :func:`guard` (first thing in the flow body, after Prefect installed its own handler) wraps that
  handler so the request is remembered before Prefect raises;
- :func:`check` (at every progress point of a validation, between jobs, after the flow) raises
  :class:`Terminated` again once a SIGTERM was received, so a swallowed one stops the run at the
  next prompt;
- a watchdog thread, started by the first SIGTERM, ends the process with ``os._exit(143)`` after
  ``grace_s`` seconds whatever the main thread does.

What the run held stays recoverable: the history claims stay named in the process's lease file
(:class:`flows.recovery.NightlyLease`), so the next run sees a dead holder and takes them over at once.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

EXIT_CODE = 128 + signal.SIGTERM  # 143, what a shell reports for a process ended by SIGTERM
DEFAULT_GRACE_S = 15.0

log = logging.getLogger(__name__)
_requested = threading.Event()
_grace_s = DEFAULT_GRACE_S
_installed = False


class Terminated(BaseException):
    """SIGTERM was received: the run stops (a ``BaseException``, so ``except Exception`` lets it pass)."""

    def __init__(self) -> None:
        super().__init__("stopped by SIGTERM")


def requested() -> bool:
    """True once this process received SIGTERM."""
    return _requested.is_set()


def _watchdog() -> None:
    time.sleep(_grace_s)
    log.error("still running %.0f s after SIGTERM: exiting now (exit %d); held history claims are "
              "taken over by the next run", _grace_s, EXIT_CODE)
    for h in logging.getLogger().handlers:
        try:
            h.flush()
        except Exception:  # noqa: BLE001 (exiting anyway)
            pass
    os._exit(EXIT_CODE)


def _note(signum: int) -> None:
    if _requested.is_set():
        return
    _requested.set()
    log.warning("received %s: stopping the nightly run", signal.Signals(signum).name)
    threading.Thread(target=_watchdog, name="specdec-sigterm-watchdog", daemon=True).start()


def _handler(signum, frame) -> None:
    _note(signum)
    raise Terminated()


def install(grace_s: float = DEFAULT_GRACE_S) -> None:
    """Make SIGTERM raise :class:`Terminated` in this (main) thread; ``grace_s``: the watchdog's delay."""
    global _grace_s, _installed
    _grace_s, _installed = float(grace_s), True
    signal.signal(signal.SIGTERM, _handler)
    default_hook = sys.unraisablehook

    def unraisable(u) -> None:  # a SIGTERM raised inside a finalizer: remembered, no traceback on the terminal
        if _requested.is_set() and type(u.exc_value).__name__ in ("Terminated", "TerminationSignal"):
            log.debug("SIGTERM landed in %r (remembered; the run stops at its next check)", u.object)
            return
        default_hook(u)

    sys.unraisablehook = unraisable


def guard() -> None:
    """Wrap the SIGTERM handler installed now (Prefect's, inside a flow run) so the request is
    remembered before it runs. Does nothing outside the main thread or where :func:`install` was
    never called (a flow run by a Prefect worker keeps Prefect's own handling)."""
    if not _installed or threading.current_thread() is not threading.main_thread():
        return
    prev = signal.getsignal(signal.SIGTERM)
    if prev is _handler or getattr(prev, "_specdec_guard", False):
        return

    def guarded(signum, frame) -> None:
        _note(signum)
        if callable(prev):
            prev(signum, frame)
        raise Terminated()

    guarded._specdec_guard = True  # type: ignore[attr-defined]
    signal.signal(signal.SIGTERM, guarded)


def check() -> None:
    """Raise :class:`Terminated` when a SIGTERM was received (a swallowed one stops the run here)."""
    if _requested.is_set():
        raise Terminated()
