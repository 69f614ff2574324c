"""Older environment variable names that still work, and the one warning each gets per process."""

from __future__ import annotations

import os
import warnings

# old name -> the documented name that replaced it (the settings read both; the new one wins)
OLD_NAMES = {"SPECDEC_RULES__ABSOLUTE_THRESHOLD": "SPECDEC_POLICY__THRESHOLD"}
_warned: set[str] = set()


def warn_old_names() -> None:
    """Warn (``FutureWarning``, once per process and name) about each old name set in the environment."""
    for old, new in OLD_NAMES.items():
        if os.environ.get(old) and old not in _warned:
            _warned.add(old)
            warnings.warn(f"{old} is an older name for {new}; set {new} instead", FutureWarning, stacklevel=3)
