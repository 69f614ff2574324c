"""Errors raised by :mod:`registry`. All derive from :class:`RegistryError`, so callers (the CLI, the
Prefect flows) can catch one type and print a clear message without a traceback."""

from __future__ import annotations


class RegistryError(Exception):
    """Base class: something about the MLflow registry state or the request is wrong."""


class RegistryUnavailable(RegistryError):
    """The MLflow tracking/registry server cannot be reached (connection refused, timeout, 5xx)."""


class ModelNotFound(RegistryError):
    """A registered target/draft model, or one of its versions, does not exist."""


class PairNotFound(RegistryError):
    """The pair registered model, or the requested pair version, does not exist."""


class AliasNotFound(RegistryError):
    """The pair has no such alias (e.g. ``champion`` was never set, or was deleted in the UI)."""


class PromotionRefused(RegistryError):
    """The promotion gate refused to move an alias. ``reasons`` lists every failed criterion."""

    def __init__(self, pair: str, version: str, alias: str, reasons: list[str]):
        self.pair, self.version, self.alias, self.reasons = pair, str(version), alias, list(reasons)
        joined = "; ".join(self.reasons) or "gate failed"
        super().__init__(f"refusing to move {pair}@{alias} to version {version}: {joined}")


class WeightsMismatch(RegistryError):
    """A model version's weight files do not hash to the ``weights_sha256`` recorded at registration
    (corrupted artifact store or local cache). Nothing measured with them may be recorded."""
