"""``python -m tests.support.held_nightly <specdec args>``: the real ``specdec`` CLI with its pause
points (:func:`specdec.pause_points.pause_at`) replaced by test controls, for fault tests that must act
on a live nightly at an exact step. Test code only: the product's pause points are untouched.

- ``SPECDEC_TEST_HOLD_AT=<step>``: at the first ``pause_at(<step>)`` write ``<home>/held-<step>`` and
  wait until ``<home>/resume-<step>`` exists, then go on (a test stops Postgres in between).
- ``SPECDEC_TEST_FINALIZER_AT=<step>``: at the first ``pause_at(<step>)`` run a finalizer
  (``__del__``) that writes ``<home>/in-finalizer-<step>`` and sleeps up to 60 s: a SIGTERM that lands
  there is raised inside a finalizer, where Python prints "Exception ignored" and carries on (the
  swallowed SIGTERM of issue 32, item 4).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import specdec.pause_points as pause_points

_done: set[str] = set()


def _home() -> Path:
    return Path(os.environ["SPECDEC_HOME"])


class _SleepInFinalizer:
    def __init__(self, step: str) -> None:
        self.step = step

    def __del__(self) -> None:
        (_home() / f"in-finalizer-{self.step}").write_text(str(os.getpid()))
        end = time.monotonic() + 60
        while time.monotonic() < end:
            time.sleep(0.1)


def _pause_at(step: str, home=None) -> None:
    if step in _done:
        return
    if os.environ.get("SPECDEC_TEST_HOLD_AT") == step:
        _done.add(step)
        (_home() / f"held-{step}").write_text(str(os.getpid()))
        while not (_home() / f"resume-{step}").exists():
            time.sleep(0.1)
    if os.environ.get("SPECDEC_TEST_FINALIZER_AT") == step:
        _done.add(step)
        obj = _SleepInFinalizer(step)
        del obj  # refcount zero: __del__ runs here, in the main thread


pause_points.pause_at = _pause_at

if __name__ == "__main__":
    sys.argv[0] = "specdec"
    from specdec.cli import main

    main()
