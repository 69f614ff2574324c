"""The registry's section of the settings tree: where the MLflow store lives and how long to wait for a server.

Environment (all optional):

- ``SPECDEC_TRACKING_URI``, else ``MLFLOW_TRACKING_URI``: the MLflow tracking and registry URI.
  Default ``sqlite:///<home>/mlflow.db`` (an embedded store, no server needed).
- ``SPECDEC_ARTIFACTS_DIR``: artifact root for experiments created on a local (SQLite) store
  (default: ``mlartifacts/`` next to the SQLite file, i.e. ``<home>/mlartifacts`` for the default
  store). With an ``http(s)://`` server, the server decides.
- ``SPECDEC_CACHE_DIR``: where downloaded model versions go (``<home>/registry-cache``).
- ``SPECDEC_PAIR_NAME``: default pair registered model (``specdec-pair``).
- ``SPECDEC_ALIASES``: the allowed aliases (JSON list, default ``["champion", "challenger"]``).
- ``SPECDEC_HTTP_TIMEOUT`` / ``SPECDEC_HTTP_MAX_RETRIES``: defaults for MLflow's
  ``MLFLOW_HTTP_REQUEST_TIMEOUT`` (seconds) / ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` when those are unset,
  so an unreachable server fails in seconds instead of minutes.

The section lives here, with the package that uses it; the whole tree is composed where the packages
meet (:func:`flows.settings.load_settings`). The MLflow client is built by the registry service
(:class:`registry.service.Registry`) from this section.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import SettingsConfigDict

from specdec.settings.home import HomeSection

REGISTRY_EXPERIMENT = "specdec-registry"
VALIDATION_EXPERIMENT = "specdec-validation"


class RegistrySettings(HomeSection):
    """Where the registry lives.

    Attributes:
        home: absolute data directory.
        tracking_uri: MLflow tracking + registry URI (``sqlite:///...``, ``http://host:port``, ...).
        artifacts_dir: absolute artifact root used for experiments created on a local store (None:
            next to a SQLite file, else ``<home>/mlartifacts``).
        cache_dir: where :func:`registry.pairs.get_pair_version` downloads model artifacts.
        pair_name: default pair registered model name.
        aliases: the aliases specdec moves and validates (``SPECDEC_ALIASES='["champion", "challenger",
            "canary"]'``); anything else is refused as a typo.
        http_timeout: seconds per HTTP request to an MLflow server.
        http_max_retries: retries per HTTP request to an MLflow server.
    """

    model_config = SettingsConfigDict(populate_by_name=True, hide_input_in_errors=True)  # a URI may hold a password

    tracking_uri: str | None = Field(
        default=None, validation_alias=AliasChoices("SPECDEC_TRACKING_URI", "MLFLOW_TRACKING_URI")
    )
    artifacts_dir: Path | None = None
    cache_dir: Path | None = None
    pair_name: str = "specdec-pair"
    aliases: list[str] = Field(default_factory=lambda: ["champion", "challenger"])
    http_timeout: int = 10
    http_max_retries: int = 2

    @model_validator(mode="after")
    def _resolve(self) -> "RegistrySettings":
        if self.artifacts_dir:
            self.artifacts_dir = Path(self.artifacts_dir).expanduser().resolve()
        self.cache_dir = Path(self.cache_dir).expanduser().resolve() if self.cache_dir else self.home / "registry-cache"
        if not self.tracking_uri:
            self.tracking_uri = f"sqlite:///{self.home / 'mlflow.db'}"
        try:
            _ = urlsplit(self.tracking_uri).port  # ValueError quoting the text (a token where the port goes)
        except ValueError:
            raise ValueError("the MLflow tracking URI (SPECDEC_TRACKING_URI / MLFLOW_TRACKING_URI) cannot be "
                             "parsed: invalid host or port") from None
        return self


def get_settings() -> RegistrySettings:
    """The registry section read from the environment (an entry point's own read; jobs are handed theirs by
    :func:`flows.settings.load_settings`)."""
    return RegistrySettings()


def is_local_store(uri: str) -> bool:
    """True for a store (tracking URI ``uri``) this process opens itself (SQLite or another SQLAlchemy URL),
    False for a server."""
    return not uri.startswith(("http://", "https://", "databricks"))


def redact_uri(uri: str) -> str:
    """``uri`` without user:password and query string, for messages and logs (never log secrets)."""
    try:
        parts = urlsplit(uri)
        port = parts.port  # ValueError (quoting the text) when the port is not a number
    except ValueError:
        return "<unparseable uri>"
    netloc = parts.hostname or ""
    if port:
        netloc += f":{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def local_artifacts_root(uri: str, settings: RegistrySettings) -> Path:
    """Artifact root for experiments on a local store at ``uri``: ``settings.artifacts_dir``
    (``SPECDEC_ARTIFACTS_DIR``) if set, else ``mlartifacts/`` next to the SQLite file, else
    ``<settings.home>/mlartifacts``."""
    if settings.artifacts_dir:
        return settings.artifacts_dir
    if uri.startswith("sqlite:///") and uri != "sqlite:///:memory:":
        return Path(uri[len("sqlite:///"):]).expanduser().resolve().parent / "mlartifacts"
    return settings.home / "mlartifacts"
