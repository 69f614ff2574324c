"""The one settings tree of specdec, registry, monitoring and flows (pydantic-settings).

:func:`load_settings` reads the environment (and a ``.env`` file) once and returns :class:`Settings`,
whose sections each package receives: ``core`` (:mod:`specdec`), ``policy`` (the acceptance policy,
read by rules, gate, plots and reports), ``registry`` (MLflow), ``monitoring`` (history store, drift
rules, alert channels and delivery), ``production`` (production-acceptance ingestion) and ``nightly``
(the nightly deployment). ``SPECDEC_HOME`` is resolved in one place, :mod:`specdec.settings.home`;
sections that keep files derive their default paths from it.

Why here: ``flows -> registry, monitoring -> specdec``. Every package may import ``specdec`` and
``specdec`` imports none of the others, so the whole tree lives in the innermost package and the
outer packages hand their code its section (``registry.settings.get_settings()`` is
``RegistrySettings()``, and so on). The sections are plain pydantic models: nothing here imports
MLflow, SQLAlchemy or Prefect.

Environment variable names are the documented ones, per section: ``SPECDEC_HOME``,
``SPECDEC_MODELS_DIR``, ``SPECDEC_DEVICE``, ``SPECDEC_DTYPE`` (core); ``SPECDEC_POLICY__*`` (policy);
``SPECDEC_TRACKING_URI`` / ``MLFLOW_TRACKING_URI``, ``SPECDEC_ARTIFACTS_DIR``, ``SPECDEC_PAIR_NAME``, ...
(registry); ``SPECDEC_DB_URL``, ``SPECDEC_ALERT_CHANNELS``, ``SPECDEC_RULES__*``, ``SPECDEC_DELIVERY__*``, ...
(monitoring); ``SPECDEC_PRODUCTION_*`` (production); ``SPECDEC_NIGHTLY_*`` (nightly). Older names
(:data:`specdec.settings.aliases.OLD_NAMES`) still work, with one warning.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from specdec.settings.core import CoreSettings
from specdec.settings.home import home_dir
from specdec.settings.monitoring import MonitoringSettings
from specdec.settings.nightly import NightlySettings
from specdec.settings.policy import PolicySettings, get_policy
from specdec.settings.production import ProductionSettings
from specdec.settings.registry import RegistrySettings

__all__ = ["Settings", "load_settings", "get_settings", "get_policy", "home_dir", "CoreSettings", "PolicySettings",
           "RegistrySettings", "MonitoringSettings", "ProductionSettings", "NightlySettings"]


class Settings(BaseModel):
    """The whole tree, read once by :func:`load_settings`.

    Attributes:
        home: absolute data directory (``SPECDEC_HOME``).
        core / policy / registry / monitoring / production / nightly: the sections (see module docstring).
    """

    model_config = ConfigDict(frozen=True)

    home: Path
    core: CoreSettings
    policy: PolicySettings
    registry: RegistrySettings
    monitoring: MonitoringSettings
    production: ProductionSettings
    nightly: NightlySettings


def load_settings() -> Settings:
    """Read every section from the environment once; ``SPECDEC_HOME`` is read once and handed to the
    sections that keep files under it.

    Raises:
        pydantic.ValidationError: a malformed value (the error names the field; secrets are not echoed).
    """
    home = home_dir()
    return Settings(home=home, core=CoreSettings(home=home), policy=PolicySettings(),
                    registry=RegistrySettings(home=home), monitoring=MonitoringSettings(home=home),
                    production=ProductionSettings(), nightly=NightlySettings())


def get_settings() -> CoreSettings:
    """The core section, read afresh from the environment (cheap; tests may change the environment)."""
    return CoreSettings()
