"""Production ingestion's section of the settings tree (:mod:`specdec.settings.production`,
``SPECDEC_PRODUCTION_*``); the classes live with the rest of the tree in :mod:`specdec.settings`."""

from __future__ import annotations

from specdec.settings.production import (
    ProductionMapping, ProductionSettings, ProductionSource, find_mapping,
)

__all__ = ["ProductionMapping", "ProductionSettings", "ProductionSource", "find_mapping", "get_production_settings"]


def get_production_settings(**overrides) -> ProductionSettings:
    """The production section read from the environment; keyword ``overrides`` win."""
    return ProductionSettings(**overrides)
