"""``python -m tests.support.held_nightly <specdec args>``: the real ``specdec`` CLI with one test-only
subscriber to its step events (:mod:`specdec.events`), for fault tests that must act on a live nightly
at an exact step. Test code only: the product announces its steps and never names this module.

The test's environment says what the subscriber does (nothing when none is set):

- ``SPECDEC_TEST_PAUSE_AT=<step>``: at ``<step>`` write ``<home>/paused-<step>`` (this pid) and sleep
  until killed (the crash tests send ``kill -9`` from outside).
- ``SPECDEC_TEST_HOLD_AT=<step>``: at the first ``<step>`` write ``<home>/held-<step>`` and wait until
  ``<home>/resume-<step>`` exists, then go on (a test stops Postgres in between).
- ``SPECDEC_TEST_FINALIZER_AT=<step>``: at the first ``<step>`` run a finalizer (``__del__``) that
  writes ``<home>/in-finalizer-<step>`` and sleeps up to 60 s: a SIGTERM that lands there is raised
  inside a finalizer, where Python prints "Exception ignored" and carries on (the swallowed SIGTERM
  of issue 32, item 4).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from specdec import events

_done: set[str] = set()


def _home() -> Path:
    home = Path(os.environ["SPECDEC_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    return home


class _SleepInFinalizer:
    def __init__(self, step: str) -> None:
        self.step = step

    def __del__(self) -> None:
        (_home() / f"in-finalizer-{self.step}").write_text(str(os.getpid()))
        end = time.monotonic() + 60
        while time.monotonic() < end:
            time.sleep(0.1)


def on_step(event: events.StepEvent) -> None:
    """The subscriber: pause, hold or run a finalizer at the step the environment names."""
    step = event.name
    if os.environ.get("SPECDEC_TEST_PAUSE_AT") == step:
        (_home() / f"paused-{step}").write_text(str(os.getpid()))
        while True:  # ended by the test's kill -9
            time.sleep(3600)
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


if __name__ == "__main__":
    events.subscribe(on_step)
    sys.argv[0] = "specdec"
    from specdec.cli import main

    main()
