"""The registry's section of the settings tree and the MLflow client factory.

The section itself (:class:`specdec.settings.registry.RegistrySettings`: ``SPECDEC_TRACKING_URI`` /
``MLFLOW_TRACKING_URI``, ``SPECDEC_ARTIFACTS_DIR``, ``SPECDEC_PAIR_NAME``, ``SPECDEC_HTTP_TIMEOUT``, ...)
lives with the rest of the tree in :mod:`specdec.settings`; the default store is
``sqlite:///<home>/mlflow.db``.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from registry.errors import RegistryUnavailable
from specdec.settings.registry import RegistrySettings

REGISTRY_EXPERIMENT = "specdec-registry"
VALIDATION_EXPERIMENT = "specdec-validation"


def get_settings() -> RegistrySettings:
    """The registry section of the settings tree (:mod:`specdec.settings`), read afresh from the environment."""
    return RegistrySettings()


def resolve_tracking_uri(tracking_uri: str | None = None) -> str:
    """``tracking_uri`` if given, else the settings' URI (``SPECDEC_TRACKING_URI`` /
    ``MLFLOW_TRACKING_URI`` / ``sqlite:///<home>/mlflow.db``)."""
    return tracking_uri or get_settings().tracking_uri  # type: ignore[return-value]


def is_local_store(tracking_uri: str) -> bool:
    """True for a store this process opens itself (SQLite or another SQLAlchemy URL), False for a server."""
    return not tracking_uri.startswith(("http://", "https://", "databricks"))


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


_SCHEMES = {"sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks", "file"}


def get_client(tracking_uri: str | None = None, *, check: bool = True):
    """Build an ``MlflowClient`` for ``tracking_uri`` (tracking and registry on the same URI).

    For an ``http(s)://`` server, sets short ``MLFLOW_HTTP_REQUEST_TIMEOUT`` /
    ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` defaults (only if unset) and, when ``check``, probes
    ``<uri>/health`` so an unreachable server fails fast. For a SQLite URI, creates the parent directory.

    Returns:
        mlflow.MlflowClient; ``client.tracking_uri`` is the resolved URI.
    Raises:
        RegistryUnavailable: the server did not answer ``/health`` with 200.
    """
    from mlflow import MlflowClient

    settings = get_settings()
    uri = tracking_uri or settings.tracking_uri
    assert uri is not None
    scheme = uri.split(":", 1)[0].split("+", 1)[0].lower() if ":" in uri else ""
    if redact_uri(uri) == "<unparseable uri>":  # e.g. a token where the port goes: never quote it
        from registry.errors import RegistryError

        raise RegistryError("the MLflow tracking URI (--tracking-uri / SPECDEC_TRACKING_URI) cannot be parsed: "
                            "invalid host or port")
    if scheme not in _SCHEMES:
        from registry.errors import RegistryError

        raise RegistryError(f"unsupported MLflow tracking URI {redact_uri(uri)!r}: use sqlite:///path, "
                            "http(s)://host:port, or a database URI (postgresql://, mysql://)")
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    if uri.startswith(("http://", "https://")):
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(settings.http_timeout))
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(settings.http_max_retries))
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
        if check:
            check_server(uri, timeout=float(settings.http_timeout))
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _scrub(text: str, uri: str) -> str:
    """``text`` with ``uri`` (and its URL-decoded form) replaced by :func:`redact_uri` of it."""
    from urllib.parse import unquote

    for form in (uri, unquote(uri), uri.rstrip("/") + "/health"):
        text = text.replace(form, redact_uri(form))
    return text


def check_server(uri: str, timeout: float = 10.0) -> None:
    """GET ``<uri>/health``; raise :class:`RegistryUnavailable` unless it answers 200.

    Args:
        uri: ``http(s)://host:port[/prefix]`` of an MLflow server.
        timeout: seconds for connect + read.
    """
    import httpx

    url = uri.rstrip("/") + "/health"
    try:
        resp = httpx.get(url, timeout=timeout)
    except httpx.HTTPError as e:
        raise RegistryUnavailable(
            f"MLflow server at {redact_uri(uri)} is unreachable ({type(e).__name__}: {_scrub(str(e), uri)}). "
            "Start it, or point SPECDEC_TRACKING_URI / MLFLOW_TRACKING_URI elsewhere."
        ) from e
    if resp.status_code != 200:
        raise RegistryUnavailable(f"MLflow server at {redact_uri(uri)} answered /health with HTTP {resp.status_code}")


def local_artifacts_root(tracking_uri: str) -> Path:
    """Artifact root for experiments on a local store: ``SPECDEC_ARTIFACTS_DIR`` if set, else
    ``mlartifacts/`` next to the SQLite file, else ``<home>/mlartifacts``."""
    s = get_settings()
    if s.artifacts_dir:
        return s.artifacts_dir
    if tracking_uri.startswith("sqlite:///") and tracking_uri != "sqlite:///:memory:":
        return Path(tracking_uri[len("sqlite:///"):]).expanduser().resolve().parent / "mlartifacts"
    return s.home / "mlartifacts"


@contextmanager
def mlflow_errors(tracking_uri: str):
    """Turn MLflow's "API request ... failed" (connection refused, timeouts, retries exhausted) into
    :class:`RegistryUnavailable`; other exceptions pass through unchanged."""
    from mlflow.exceptions import MlflowException

    try:
        yield
    except MlflowException as e:
        msg = str(e)
        if "API request to" in msg and ("failed with exception" in msg or "Max retries" in msg):
            msg = msg.replace(tracking_uri, redact_uri(tracking_uri))
            raise RegistryUnavailable(f"MLflow server at {redact_uri(tracking_uri)} is unreachable: {msg[:300]}") from e
        raise


#: experiment tag read by the MLflow 3 UI to pick an experiment's default view: without it, an
#: experiment opens on the GenAI overview (traces, tokens, cost: all "No data") instead of its runs
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"


def get_or_create_experiment(client, name: str) -> str:
    """The id of experiment ``name``, created if missing and tagged to open on its runs table in the
    MLflow UI. On a local store its artifacts go under ``<artifacts_dir>/<name>`` (not ``./mlruns``
    of whatever the working directory is)."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if (exp.tags or {}).get(EXPERIMENT_KIND_TAG) is None:  # experiments made before the tag
            client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return exp.experiment_id
    location = None
    if is_local_store(client.tracking_uri):
        d = local_artifacts_root(client.tracking_uri) / name
        d.mkdir(parents=True, exist_ok=True)
        location = d.as_uri()
    from mlflow.exceptions import MlflowException

    try:
        return client.create_experiment(name, artifact_location=location, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
    except MlflowException:  # created concurrently by another process
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id
