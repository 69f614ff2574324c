"""Named points where a crash test stops a real process (``kill -9`` comes from outside).

When the environment variable ``SPECDEC_TEST_PAUSE_AT`` equals a point's name, :func:`pause_at`
writes ``<home>/paused-<step>`` (this pid) and sleeps until killed; otherwise it does nothing. The
nightly passes ``validation``, ``history`` and ``mlflow`` (the MLflow run exists, still RUNNING);
``tests/flows/test_nightly_crash_recovery.py`` kills it there and checks what the next run recovers.
It lives in ``specdec`` so that ``registry`` (which creates the MLflow run) and ``flows`` reach the
same points without handing callbacks to each other.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

PAUSE_ENV = "SPECDEC_TEST_PAUSE_AT"


def pause_at(step: str, home: Path | str | None = None) -> None:
    """Sleep forever at ``step`` when ``SPECDEC_TEST_PAUSE_AT`` names it (see module docstring).

    ``home``: where the marker file goes (default ``SPECDEC_HOME``).
    """
    if os.environ.get(PAUSE_ENV) != step:
        return
    from specdec.settings import home_dir

    home = Path(home) if home else home_dir()
    home.mkdir(parents=True, exist_ok=True)
    (home / f"paused-{step}").write_text(str(os.getpid()))
    while True:  # pragma: no cover (ended by the test's kill -9)
        time.sleep(3600)
