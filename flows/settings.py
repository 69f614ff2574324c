"""The nightly deployment's section of the settings tree (:mod:`specdec.settings.nightly`, ``SPECDEC_NIGHTLY_*``)."""

from __future__ import annotations

from specdec.settings.nightly import NightlySettings

__all__ = ["NightlySettings", "get_settings"]


def get_settings() -> NightlySettings:
    """The nightly section, read afresh from the environment."""
    return NightlySettings()
