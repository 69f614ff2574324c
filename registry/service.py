"""The registry service: one MLflow client and its tracking URI, resolved once, and every read of the
registry as a method.

:class:`Registry` is what a caller holds for a whole job (the nightly flow holds one per night):
``get_client`` (settings, URI scheme check, ``/health`` probe of a server) runs once, and every
method turns MLflow's connection errors into :class:`registry.errors.RegistryUnavailable`. The
module-level functions (``registry.resolve_alias(pair, alias, tracking_uri=...)``, ...) are the same
operations for a single call: ``Registry(tracking_uri).<operation>(...)``. The implementations take
the client and live with their concept (:mod:`registry.models`, :mod:`registry.pairs`,
:mod:`registry.runs`, :mod:`registry.promotion`).
"""

from __future__ import annotations

from pathlib import Path

from registry.gate import GateConfig, GateResult
from registry.models import ModelVersionRef, client_download_model_version, client_get_model_version
from registry.pairs import PairVersion, client_get_pair_version, client_resolve_alias
from registry.promotion import client_check_gate
from registry.runs import client_latest_validation_run, client_validation_history
from registry.settings import VALIDATION_EXPERIMENT, get_client, mlflow_errors


class Registry:
    """The MLflow registry specdec reads and writes.

    Args:
        tracking_uri: MLflow URI (default: the settings' ``SPECDEC_TRACKING_URI`` / ``MLFLOW_TRACKING_URI`` /
            ``sqlite:///<home>/mlflow.db``).
        check: probe ``<uri>/health`` of a server now (fail fast).
    Attributes:
        client: the ``mlflow.MlflowClient`` (tracking and registry on ``uri``). uri: the resolved URI.
    Raises:
        RegistryUnavailable: the server did not answer; RegistryError: an unsupported URI.
    """

    def __init__(self, tracking_uri: str | None = None, *, check: bool = True) -> None:
        self.client = get_client(tracking_uri, check=check)
        self.uri: str = self.client.tracking_uri

    def get_model_version(self, uri_or_name: str, version: str | int | None = None) -> ModelVersionRef:
        """A registered model version (``models:/<name>/<v>``, ``models:/<name>@<alias>``, or a name and
        ``version``). Raises ModelNotFound; ValueError for a malformed URI."""
        with mlflow_errors(self.uri):
            return client_get_model_version(self.client, uri_or_name, version)

    def download_model_version(self, ref: ModelVersionRef, dst: str | Path | None = None) -> Path:
        """The local directory of a model version's artifacts (cached; see :func:`registry.models.client_download_model_version`)."""
        with mlflow_errors(self.uri):
            return client_download_model_version(self.client, ref, dst)

    def resolve_alias(self, pair: str, alias: str) -> str:
        """The version ``alias`` points at now (read on every call, so UI promotions are seen).
        Raises PairNotFound, AliasNotFound."""
        with mlflow_errors(self.uri):
            return client_resolve_alias(self.client, pair, alias)

    def get_pair_version(self, pair: str, version: str | int, *, download: bool = True) -> PairVersion:
        """One pair version (``pair.json``, tags, aliases; with ``download`` its models in the local cache).
        ``version``: a number or an alias. Raises PairNotFound, AliasNotFound."""
        with mlflow_errors(self.uri):
            return client_get_pair_version(self.client, pair, version, download=download)

    def latest_validation_run(self, pair: str, version: str | int, experiment: str = VALIDATION_EXPERIMENT):
        """The most recent FINISHED validation run (``mlflow.entities.Run``) of ``pair`` v``version``, or None."""
        with mlflow_errors(self.uri):
            return client_latest_validation_run(self.client, pair, version, experiment)

    def validation_history(self, pair: str, experiment: str = VALIDATION_EXPERIMENT,
                           max_results: int = 200) -> list[dict]:
        """Past finished validation runs of ``pair`` read back from MLflow, oldest first
        (:func:`registry.runs.client_validation_history`)."""
        with mlflow_errors(self.uri):
            return client_validation_history(self.client, pair, experiment, max_results)

    def set_engine(self, pair: str, version: str | int, *, url: str, flags: list[str] | None = None,
                   concurrency: int = 1) -> None:
        """Name the engine endpoint serving a pair version (tags ``engine_url``, ``engine_flags`` as a JSON list,
        ``engine_concurrency``): the nightly's engine step checks it (:mod:`flows.engine_check`)."""
        import json

        tags = {"engine_url": url, "engine_concurrency": str(int(concurrency))}
        if flags is not None:
            tags["engine_flags"] = json.dumps(list(flags))
        with mlflow_errors(self.uri):
            client_get_pair_version(self.client, pair, version, download=False)  # unknown version: a clear error
            for k, v in tags.items():
                self.client.set_model_version_tag(pair, str(version), k, v)

    def check_gate(self, pair: str, version: str | int, gate: GateConfig | None = None,
                   experiment: str = VALIDATION_EXPERIMENT) -> GateResult:
        """The gate's verdict on the latest finished validation run of ``pair`` v``version``
        (``passed=False``, "never validated", when there is none)."""
        with mlflow_errors(self.uri):
            return client_check_gate(self.client, pair, version, gate or GateConfig(), experiment)


def get_model_version(uri_or_name: str, version: str | int | None = None, *,
                      tracking_uri: str | None = None) -> ModelVersionRef:
    """:meth:`Registry.get_model_version` for one call."""
    return Registry(tracking_uri).get_model_version(uri_or_name, version)


def download_model_version(ref: ModelVersionRef, *, dst: str | Path | None = None,
                           tracking_uri: str | None = None) -> Path:
    """:meth:`Registry.download_model_version` for one call."""
    return Registry(tracking_uri).download_model_version(ref, dst)


def resolve_alias(pair: str, alias: str, *, tracking_uri: str | None = None) -> str:
    """:meth:`Registry.resolve_alias` for one call."""
    return Registry(tracking_uri).resolve_alias(pair, alias)


def get_pair_version(pair: str, version: str | int, *, download: bool = True,
                     tracking_uri: str | None = None) -> PairVersion:
    """:meth:`Registry.get_pair_version` for one call."""
    return Registry(tracking_uri).get_pair_version(pair, version, download=download)


def latest_validation_run(pair: str, version: str | int, *, experiment: str = VALIDATION_EXPERIMENT,
                          tracking_uri: str | None = None):
    """:meth:`Registry.latest_validation_run` for one call."""
    return Registry(tracking_uri).latest_validation_run(pair, version, experiment)


def validation_history(pair: str, *, experiment: str = VALIDATION_EXPERIMENT, max_results: int = 200,
                       tracking_uri: str | None = None) -> list[dict]:
    """:meth:`Registry.validation_history` for one call."""
    return Registry(tracking_uri).validation_history(pair, experiment, max_results)


def check_gate(pair: str, version: str | int, *, gate: GateConfig | None = None,
               experiment: str = VALIDATION_EXPERIMENT, tracking_uri: str | None = None) -> GateResult:
    """:meth:`Registry.check_gate` for one call."""
    return Registry(tracking_uri).check_gate(pair, version, gate, experiment)
