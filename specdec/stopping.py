"""SIGTERM and Ctrl-C (SIGINT) stop a long command promptly, every time, with one line and exit
``128 + signal`` (143 for SIGTERM, 130 for SIGINT, what a shell reports for a process ended by it).

Orchestrators stop jobs with SIGTERM (Kubernetes, Prefect workers, systemd); a person presses Ctrl-C.
Both take the same path; they differ only in how soon:

- SIGTERM, or a second SIGINT: stop now (the handler raises :class:`Terminated` in the main thread);
- a first SIGINT: finish the current prompt, then stop (the request is remembered; :func:`check`, at the
  next progress point, raises :class:`Terminated`).

Prefect's flow engine turns SIGTERM into a ``TerminationSignal`` raised wherever the main thread is;
raised inside a finalizer (``__del__``, a weakref callback) Python prints "Exception ignored" and
carries on, and raised after the flow body returned the engine drops it. So a request is also
*remembered* here:

- :func:`install` (a command, main thread) makes SIGTERM and SIGINT take the path above;
- :func:`guard` (first thing in a flow body, after Prefect installed its own handlers) wraps them so
  the request is remembered before Prefect raises;
- :func:`check` (at every progress point of a validation, between jobs, after the flow) raises
  :class:`Terminated` once a stop was requested, so a swallowed signal stops the run at the next prompt;
- a watchdog thread ends the process with ``os._exit(128 + signal)`` whatever the main thread does:
  ``grace_s`` (15 s) after SIGTERM or a second Ctrl-C, :data:`SOFT_GRACE_S` after a first Ctrl-C (the
  prompt being decoded may be slow on a loaded machine);
- :func:`stoppable` (around a command's body) turns :class:`Terminated` into one line and the exit code.

What the run held stays recoverable: the nightly's history claims stay named in the process's lease
file (``flows.recovery.NightlyLease``), so the next run sees a dead holder and takes them over at once.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

EXIT_CODE = 128 + signal.SIGTERM  # 143, what a shell reports for a process ended by SIGTERM
DEFAULT_GRACE_S = 15.0
SOFT_GRACE_S = 120.0  # after a first Ctrl-C: the prompt being decoded may take this long on a loaded machine
SIGNALS = (signal.SIGTERM, signal.SIGINT)

log = logging.getLogger(__name__)
_requested = threading.Event()
_hard = threading.Event()  # a stop-now request (SIGTERM, a second Ctrl-C) was received
_first: list[int] = []  # the signal that asked first (its number decides the exit code)
_grace_s = DEFAULT_GRACE_S
_installed = False


class Terminated(BaseException):
    """A stop was requested (SIGTERM or Ctrl-C): the run stops (a ``BaseException``, so ``except
    Exception`` lets it pass)."""

    def __init__(self) -> None:
        super().__init__(f"stopped by {signal_name()}")


def requested() -> bool:
    """True once this process received SIGTERM or SIGINT (while :func:`install` was in force)."""
    return _requested.is_set()


def signal_name() -> str:
    """``SIGTERM`` or ``SIGINT``: the signal that asked first (``SIGTERM`` when none did)."""
    return signal.Signals(_first[0] if _first else signal.SIGTERM).name


def exit_code() -> int:
    """``128 + signal`` of the first stop request: 143 (SIGTERM), 130 (SIGINT)."""
    return 128 + (_first[0] if _first else signal.SIGTERM)


def _watchdog(grace_s: float) -> None:
    time.sleep(grace_s)
    code = exit_code()
    log.error("still running %.0f s after %s: exiting now (exit %d)", grace_s, signal_name(), code)
    for h in logging.getLogger().handlers:
        try:
            h.flush()
        except Exception:  # noqa: BLE001 (exiting anyway)
            pass
    os._exit(code)


def _note(signum: int) -> bool:
    """Remember a request; True when this one stops now (SIGTERM, or a SIGINT after an earlier request)."""
    now = signum != signal.SIGINT or _requested.is_set()
    if _requested.is_set() and (_hard.is_set() or not now):
        return now
    if not _first:
        _first.append(signum)
    _requested.set()
    if now:
        _hard.set()
        log.warning("received %s: stopping now", signal.Signals(signum).name)
    else:
        log.warning("received SIGINT: finishing the current prompt, then stopping (Ctrl-C again stops now)")
    grace = _grace_s if now else max(_grace_s, SOFT_GRACE_S)  # a first Ctrl-C lets a slow prompt end
    threading.Thread(target=_watchdog, args=(grace,), name="specdec-stop-watchdog", daemon=True).start()
    return now


def _handler(signum, frame) -> None:
    if _note(signum):
        raise Terminated()


def install(grace_s: float = DEFAULT_GRACE_S) -> None:
    """Make SIGTERM and SIGINT take the stop path in this (main) thread; ``grace_s``: the watchdog's delay."""
    global _grace_s, _installed
    _grace_s, _installed = float(grace_s), True
    for s in SIGNALS:
        signal.signal(s, _handler)
    if getattr(sys.unraisablehook, "_specdec_stop", False):
        return
    default_hook = sys.unraisablehook

    def unraisable(u) -> None:  # a stop raised inside a finalizer: remembered, no traceback on the terminal
        if _requested.is_set() and type(u.exc_value).__name__ in ("Terminated", "TerminationSignal", "KeyboardInterrupt"):
            log.debug("%s landed in %r (remembered; the run stops at its next check)", signal_name(), u.object)
            return
        default_hook(u)

    unraisable._specdec_stop = True  # type: ignore[attr-defined]
    sys.unraisablehook = unraisable


def guard() -> None:
    """Wrap the SIGTERM/SIGINT handlers installed now (Prefect's, inside a flow run) so the request is
    remembered before they run. Does nothing outside the main thread or where :func:`install` was
    never called (a flow run by a Prefect worker keeps Prefect's own handling)."""
    if not _installed or threading.current_thread() is not threading.main_thread():
        return
    for s in SIGNALS:
        prev = signal.getsignal(s)
        if prev is _handler or getattr(prev, "_specdec_guard", False):
            continue
        signal.signal(s, _guarded(prev))


def _guarded(prev):
    def guarded(signum, frame) -> None:
        if not _note(signum):
            return  # a first Ctrl-C: the run stops at its next check
        if callable(prev) and prev not in (signal.default_int_handler,):
            prev(signum, frame)
        raise Terminated()

    guarded._specdec_guard = True  # type: ignore[attr-defined]
    return guarded


def check() -> None:
    """Raise :class:`Terminated` when a stop was requested (a first Ctrl-C, or a swallowed SIGTERM,
    stops the run here)."""
    if _requested.is_set():
        raise Terminated()


@contextmanager
def stoppable(say: Callable[[str], None], *, kept: str, grace_s: float = DEFAULT_GRACE_S) -> Iterator[None]:
    """Run a command's body with :func:`install` in force; a stop (:class:`Terminated`, or Prefect's
    ``TerminationSignal``/a ``KeyboardInterrupt`` once a stop was requested) becomes one line through
    ``say`` -- ``stopped: SIGINT received; <kept> (exit 130)`` -- and ``SystemExit(128 + signal)``.
    ``kept``: what the user finds afterwards (e.g. "the finished prompts are in the log")."""
    install(grace_s)
    try:
        yield
    except BaseException as e:
        if isinstance(e, SystemExit) or not (requested() or isinstance(e, KeyboardInterrupt)):
            raise
        if not requested():  # a KeyboardInterrupt from a handler someone else installed
            _first.append(signal.SIGINT)
        say(f"stopped: {signal_name()} received; {kept} (exit {exit_code()})")
        raise SystemExit(exit_code()) from None
