"""Reach the Ray or Dask cluster a nightly run names before any work starts, within a stated deadline.

``--ray-address auto`` is Ray's word for "the cluster this machine belongs to"; ``prefect-ray`` reads it as "start
a local Ray" (a silent local cluster, a session token under the user's home). Here it resolves the way Ray itself
does (``RAY_ADDRESS``, else the cluster ``ray start`` recorded or a running one), and no cluster is one line. An
address that does not answer (``ray://host:10001``, a GCS ``host:6379``, a Dask ``tcp://host:8786``) is one line
after at most :data:`CONNECT_TIMEOUT_S` seconds instead of Ray's endless reconnects or Dask's waits.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

__all__ = ["CONNECT_TIMEOUT_S", "ClusterUnreachable", "ray_cluster_address", "check_reachable", "check_cluster"]

#: seconds one TCP connect to a named cluster may take before the run ends with one line
CONNECT_TIMEOUT_S = 10.0
_DEFAULT_PORTS = {"ray": 10001, "tcp": 8786, "tls": 8786, "": 6379}


class ClusterUnreachable(RuntimeError):
    """The cluster a run names is not there; the message is one line saying what to do."""


def ray_cluster_address(address: str) -> str | None:
    """The Ray address to connect to: ``None`` for ``local`` (a Ray started for the run), the running cluster's
    ``host:port`` for ``auto``, else ``address`` as given.

    Raises:
        ClusterUnreachable: ``auto`` and no Ray cluster runs here (none recorded, none found, ``RAY_ADDRESS`` unset).
    """
    if address == "local":
        return None
    if address != "auto":
        return address
    from ray._private.services import canonicalize_bootstrap_address  # how ray.init resolves "auto", read-only

    try:
        found = canonicalize_bootstrap_address("auto")
    except ConnectionError:
        found = None
    if not found:
        raise ClusterUnreachable("--ray-address auto: no Ray cluster runs on this machine (none started with "
                                 "`ray start`, RAY_ADDRESS unset); start one with `ray start --head`, give its address, "
                                 "or use --ray-address local for a Ray started for this run only")
    return found


def _host_port(address: str) -> tuple[str, int]:
    """``(host, port)`` of ``ray://h:p``, ``tcp://h:p``, ``h:p`` (the scheme's usual port when none is given).

    Raises:
        ClusterUnreachable: no host in ``address``.
    """
    parts = urlsplit(address if "://" in address else f"//{address}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname:
        raise ClusterUnreachable(f"{address!r} names no host: give host:port, ray://host:port or tcp://host:port")
    return parts.hostname, port or _DEFAULT_PORTS.get(parts.scheme, 6379)


def check_reachable(option: str, address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """One TCP connect to ``address`` within ``timeout_s`` seconds.

    Raises:
        ClusterUnreachable: refused, unreachable, or no answer in time (one line naming ``option``, the address and
            the deadline).
    """
    host, port = _host_port(address)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as e:
        why = "no answer" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__)
        raise ClusterUnreachable(f"{option} {address}: nothing answers at {host}:{port} within {timeout_s:g} s "
                                 f"({why}); start the cluster, or give the address of a running one") from None


def check_cluster(ray_address: str | None, dask_address: str | None, timeout_s: float = CONNECT_TIMEOUT_S) -> str | None:
    """Check the cluster a run names before it starts; returns the Ray address to use (:func:`ray_cluster_address`,
    ``"local"`` kept as it is, ``None`` without Ray).

    Raises:
        ClusterUnreachable: ``auto`` finds no Ray cluster, or the named address does not answer within ``timeout_s``.
    """
    if dask_address:
        check_reachable("--dask-address", dask_address, timeout_s)
    if not ray_address:
        return None
    resolved = ray_cluster_address(ray_address)
    if resolved is None:
        return "local"
    check_reachable("--ray-address", resolved, timeout_s)
    return resolved
