"""Older environment variable names that still work, and the one warning each gets per process."""

from __future__ import annotations

import os
import warnings

# old name -> the documented name that replaced it (the settings read both; the new one wins): the drift rules'
# copies of the acceptance policy's values, which the policy section now holds alone
OLD_NAMES = {"SPECDEC_RULES__ABSOLUTE_THRESHOLD": "SPECDEC_POLICY__THRESHOLD",
             "SPECDEC_RULES__MIN_DRAFT_TOKENS": "SPECDEC_POLICY__MIN_DRAFT_TOKENS",
             "SPECDEC_RULES__ALERT_SIDE": "SPECDEC_POLICY__ALERT_SIDE",
             "SPECDEC_RULES__ESTIMATOR": "SPECDEC_POLICY__ESTIMATOR"}


def names_of(new: str) -> tuple[str, ...]:
    """``new`` and its older names, newest first (a field's ``AliasChoices``)."""
    return (new, *(old for old, n in OLD_NAMES.items() if n == new))
_warned: set[str] = set()


def warn_old_names() -> None:
    """Warn (``FutureWarning``, once per process and name) about each old name set in the environment."""
    for old, new in OLD_NAMES.items():
        if os.environ.get(old) and old not in _warned:
            _warned.add(old)
            warnings.warn(f"{old} is an older name for {new}; set {new} instead", FutureWarning, stacklevel=3)
