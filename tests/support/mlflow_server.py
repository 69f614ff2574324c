"""Real MLflow back ends for tests: a pre-initialized SQLite store and a ``mlflow server``.

Nothing here is mocked: :func:`sqlite_store` returns a real SQLite tracking/registry URI, and
:class:`MlflowServer` runs ``mlflow server`` as a child process on 127.0.0.1 with the same flags as the
docker-compose service (SQL backend, ``--serve-artifacts``, ``--artifacts-destination``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support.net import free_port

_TEMPLATE_LOCK = "mlflow-template.lock"


def _init_store(db: Path, default_artifact_root: str) -> None:
    from mlflow.store.model_registry.sqlalchemy_store import SqlAlchemyStore as RegistryStore
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore as TrackingStore

    uri = f"sqlite:///{db}"
    TrackingStore(uri, default_artifact_root)  # creates the schema and the "Default" experiment
    RegistryStore(uri)


def sqlite_store(directory: str | Path, template_dir: str | Path | None = None, *, for_server: bool = False,
                 keep_existing: bool = False) -> str:
    """Create an empty MLflow SQLite store at ``<directory>/mlflow.db`` and return its URI.

    Creating MLflow's schema takes seconds (dozens of migrations), so the first call writes an initialized
    template into ``template_dir`` (default: the system temp dir, keyed by the MLflow version) and later
    calls copy it (milliseconds). Experiments created by :mod:`registry` on a local store put their
    artifacts in ``<directory>/mlartifacts``.

    Args:
        for_server: the store backs ``mlflow server --serve-artifacts``: MLflow's "Default" experiment
            then stores artifacts under ``mlflow-artifacts:/0`` (proxied), as a server-created store would.
    """
    import mlflow

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tdir = Path(template_dir) if template_dir else Path(tempfile.gettempdir()) / "specdec-mlflow-templates"
    tdir.mkdir(parents=True, exist_ok=True)
    kind = "server" if for_server else "local"
    template = tdir / f"mlflow-{mlflow.__version__}-{kind}.db"
    if not template.exists():
        tmp = tdir / f".building-{os.getpid()}-{time.time_ns()}"
        tmp.mkdir()
        try:
            _init_store(tmp / "mlflow.db", "mlflow-artifacts:/" if for_server else "./mlartifacts")
            os.replace(tmp / "mlflow.db", template)  # atomic: never a half-built template
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    db = directory / "mlflow.db"
    if not (keep_existing and db.exists()):
        shutil.copyfile(template, db)
    return f"sqlite:///{db}"


class MlflowServer:
    """``mlflow server`` on 127.0.0.1 (free port) as a child process; a context manager.

    Args:
        directory: holds ``mlflow.db`` (backend store, from :func:`sqlite_store`), ``artifacts/``
            (``--artifacts-destination``) and ``server.log``.
        port: default a free port.
        startup_timeout: seconds to wait for ``/health``.
    Attributes:
        uri: ``http://127.0.0.1:<port>`` once started.
    Raises:
        RuntimeError: the server exited or did not become healthy in time (log tail included).
    """

    def __init__(self, directory: str | Path, *, port: int | None = None, startup_timeout: float = 90.0,
                 template_dir: str | Path | None = None, keep_existing: bool = False):
        self.directory = Path(directory)
        self.port = port or free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.startup_timeout = startup_timeout
        self.template_dir = template_dir
        self.keep_existing = keep_existing  # restart on an existing store (a server coming back up)
        self.proc: subprocess.Popen | None = None

    def start(self) -> "MlflowServer":
        """Start the process and block until ``GET /health`` answers 200."""
        import httpx

        backend = sqlite_store(self.directory, self.template_dir, for_server=True, keep_existing=self.keep_existing)
        artifacts = self.directory / "artifacts"
        artifacts.mkdir(parents=True, exist_ok=True)
        self.log_path = self.directory / "server.log"
        cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend,
               "--artifacts-destination", str(artifacts), "--serve-artifacts",
               "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"]
        env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}
        env.pop("MLFLOW_TRACKING_URI", None)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.directory,
                                         start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {self.proc.returncode}:\n{self._tail()}")
            try:
                if httpx.get(self.uri + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"mlflow server not healthy after {self.startup_timeout:.0f}s:\n{self._tail()}")

    def _tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self) -> None:
        """Terminate the server's process group (SIGTERM, then SIGKILL after 10 s)."""
        import signal

        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=5)

    def __enter__(self) -> "MlflowServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
