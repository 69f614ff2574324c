"""Monitoring's section of the settings tree (:mod:`specdec.settings.monitoring`).

The classes live with the rest of the tree in :mod:`specdec.settings` (the one root every package can
import); monitoring code imports them from here and gets its section from :func:`get_settings`.
Environment names: ``SPECDEC_DB_URL``, ``SPECDEC_REPORTS_DIR``, ``SPECDEC_ALERT_CHANNELS``,
``SPECDEC_RULES__*``, ``SPECDEC_DELIVERY__*``, ``SPECDEC_REMINDER_INTERVAL_HOURS``,
``SPECDEC_CLAIM_STALE_AFTER_S`` (see that module).
"""

from __future__ import annotations

from specdec.settings.monitoring import (
    ChannelConfig, DeliverySettings, MonitoringSettings, RuleSettings, url_problem,
)

__all__ = ["ChannelConfig", "DeliverySettings", "MonitoringSettings", "RuleSettings", "url_problem", "get_settings"]


def get_settings(**overrides) -> MonitoringSettings:
    """The monitoring section read afresh from the environment; keyword ``overrides`` win over env values."""
    return MonitoringSettings(**overrides)
