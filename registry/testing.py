"""Real MLflow back ends for tests and demos: a pre-initialized SQLite store and a ``mlflow server``.

Nothing here is mocked: :func:`sqlite_store` returns a real SQLite tracking/registry URI, and
:class:`MlflowServer` runs ``mlflow server`` as a child process on 127.0.0.1 with the same flags as the
docker-compose service (SQL backend, ``--serve-artifacts``, ``--artifacts-destination``).
Also :func:`tiny_report`, a small hand-built :class:`~specdec.validation.report.ValidationReport`.
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_TEMPLATE_LOCK = "mlflow-template.lock"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


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


def tiny_report(
    acceptance_rate: float = 0.7,
    ci: tuple[float, float] | None = None,
    *,
    exactness_mismatches: int = 0,
    predicted_speedup: float = 1.5,
    categories: dict[str, float] | None = None,
    num_speculative_tokens: int = 4,
    heldout_name: str = "tiny-heldout",
    heldout_version: str = "sha256:0000",
):
    """A hand-built :class:`~specdec.validation.report.ValidationReport` with the given headline numbers.

    Args:
        acceptance_rate: pooled acceptance rate in [0, 1].
        ci: 95% CI (default ``rate ± 0.05`` clipped to [0, 1]).
        exactness_mismatches: greedy exactness-audit failures (of 3 audited prompts).
        categories: category -> acceptance rate (default summarization/coding/qa around ``acceptance_rate``).
    """
    from specdec.validation.report import GroupMetrics, PromptResult, ValidationReport

    lo, hi = ci if ci else (max(acceptance_rate - 0.05, 0.0), min(acceptance_rate + 0.05, 1.0))
    k = num_speculative_tokens
    per_pos = [acceptance_rate ** (0.5 + 0.5 * i) for i in range(k)]
    cats = categories if categories is not None else {
        "summarization": acceptance_rate, "coding": min(acceptance_rate + 0.1, 1.0), "qa": max(acceptance_rate - 0.1, 0.0)}

    def group(rate: float, n: int) -> GroupMetrics:
        drafted = 40 * n
        return GroupMetrics(
            num_prompts=n, num_speculative_tokens=k, num_drafts=10 * n, num_draft_tokens=drafted,
            num_accepted_tokens=round(rate * drafted), accepted_per_position=[round(p * 10 * n) for p in per_pos],
            num_emitted_tokens=round(rate * drafted) + 10 * n, acceptance_rate=rate,
            acceptance_rate_ci=[max(rate - (acceptance_rate - lo), 0.0), min(rate + (hi - acceptance_rate), 1.0)],
            mean_accepted_length=1 + rate * k, per_position_acceptance=per_pos, draft_tokens_per_step=float(k),
            alpha_hat=per_pos[0], alpha_tf=rate, top1_agreement=min(rate + 0.05, 1.0), total_variation=1 - rate,
            kl_divergence=-math.log(max(rate, 1e-6)), speedup=predicted_speedup * 0.9, cost_ratio=0.3,
            predicted_speedup=predicted_speedup, recommended_num_speculative_tokens=k,
            exactness_checked=3 if n > 1 else 1, exactness_mismatches=exactness_mismatches if n > 1 else 0,
        )

    overall = group(acceptance_rate, 3 * max(len(cats), 1))
    overall.acceptance_rate_ci = [lo, hi]
    prompts = [PromptResult(prompt_id=f"{c}-{i}", category=c, prompt_tokens=12, new_tokens=32, acceptance_rate=r,
                            exact_match=True) for c, r in cats.items() for i in range(3)]
    return ValidationReport(
        heldout_name=heldout_name, heldout_version=heldout_version, target_ref="tiny-target", drafter_kind="model",
        drafter_ref="tiny-draft",
        config={"num_speculative_tokens": k, "max_new_tokens": 32, "temperature": 0.0, "top_k": None, "top_p": None, "seed": 0},
        device="cpu", dtype="float32", code_version="test", created_at="2026-01-01T00:00:00+00:00",
        overall=overall, categories={c: group(r, 3) for c, r in cats.items()}, prompts=prompts, wall_seconds=1.0,
    )
