"""The compose stack's server commands, run for real as processes (no Docker engine here).

Each test takes a service's ``entrypoint + command`` and ``environment`` from ``docker/compose.yaml``
(interpolated with ``docker/.env.example``), plus the ``ENV`` of ``docker/Dockerfile.cpu``, and runs it
against a throwaway PostgreSQL prepared the way the ``postgres:16`` image does (``POSTGRES_USER`` as
superuser, ``POSTGRES_DB`` created, then ``docker/postgres-init/*.sql``). Only what cannot work outside
Docker is rewritten: service host names become 127.0.0.1, ports become free ports, ``--host 0.0.0.0``
becomes 127.0.0.1, and ``/mlartifacts`` / ``/data/specdec`` become temp dirs. Every flag stays as in
compose. Readiness is the compose healthcheck command itself (with the port rewritten).

Not covered here (needs Docker): image builds, container networking, volume ownership; those are
``make stack-test`` (docker/stack_test.py). The GPU reservation is not exercised anywhere.
Skipped where no PostgreSQL server binaries exist.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.postgres import postgres_cluster
from tests.docker.test_compose import (DOCKER, REPO, TEST_PASSWORD, _env_pairs, env_example, flag_value,
                                 parse_dockerfile, resolved_compose, service_argv)

pytestmark = pytest.mark.server

BIN = Path(sys.executable).parent  # the venv's console scripts: mlflow, prefect, specdec


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stack:
    """Ports and rewrites shared by the tests."""

    def __init__(self, root: Path, pg_port: int):
        self.root = root
        self.pg_port = pg_port
        self.env = {**env_example(), "POSTGRES_PASSWORD": TEST_PASSWORD}
        self.compose = resolved_compose()
        self.ports = {"mlflow": _free_port(), "prefect-server": _free_port()}
        self.procs: list[subprocess.Popen] = []

    def localize(self, s: str) -> str:
        """Service names -> 127.0.0.1 with this test's ports; container paths -> temp dirs."""
        s = s.replace("@postgres:5432/", f"@127.0.0.1:{self.pg_port}/")
        s = s.replace("http://mlflow:5000", f"http://127.0.0.1:{self.ports['mlflow']}")
        s = s.replace("http://prefect-server:4200", f"http://127.0.0.1:{self.ports['prefect-server']}")
        s = s.replace("/home/specdec/", f"{self.root}/home/")  # the image user's home
        return s

    def argv(self, service: str) -> list[str]:
        argv = [self.localize(a) for a in service_argv(self.compose["services"][service])]
        for flag, value in (("--host", "127.0.0.1"), ("--port", str(self.ports.get(service)))):
            if flag in argv:
                argv[argv.index(flag) + 1] = value
        if "--artifacts-destination" in argv:
            i = argv.index("--artifacts-destination") + 1
            assert argv[i] == "/mlartifacts"
            argv[i] = str(self.root / "mlartifacts")
        return argv

    def process_env(self, service: str, **extra: str) -> dict[str, str]:
        """Image ENV (Dockerfile.cpu) + the service's compose environment, localized."""
        image_env = _env_pairs(parse_dockerfile(DOCKER / "Dockerfile.cpu"))
        for layout in ("VIRTUAL_ENV", "PATH"):  # the image's /opt/venv; here the test's venv stands in
            image_env.pop(layout, None)
        image_env["SPECDEC_HOME"] = str(self.root / "data" / service)
        image_env["HF_HOME"] = str(self.root / "data" / service / "huggingface")
        svc_env = {k: self.localize(str(v)) for k, v in self.compose["services"][service].get("environment", {}).items()}
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "SPECDEC_"))}
        env.update(image_env)
        env.update(svc_env)
        prefect_home = self.root / "prefect" / service
        prefect_home.mkdir(parents=True, exist_ok=True)
        env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", PREFECT_HOME=str(prefect_home))
        env.update(extra)
        return env

    def start(self, service: str, *, env: dict[str, str], cwd: Path | None = None) -> subprocess.Popen:
        argv = self.argv(service)
        log = open(self.root / f"{service}.log", "wb")
        proc = subprocess.Popen(argv, env=env, cwd=cwd or self.root, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs.append(proc)
        return proc

    def log(self, service: str) -> str:
        return (self.root / f"{service}.log").read_text(errors="replace")[-4000:]

    def wait_healthy(self, service: str, proc: subprocess.Popen, port: int, env: dict[str, str],
                     timeout: float = 150.0) -> float:
        """Run the compose healthcheck (``CMD`` form, port rewritten) until it exits 0; returns seconds."""
        test = self.compose["services"][service]["healthcheck"]["test"]
        assert test[0] == "CMD"
        published = {"mlflow": 5000, "prefect-server": 4200}.get(service, 8080)
        cmd = [a.replace(f"127.0.0.1:{published}/", f"127.0.0.1:{port}/") for a in test[1:]]
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if proc.poll() is not None:
                pytest.fail(f"{service} exited with {proc.returncode}:\n{self.log(service)}")
            if subprocess.run(cmd, env=env, capture_output=True, timeout=30).returncode == 0:
                return time.monotonic() - t0
            time.sleep(1.0)
        pytest.fail(f"{service} not healthy after {timeout:.0f}s:\n{self.log(service)}")

    @staticmethod
    def stop(proc: subprocess.Popen) -> None:
        import signal

        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def stack():
    env = env_example()
    user, db = env["POSTGRES_USER"], env["POSTGRES_DB"]
    # What the postgres image's entrypoint does: initdb with POSTGRES_USER as superuser, create POSTGRES_DB,
    # then run /docker-entrypoint-initdb.d/*.sql with psql as that user in that database.
    # (Auth is `trust` here; the image uses scram-sha-256 with POSTGRES_PASSWORD.)
    with postgres_cluster(user, prefix="specdec-docker-stack-") as (port, root):
        yield from _stack_on(root, port, user, db)


def _stack_on(root: Path, port: int, user: str, db: str):
    s = Stack(root, port)
    try:
        import psycopg

        with psycopg.connect(f"postgresql://{user}@127.0.0.1:{port}/postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{db}"')
        for sql in sorted((DOCKER / "postgres-init").glob("*.sql")):
            psql = shutil.which("psql")
            if psql:
                subprocess.run([psql, "-v", "ON_ERROR_STOP=1", "--no-psqlrc", "-h", "127.0.0.1", "-p", str(port),
                                "-U", user, "-d", db, "-f", str(sql)], check=True, capture_output=True, timeout=60)
            else:
                with psycopg.connect(f"postgresql://{user}@127.0.0.1:{port}/{db}", autocommit=True) as conn:
                    for stmt in filter(str.strip, sql.read_text().split(";")):
                        if stmt.strip() and not all(ln.strip().startswith("--") for ln in stmt.strip().splitlines()):
                            conn.execute(stmt)
        yield s
    finally:
        for p in reversed(s.procs):
            Stack.stop(p)


def _tables(stack: Stack, db: str) -> set[str]:
    import psycopg

    with psycopg.connect(f"postgresql://{stack.env['POSTGRES_USER']}@127.0.0.1:{stack.pg_port}/{db}") as conn:
        return {r[0] for r in conn.execute("select tablename from pg_tables where schemaname = 'public'")}


@pytest.fixture(scope="module")
def servers(stack):
    """``mlflow`` and ``prefect-server`` started together (their first start migrates their databases),
    each waited for with its compose healthcheck."""
    envs = {name: stack.process_env(name) for name in ("mlflow", "prefect-server")}
    procs = {name: stack.start(name, env=envs[name]) for name in envs}
    for name in envs:
        startup = stack.wait_healthy(name, procs[name], stack.ports[name], envs[name], timeout=240)
        print(f"{name} healthy after {startup:.1f}s")
    yield procs
    for p in procs.values():
        Stack.stop(p)


def test_mlflow_service_command(stack, servers, tmp_path):
    argv = stack.argv("mlflow")
    assert argv[:2] == ["mlflow", "server"] and "--serve-artifacts" in argv
    port = stack.ports["mlflow"]
    base = f"http://127.0.0.1:{port}"
    search = "/api/2.0/mlflow/experiments/search?max_results=1"

    # The workers reach it as http://mlflow:5000: that Host header must pass MLflow's DNS-rebinding check,
    # and an unknown one must not (so --allowed-hosts is in force, not '*').
    assert httpx.get(base + search, headers={"Host": "mlflow:5000"}, timeout=10).status_code == 200
    assert httpx.get(base + search, headers={"Host": "localhost:5000"}, timeout=10).status_code == 200
    assert httpx.get(base + search, headers={"Host": "evil.example:5000"}, timeout=10).status_code in (400, 403)

    # Tracking data lands in the `mlflow` database, artifacts go through the server into
    # --artifacts-destination.
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=base, registry_uri=base)
    exp_id = client.create_experiment("docker-stack-check")
    assert client.get_experiment(exp_id).artifact_location.startswith("mlflow-artifacts:")
    run = client.create_run(exp_id)
    f = tmp_path / "note.txt"
    f.write_text("through the artifact proxy")
    client.log_artifact(run.info.run_id, str(f))
    stored = list((stack.root / "mlartifacts").rglob("note.txt"))
    assert len(stored) == 1 and stored[0].read_text() == "through the artifact proxy"
    client.create_registered_model("docker-stack-pair")
    assert {"experiments", "runs", "registered_models", "alembic_version"} <= _tables(stack, "mlflow")
    assert "alembic_version" not in _tables(stack, stack.env["POSTGRES_DB"]), \
        "MLflow must not touch the history database"


def test_prefect_server_command(stack, servers):
    argv = stack.argv("prefect-server")
    assert argv[:3] == ["prefect", "server", "start"]
    assert stack.process_env("prefect-server")["PREFECT_API_DATABASE_CONNECTION_URL"].startswith("postgresql+asyncpg://")
    assert {"flow_run", "deployment", "work_pool", "alembic_version"} <= _tables(stack, "prefect")
    # the UI is served (its static directory is writable for the image's non-root user)
    ui = httpx.get(f"http://127.0.0.1:{stack.ports['prefect-server']}/", timeout=30)
    assert ui.status_code == 200 and "<html" in ui.text.lower(), ui.text[:300]
    ui_dir = stack.process_env("prefect-server")["PREFECT_UI_STATIC_DIRECTORY"]
    assert ui_dir.startswith(str(stack.root)) and any(Path(ui_dir).iterdir())
    assert "flow_run" not in _tables(stack, stack.env["POSTGRES_DB"])


def test_worker_command(stack, servers):
    """The CPU worker, exactly as compose starts it (its healthcheck server on a free port, not 8080)."""
    api = f"http://127.0.0.1:{stack.ports['prefect-server']}/api"
    wport = _free_port()
    wenv = stack.process_env("worker", PREFECT_WORKER_WEBSERVER_PORT=str(wport),
                             PREFECT_WORKER_WEBSERVER_HOST="127.0.0.1")
    assert wenv["PREFECT_API_URL"] == api
    worker = stack.start("worker", env=wenv)
    stack.wait_healthy("worker", worker, wport, wenv, timeout=120)
    deadline, workers = time.monotonic() + 90, []
    while time.monotonic() < deadline and not workers:  # the worker creates its pool, then heartbeats
        assert worker.poll() is None, stack.log("worker")
        workers = httpx.post(f"{api}/work_pools/cpu-pool/workers/filter", json={}, timeout=10).json()
        if not isinstance(workers, list):  # 404 {"detail": ...} until the pool exists
            workers = []
        time.sleep(1)
    assert workers, f"the worker never registered with cpu-pool:\n{stack.log('worker')}"
    pool = httpx.get(f"{api}/work_pools/cpu-pool", timeout=10)
    assert pool.status_code == 200 and pool.json()["type"] == "process", pool.text
    stack.wait_healthy("worker", worker, wport, wenv, timeout=30)  # still healthy once polling
    Stack.stop(worker)


def test_worker_environment_reaches_the_history_database(stack):
    """With the worker's environment (SPECDEC_DB_URL, SPECDEC_ALERT_CHANNELS, ...), the image's entry
    point creates the history tables in POSTGRES_DB, next to (not inside) MLflow's and Prefect's."""
    env = stack.process_env("worker")
    r = subprocess.run(["specdec", "db", "upgrade"], env=env, cwd=stack.root, capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert TEST_PASSWORD not in r.stdout + r.stderr, "the database password was printed"
    tables = _tables(stack, stack.env["POSTGRES_DB"])
    assert "alembic_version" in tables and len(tables) > 1
    assert not tables & {"experiments", "flow_run"}


NIGHTLY_CRON = "30 3 * * *"  # not the default, to see whether SPECDEC_NIGHTLY_CRON reaches the schedule


@pytest.fixture(scope="module")
def deployed(stack, servers):
    """The deploy one-shot as compose runs it (work pools, then ``prefect --no-prompt deploy --all`` from
    prefect.yaml; the image's /app is the repository root), with SPECDEC_NIGHTLY_CRON set."""
    if not (REPO / "prefect.yaml").exists():
        pytest.skip("no prefect.yaml at the repository root yet: the deploy service has nothing to deploy")
    api = f"http://127.0.0.1:{stack.ports['prefect-server']}/api"
    env = stack.process_env("deploy", SPECDEC_NIGHTLY_CRON=NIGHTLY_CRON)
    r = subprocess.run(stack.argv("deploy"), env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    deps = httpx.post(f"{api}/deployments/filter", json={"deployments": {"name": {"any_": ["nightly-validation"]}}},
                      timeout=10).json()
    assert len(deps) == 1, deps
    return api, deps[0]


def test_deploy_command(deployed):
    api, dep = deployed
    assert dep["work_pool_name"] == "cpu-pool"
    assert [s["schedule"].get("cron") for s in dep["schedules"]] and all(
        s["schedule"].get("cron") and s["active"] for s in dep["schedules"])
    for pool in ("cpu-pool", "gpu-pool"):
        assert httpx.get(f"{api}/work_pools/{pool}", timeout=10).json()["type"] == "process"


def test_deploy_schedule_follows_SPECDEC_NIGHTLY_CRON(deployed):
    _, dep = deployed
    crons = [s["schedule"].get("cron") for s in dep["schedules"]]
    assert crons == [NIGHTLY_CRON]


def test_deploy_pull_steps_resolve_to_a_directory(stack, deployed):
    """Every ``set_working_directory`` pull step of the nightly deployment names a directory the worker
    (same image, cwd /app = repository root) can enter, after Prefect's ``{{ $ENV }}`` templating with
    the worker's environment."""
    from prefect.utilities.templating import apply_values

    _, dep = deployed
    wenv = stack.process_env("worker")
    steps = [s["prefect.deployments.steps.set_working_directory"] for s in dep["pull_steps"] or []
             if "prefect.deployments.steps.set_working_directory" in s]
    assert steps, "no set_working_directory pull step: the worker would run in an arbitrary directory"
    for step in steps:
        directory = apply_values(step["directory"], wenv, remove_notset=False)
        assert (REPO / directory).is_dir(), f"worker cannot chdir into {directory!r}"
