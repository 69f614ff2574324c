"""Where the tests keep what is slow to rebuild and safe to reuse (a tiny trained EAGLE-3 head, the
speculators venv): ``$SPECDEC_TEST_CACHE`` (``.ci/run`` points it outside the fresh clone), else the
repository's ``.specdec/``. Writers take a file lock next to their entry (pytest-xdist workers share it)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_cache_dir() -> Path:
    """The cache folder (created)."""
    path = Path(os.environ.get("SPECDEC_TEST_CACHE") or REPO / ".specdec").resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path
