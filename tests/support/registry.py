"""The tests' MLflow service: what an entry point hands the registry's operations.

Every operation of the ``registry`` package takes ``registry=`` (a :class:`registry.service.Registry`), required:
the entry point reads the registry section and opens one (the edge reads the settings, issue 42); a test is such
an entry point. :func:`open_registry_at` opens one for a test's store, reading the rest of the section from the
environment at the call, as the command line does.
"""

from __future__ import annotations


def open_registry_at(uri: str | None = None, *, check: bool = True):
    """A :class:`registry.service.Registry` on ``uri`` (None: the section's own URI, ``SPECDEC_TRACKING_URI`` /
    ``MLFLOW_TRACKING_URI`` / ``sqlite:///<SPECDEC_HOME>/mlflow.db``), the rest of the registry section
    (:class:`registry.settings.RegistrySettings`) read from the environment now; ``check``: probe a server's
    ``/health`` now. Raises RegistryUnavailable / RegistryError (unreachable or bad URI), pydantic's
    ``ValidationError`` on a malformed setting."""
    from registry.service import Registry
    from registry.settings import RegistrySettings

    return Registry(RegistrySettings(), tracking_uri=uri, check=check)
