"""The registry service: one MLflow client, its tracking URI and the registry's settings, opened once per
job and handed to every registry operation.

:class:`Registry` is what a job holds (the nightly holds one per night, a CLI command one per command):
the URI scheme check, the ``/health`` probe of a server and MLflow's HTTP timeouts happen once, when it
is opened. This is the one place an ``mlflow.MlflowClient`` is built. Every operation of the registry
package (:mod:`registry.models`, :mod:`registry.pairs`, :mod:`registry.runs`, :mod:`registry.promotion`,
:mod:`registry.ungated`, :mod:`registry.webhooks`, :mod:`registry.heads`, ...) takes ``registry=``, required:
the job's service, opened by its entry point from the settings section it read; MLflow's connection errors
become :class:`registry.errors.RegistryUnavailable` (:meth:`Registry.errors`).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

from registry.errors import RegistryError, RegistryUnavailable
from registry.settings import RegistrySettings, is_local_store, local_artifacts_root, redact_uri


class Registry:
    """The MLflow registry specdec reads and writes, opened once.

    Args:
        settings: the registry section (the job's, handed down from the entry point that read it).
        tracking_uri: MLflow URI overriding the section's (``--tracking-uri``).
        check: probe ``<uri>/health`` of a server now (fail fast).
    Attributes:
        settings: the section, with ``tracking_uri`` resolved. uri: the tracking and registry URI.
        client: the ``mlflow.MlflowClient`` (tracking and registry on ``uri``).
    Raises:
        RegistryUnavailable: the server did not answer; RegistryError: an unparseable or unsupported URI.
    """

    def __init__(self, settings: RegistrySettings, *, tracking_uri: str | None = None, check: bool = True) -> None:
        if tracking_uri and tracking_uri != settings.tracking_uri:
            settings = settings.model_copy(update={"tracking_uri": tracking_uri})
        self.settings = settings
        self.uri: str = settings.tracking_uri  # type: ignore[assignment]
        self.client = _open_client(settings, check=check)

    def errors(self):
        """Context manager: MLflow's connection failures inside become :class:`RegistryUnavailable`."""
        return mlflow_errors(self.uri)

    def experiment(self, name: str) -> str:
        """The id of experiment ``name`` (:func:`get_or_create_experiment`)."""
        return get_or_create_experiment(self.client, name, self.settings)


_SCHEMES = {"sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks", "file"}


def _open_client(settings: RegistrySettings, *, check: bool):
    """Build the ``MlflowClient`` for ``settings.tracking_uri`` (tracking and registry on the same URI).

    For an ``http(s)://`` server, sets short ``MLFLOW_HTTP_REQUEST_TIMEOUT`` /
    ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` defaults (only if unset: MLflow reads them from the environment)
    and, when ``check``, probes ``<uri>/health`` so an unreachable server fails fast. For a SQLite URI,
    creates the parent directory.

    Raises:
        RegistryUnavailable: the server did not answer ``/health`` with 200. RegistryError: a bad URI.
    """
    from mlflow import MlflowClient

    uri = settings.tracking_uri
    assert uri is not None
    scheme = uri.split(":", 1)[0].split("+", 1)[0].lower() if ":" in uri else ""
    if redact_uri(uri) == "<unparseable uri>":  # e.g. a token where the port goes: never quote it
        raise RegistryError("the MLflow tracking URI (--tracking-uri / SPECDEC_TRACKING_URI) cannot be parsed: "
                            "invalid host or port")
    if scheme not in _SCHEMES:
        raise RegistryError(f"unsupported MLflow tracking URI {redact_uri(uri)!r}: use sqlite:///path, "
                            "http(s)://host:port, or a database URI (postgresql://, mysql://)")
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    if uri.startswith(("http://", "https://")):
        _no_run_links(uri)
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(settings.http_timeout))
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(settings.http_max_retries))
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
        if check:
            check_server(uri, timeout=float(settings.http_timeout))
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _no_run_links(uri: str) -> None:
    """MLflow prints "View run NAME at: <tracking URI>/#/experiments/..." to stdout when a run ends, with
    the URI's user info (``http://user:PASSWORD@host``) in it. Our commands print their own (redacted)
    lines, so it is off by default (``MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT``, MLflow's own switch), and
    always off when the URI holds a credential."""
    from urllib.parse import urlsplit

    if "@" in (urlsplit(uri).netloc or ""):
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
    else:
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")


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



@contextmanager
def mlflow_errors(uri: str):
    """Turn MLflow's "API request ... failed" (connection refused, timeouts, retries exhausted) at the tracking
    URI ``uri`` into :class:`RegistryUnavailable` (``uri`` redacted); other exceptions pass through unchanged."""
    from mlflow.exceptions import MlflowException

    try:
        yield
    except MlflowException as e:
        msg = str(e)
        if "API request to" in msg and ("failed with exception" in msg or "Max retries" in msg):
            msg = msg.replace(uri, redact_uri(uri))
            raise RegistryUnavailable(f"MLflow server at {redact_uri(uri)} is unreachable: {msg[:300]}") from e
        raise


#: experiment tag read by the MLflow 3 UI to pick an experiment's default view: without it, an
#: experiment opens on the GenAI overview (traces, tokens, cost: all "No data") instead of its runs
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"


def get_or_create_experiment(client, name: str, settings: RegistrySettings) -> str:
    """The id of experiment ``name``, created if missing and tagged to open on its runs table in the
    MLflow UI. On a local store its artifacts go under ``<artifacts_dir>/<name>`` (not ``./mlruns``
    of whatever the working directory is; ``settings``: the registry section naming that root)."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if (exp.tags or {}).get(EXPERIMENT_KIND_TAG) is None:  # experiments made before the tag
            client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return exp.experiment_id
    location = None
    if is_local_store(client.tracking_uri):
        d = local_artifacts_root(client.tracking_uri, settings) / name
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
