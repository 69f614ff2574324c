"""The decoding library's settings: ``SPECDEC_HOME``, the core section and the acceptance policy
(pydantic-settings).

``core`` (:class:`CoreSettings`: ``SPECDEC_MODELS_DIR``, ``SPECDEC_ENGINES_DIR``, ``SPECDEC_DEVICE``,
``SPECDEC_DTYPE``, ...) is :mod:`specdec`'s own; ``policy`` (:class:`PolicySettings`, ``SPECDEC_POLICY__*``)
is read by the monitoring rules and the registry's gate alike, so it lives in the innermost package both
import. ``SPECDEC_HOME`` is resolved in one place, :mod:`specdec.settings.home`. The other sections live
with the packages that use them (:mod:`registry.settings`, :mod:`monitoring.settings`,
:mod:`monitoring.production.settings`, :mod:`flows.settings`), and the whole tree is composed where the
packages meet, :func:`flows.settings.load_settings`. Nothing here imports MLflow, SQLAlchemy or Prefect.
Older names (:data:`specdec.settings.aliases.OLD_NAMES`) still work, with one warning.
"""

from __future__ import annotations

from specdec.settings.core import CoreSettings
from specdec.settings.home import home_dir
from specdec.settings.policy import PolicySettings, get_policy

__all__ = ["get_settings", "get_policy", "model_store", "home_dir", "CoreSettings", "PolicySettings"]


def get_settings() -> CoreSettings:
    """The core section, read afresh from the environment (cheap; tests may change the environment)."""
    return CoreSettings()


def model_store():
    """The model caches of ``SPECDEC_MODELS_DIR`` (:class:`specdec.settings.store.ModelStore` of
    ``CoreSettings.models_dir``), read from the environment now: for an entry point (a command, a benchmark
    script), which hands it down. Raises ``ValueError`` (pydantic's) on a malformed setting."""
    from specdec.settings.store import ModelStore

    return ModelStore(get_settings().models_dir)
