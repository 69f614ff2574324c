#!/usr/bin/env python3
"""The docker stack, end to end, on this machine (``make stack-test``; not part of ``make test``).

Steps (each timed):

1. tools: ``docker``, ``dockerd``, ``docker-compose``, ``debootstrap``; as root, missing ones are installed
   from Debian (``docker.io docker-compose debootstrap``).
2. daemon: a running Docker daemon is used as it is; otherwise ``dockerd`` is started (overlay2, else
   vfs) and stopped again at the end.
3. bases: ``python:3.11-slim-bookworm`` and ``postgres:16`` are pulled; where no registry answers,
   ``docker/local_bases.sh`` builds stand-ins from Debian packages (PostgreSQL 15).
4. wheelhouse: ``pip download`` of the CPU torch wheel and every dependency into
   ``.specdec/docker/wheelhouse`` with this machine's pip settings; refused if a CUDA wheel got in.
5. image: ``docker build`` of ``docker/Dockerfile.cpu`` (``specdec:cpu``), offline, with the wheelhouse
   served on 127.0.0.1 (``--network host``, ``PIP_FIND_LINKS``, ``PIP_NO_INDEX=1``).
6. up: ``docker-compose -p specdec-stacktest -f docker/compose.yaml -f docker/stack-test.override.yaml
   up -d`` (Postgres, MLflow server, Prefect server, deploy, CPU worker); waits for health and deploy's
   exit 0. Ports are free ones on 127.0.0.1; the password is random; alerts go to a webhook receiver
   on the host.
7. scenario: in the worker container, a tiny random target and an unrelated tiny random draft are saved
   and registered as ``specdec-pair`` through the MLflow server (``specdec pair register``); the
   ``nightly-validation`` deployment is run through the Prefect API on a 12-prompt held-out file and
   waited for. Checks: the flow run COMPLETED; one FINISHED MLflow run for the pair with
   ``acceptance_rate`` < 0.40 and ``report.json`` among its artifacts; one history row in Postgres
   (``validation_runs``) with the same acceptance rate and MLflow run id; exactly one ``fire`` alert
   received on the host.
8. down: logs summarized, ``docker-compose down -v`` (containers, network, volumes).

Timings, checks and the log summary go to ``benchmarks/results/stack.md``. Exit status 0 only if every
check passed. Standard library only (runs with the system ``python3``; no project venv needed).

Usage: ``python3 docker/stack_test.py [--build-only] [--keep] [--local-bases]``
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import http.server
import json
import os
import platform
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCKER_DIR = REPO / "docker"
WHEELHOUSE = REPO / ".specdec" / "docker" / "wheelhouse"
RESULTS = REPO / "benchmarks" / "results" / "stack.md"
LOG = REPO / ".specdec" / "docker" / "stack-test.log"  # every command's output, this run
PROJECT = "specdec-stacktest"
IMAGE = "specdec:cpu"
PUBLIC_BASES = ("python:3.11-slim-bookworm", "postgres:16")
LOCAL_BASES = ("specdec-local/python:3.11-bookworm", "specdec-local/postgres:15-bookworm")
SERVICES = ("postgres", "mlflow", "prefect-server", "deploy", "worker")
PAIR = "specdec-pair"
DATA = "/data/specdec/stack-test"  # in the worker's specdec-data volume


class StackError(RuntimeError):
    """A step of the stack test failed (message says which and why)."""


def sh(cmd: list[str], *, env: dict | None = None, timeout: float = 1800, check: bool = True,
       quiet: bool = True) -> subprocess.CompletedProcess:
    """Run ``cmd`` from the repository root; its output also goes to ``LOG``.

    Returns the completed process (stdout and stderr together, as text). Raises StackError if ``check``
    and it exits non-zero (with the output's tail), subprocess.TimeoutExpired past ``timeout`` seconds.
    """
    r = subprocess.run(cmd, env=env, cwd=REPO, text=True, timeout=timeout, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT)
    with LOG.open("a") as f:
        f.write(f"$ {' '.join(cmd)}\n{r.stdout}[exit {r.returncode}]\n")
    if not quiet:
        print(r.stdout, end="")
    if check and r.returncode != 0:
        raise StackError(f"`{' '.join(cmd[:6])} ...` exited {r.returncode}:\n{r.stdout[-4000:]}")
    return r


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url: str, body: dict | None = None, timeout: float = 30) -> object:
    """GET (``body`` None) or POST JSON; returns the decoded JSON answer."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"null")


class Steps:
    """Named, timed steps, recorded for the report."""

    def __init__(self) -> None:
        self.timings: list[tuple[str, float]] = []
        self.checks: list[str] = []
        self.notes: list[str] = []

    def run(self, name: str, fn, *args, **kwargs):
        print(f"== {name}", flush=True)
        t0 = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            self.timings.append((name, time.monotonic() - t0))
            print(f"   {name}: {self.timings[-1][1]:.0f} s", flush=True)

    def check(self, ok: bool, what: str) -> None:
        self.checks.append(("PASS " if ok else "FAIL ") + what)
        print(f"   {'ok' if ok else 'FAILED'}: {what}", flush=True)
        if not ok:
            raise StackError(f"check failed: {what}")


# ---------------------------------------------------------------------------------------------------
# 1-2 tools and daemon
# ---------------------------------------------------------------------------------------------------
def ensure_tools(steps: Steps) -> None:
    missing = [t for t in ("dockerd", "docker-compose", "debootstrap") if not shutil.which(t)]
    if missing:
        if os.geteuid() != 0:
            raise StackError(f"missing {missing}; as root: apt-get install docker.io docker-compose debootstrap")
        sh(["apt-get", "update", "-qq"], timeout=600)
        sh(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "docker.io", "docker-compose",
            "debootstrap"], env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, timeout=1200)
        steps.notes.append(f"installed from Debian: docker.io docker-compose debootstrap (missing: {missing})")


def daemon_up() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0


def ensure_daemon(steps: Steps) -> subprocess.Popen | None:
    """Returns the dockerd process this test started, or None if one was running already."""
    if daemon_up():
        steps.notes.append("Docker daemon: already running")
        return None
    for driver in ("overlay2", "vfs"):
        log = open(f"/tmp/specdec-dockerd-{driver}.log", "wb")
        proc = subprocess.Popen(["dockerd", f"--storage-driver={driver}"], stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        for _ in range(60):
            if proc.poll() is not None or daemon_up():
                break
            time.sleep(1)
        if proc.poll() is None and daemon_up():
            steps.notes.append(f"Docker daemon: started by this test (storage driver {driver})")
            return proc
        stop_daemon(proc)
    raise StackError("dockerd does not start with overlay2 or vfs; see /tmp/specdec-dockerd-*.log")


def stop_daemon(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


# ---------------------------------------------------------------------------------------------------
# 3-5 bases, wheelhouse, image
# ---------------------------------------------------------------------------------------------------
def bases(steps: Steps, force_local: bool) -> tuple[str, str]:
    """(python base, postgres image): public ones if they can be pulled, else local stand-ins."""
    if not force_local:
        pulled = [sh(["docker", "pull", "-q", img], check=False, timeout=900).returncode == 0 for img in PUBLIC_BASES]
        if all(pulled):
            steps.notes.append(f"bases: public {PUBLIC_BASES[0]}, {PUBLIC_BASES[1]} (pulled)")
            return PUBLIC_BASES
    sh(["sh", str(DOCKER_DIR / "local_bases.sh")], timeout=1800, quiet=False)
    steps.notes.append(f"bases: local stand-ins {LOCAL_BASES[0]}, {LOCAL_BASES[1]} (docker/local_bases.sh; "
                       "no registry reachable)" if not force_local else "bases: local stand-ins (--local-bases)")
    return LOCAL_BASES


def wheelhouse(steps: Steps, python_base: str) -> Path:
    """Download the CPU torch wheel and all dependencies with this machine's pip configuration, for the
    exact Python of ``python_base`` (markers such as ``python_full_version < "3.11.3"`` differ between
    Debian's 3.11.2 and the public image's 3.11.x). Platform: this machine's (Linux x86_64, glibc 2.36
    here, as in both bookworm bases)."""
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    torch_pin = next(d for d in _dependencies() if d.replace(" ", "").startswith("torch=="))
    version = sh(["docker", "run", "--rm", "--entrypoint", "python3", python_base, "-c",
                  "import platform; print(platform.python_version())"]).stdout.strip()
    sh([sys.executable, "-m", "pip", "download", "-q", "--dest", str(WHEELHOUSE), "--python-version", version,
        "--only-binary", ":all:", torch_pin, *[d for d in _dependencies() if d != torch_pin], "setuptools>=68", "wheel"], timeout=1800)
    for _ in range(5):  # pip evaluates markers for this interpreter, not --python-version: add the rest
        extra = _marker_gaps(WHEELHOUSE, version)
        if not extra:
            break
        steps.notes.append(f"wheelhouse: added for Python {version}: {', '.join(extra)}")
        sh([sys.executable, "-m", "pip", "download", "-q", "--dest", str(WHEELHOUSE), "--python-version", version,
            "--only-binary", ":all:", *extra], timeout=900)
    sdists = [p.name for p in WHEELHOUSE.iterdir() if not p.name.endswith(".whl")]
    if sdists:
        raise StackError(f"the offline build needs wheels only; got source archives {sdists}")
    names = [p.name for p in WHEELHOUSE.glob("*.whl")]
    torch = [n for n in names if n.startswith("torch-")]
    cuda = [n for n in names if n.startswith(("nvidia_", "nvidia-", "triton-"))
            or (n.startswith("torch-") and "+cpu" not in n)]
    if cuda or not torch:
        raise StackError(f"wheelhouse must hold the CPU torch wheel and no CUDA wheels; torch: {torch}, "
                         f"CUDA: {cuda}. Put torch-<v>+cpu-*.whl in pip's find-links (see `pip config list`).")
    steps.notes.append(f"wheelhouse: {len(names)} wheels, {sum(p.stat().st_size for p in WHEELHOUSE.glob('*.whl')) / 2**20:.0f} MiB, "
                       f"{', '.join(torch)}")
    return WHEELHOUSE


def _marker_gaps(wheels: Path, version: str) -> list[str]:
    """Requirements of the wheels in ``wheels`` whose environment marker holds for Python ``version`` but
    not for this interpreter (e.g. redis's ``async-timeout; python_full_version < "3.11.3"``) and that no
    wheel there provides. Markers on extras are left out (pip resolved extras here already)."""
    import zipfile

    try:
        from packaging.markers import default_environment
        from packaging.requirements import Requirement
    except ImportError:  # pip's copy
        from pip._vendor.packaging.markers import default_environment
        from pip._vendor.packaging.requirements import Requirement

    norm = lambda n: n.lower().replace("_", "-").replace(".", "-")  # noqa: E731
    host = default_environment()
    target = {**host, "python_full_version": version, "python_version": ".".join(version.split(".")[:2])}
    have = {norm(w.name.split("-")[0]) for w in wheels.glob("*.whl")}
    need = set()
    for whl in wheels.glob("*.whl"):
        with zipfile.ZipFile(whl) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            lines = z.read(meta).decode(errors="replace").splitlines()
        for line in lines:
            if not line.startswith("Requires-Dist:"):
                continue
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is None or "extra" in str(req.marker) or norm(req.name) in have:
                continue
            if req.marker.evaluate(target) and not req.marker.evaluate(host):
                need.add(f"{req.name}{req.specifier}")
    return sorted(need)


def _dependencies() -> list[str]:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # noqa: D102 (no per-request lines)
        pass


def build_image(steps: Steps, python_base: str, wheels: Path) -> None:
    port = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port),
                                             functools.partial(_QuietHandler, directory=str(wheels)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        sh(["docker", "build", "--network", "host", "-f", "docker/Dockerfile.cpu", "-t", IMAGE,
            "--build-arg", f"PYTHON_BASE_IMAGE={python_base}",
            "--build-arg", f"PIP_FIND_LINKS=http://127.0.0.1:{port}/", "--build-arg", "PIP_NO_INDEX=1", "."],
           timeout=3600)
    finally:
        server.shutdown()
    size = sh(["docker", "image", "inspect", "-f", "{{.Size}}", IMAGE]).stdout.strip()
    steps.notes.append(f"image {IMAGE}: {int(size) / 2**30:.2f} GiB (base {python_base})")


# ---------------------------------------------------------------------------------------------------
# 6 up, 7 scenario, 8 down
# ---------------------------------------------------------------------------------------------------
class Receiver(http.server.BaseHTTPRequestHandler):
    """Alert webhook endpoint on the host: stores every POST body, answers 200."""

    bodies: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server API)
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            Receiver.bodies.append(json.loads(raw))
        except ValueError:
            Receiver.bodies.append({"unparsed": raw.decode(errors="replace")})
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:  # noqa: D102
        pass


class Stack:
    def __init__(self, postgres_image: str, python_base: str, receiver_port: int) -> None:
        self.ports = {"mlflow": free_port(), "prefect": free_port()}
        self.env = {**os.environ, "COMPOSE_PROJECT_NAME": PROJECT, "POSTGRES_PASSWORD": secrets.token_hex(16),
                    "POSTGRES_IMAGE": postgres_image, "SPECDEC_PYTHON_BASE_IMAGE": python_base,
                    "SPECDEC_IMAGE": IMAGE, "MLFLOW_PORT": str(self.ports["mlflow"]),
                    "PREFECT_PORT": str(self.ports["prefect"]),
                    "PREFECT_UI_API_URL": f"http://localhost:{self.ports['prefect']}/api",
                    "SPECDEC_ALERT_CHANNELS": json.dumps([{"type": "webhook", "name": "stack-test",
                                                           "url": f"http://host.docker.internal:{receiver_port}/hook"}])}
        self.compose = ["docker-compose", "-p", PROJECT, "-f", "docker/compose.yaml", "-f",
                        "docker/stack-test.override.yaml", "--env-file", "docker/.env.example"]
        self.mlflow = f"http://127.0.0.1:{self.ports['mlflow']}"
        self.prefect = f"http://127.0.0.1:{self.ports['prefect']}/api"

    def dc(self, *args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess:
        return sh([*self.compose, *args], env=self.env, timeout=timeout, check=check)

    def container(self, service: str) -> str:
        return self.dc("ps", "-q", service).stdout.strip()

    def up(self) -> None:
        self.dc("up", "-d", "--no-build", *SERVICES, timeout=1200)
        deadline = time.monotonic() + 600
        while True:
            states = {s: json.loads(sh(["docker", "inspect", "-f", "{{json .State}}", self.container(s)]).stdout)
                      for s in SERVICES}
            bad = [s for s, st in states.items() if s != "deploy" and (st.get("Health") or {}).get("Status") != "healthy"]
            deploy = states["deploy"]
            if deploy["Status"] == "exited" and deploy["ExitCode"] != 0:
                raise StackError(f"deploy exited {deploy['ExitCode']}:\n{self.dc('logs', '--no-color', 'deploy').stdout[-3000:]}")
            if not bad and deploy["Status"] == "exited":
                return
            if time.monotonic() > deadline:
                raise StackError(f"not healthy after 600 s: {bad}; deploy {deploy['Status']}")
            time.sleep(3)

    def worker(self, *cmd: str, timeout: float = 600) -> str:
        return self.dc("exec", "-T", "worker", *cmd, timeout=timeout).stdout

    def psql(self, sql: str) -> list[list[str]]:
        out = self.dc("exec", "-T", "postgres", "psql", "-U", "specdec", "-d", "specdec", "-At", "-F", "\t",
                      "-c", sql).stdout
        return [line.split("\t") for line in out.splitlines() if line]

    def down(self) -> None:
        self.dc("down", "-v", "--remove-orphans", "--timeout", "20", timeout=600, check=False)

    def log_summary(self) -> list[str]:
        out = []
        for s in SERVICES:
            text = self.dc("logs", "--no-color", s, check=False).stdout
            lines = text.splitlines()
            errors = [ln for ln in lines if any(w in ln for w in ("ERROR", "Traceback", "CRITICAL"))]
            out.append(f"| {s} | {len(lines)} | {len(errors)} | {_cell(errors[0] if errors else '')} |")
        return out


def _cell(s: str) -> str:
    s = s.split("|", 1)[-1].strip().replace("|", "/")
    return (s[:140] + "…") if len(s) > 140 else s


SETUP = f"""
import json, pathlib
from specdec.testing import save_tiny_checkpoint
d = pathlib.Path({DATA!r}); d.mkdir(parents=True, exist_ok=True)
save_tiny_checkpoint(d / "target", seed=0, hidden_size=64)
save_tiny_checkpoint(d / "draft", seed=1, hidden_size=64)   # unrelated weights: acceptance far below 0.40
rows = [dict(id=f"p{{i}}", category=["chat", "code"][i % 2],
             prompt=f"Question {{i}}: tell me about the {{['sea', 'sky', 'land'][i % 3]}} and count to {{i + 3}}.")
        for i in range(12)]
(d / "heldout.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in rows))
"""


def scenario(steps: Steps, st: Stack) -> None:
    steps.run("register tiny pair through the MLflow server", lambda: (
        st.worker("python", "-c", SETUP),
        st.worker("specdec", "pair", "register", "--target", f"{DATA}/target", "--draft", f"model:{DATA}/draft",
                  "--name", PAIR, "--target-name", "stack-target", "--draft-name", "stack-draft",
                  "--max-new-tokens", "24")))
    deps = http_json(f"{st.prefect}/deployments/filter",
                     {"deployments": {"name": {"any_": ["nightly-validation"]}}})
    steps.check(len(deps) == 1 and deps[0]["work_pool_name"] == "cpu-pool",
                "deploy registered nightly-validation in cpu-pool")
    run = http_json(f"{st.prefect}/deployments/{deps[0]['id']}/create_flow_run",
                    {"parameters": {"heldout": f"{DATA}/heldout.jsonl", "limit": None, "device": "cpu"}})

    def wait_flow_run() -> dict:
        deadline = time.monotonic() + 1200
        while time.monotonic() < deadline:
            fr = http_json(f"{st.prefect}/flow_runs/{run['id']}")
            if fr["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
                return fr
            time.sleep(5)
        raise StackError("flow run not finished after 1200 s")

    fr = steps.run("nightly flow run (Prefect API -> worker)", wait_flow_run)
    if fr["state"]["type"] != "COMPLETED":
        logs = http_json(f"{st.prefect}/logs/filter", {"logs": {"flow_run_id": {"any_": [run["id"]]}}, "limit": 200})
        print("\n".join(f"{lg['level']} {lg['message']}" for lg in logs)[-6000:])
    steps.check(fr["state"]["type"] == "COMPLETED", f"flow run {fr['name']} COMPLETED (was {fr['state']['type']})")
    steps.notes.append(f"flow run {fr['name']}: {fr.get('total_run_time', 0):.0f} s run time in the worker")

    exp = http_json(f"{st.mlflow}/api/2.0/mlflow/experiments/get-by-name?experiment_name=specdec-validation")
    runs = http_json(f"{st.mlflow}/api/2.0/mlflow/runs/search",
                     {"experiment_ids": [exp["experiment"]["experiment_id"]],
                      "filter": f"tags.`specdec.pair` = '{PAIR}'"}).get("runs", [])
    steps.check(len(runs) == 1 and runs[0]["info"]["status"] == "FINISHED", f"one FINISHED MLflow run for {PAIR}")
    mrun = runs[0]
    metrics = {m["key"]: m["value"] for m in mrun["data"].get("metrics", [])}
    acc = metrics.get("acceptance_rate", float("nan"))
    steps.check(acc < 0.40 and metrics.get("num_draft_tokens", 0) >= 200,
                f"MLflow run acceptance_rate {acc:.3f} < 0.40 on {metrics.get('num_draft_tokens', 0):.0f} drafted tokens")
    arts = http_json(f"{st.mlflow}/api/2.0/mlflow/artifacts/list?run_id={mrun['info']['run_id']}")
    steps.check("report.json" in {f["path"] for f in arts.get("files", [])}, "report.json stored through the artifact proxy")

    rows = st.psql("select status, acceptance_rate, mlflow_run_id, mlflow_logged from validation_runs "
                   f"where pair_name = '{PAIR}'")
    steps.check(len(rows) == 1 and rows[0][2] == mrun["info"]["run_id"] and rows[0][3] == "t"
                and abs(float(rows[0][1]) - acc) < 1e-9,
                f"one history row in Postgres: {rows}")

    fires = [b for b in Receiver.bodies if str(b.get("event", "")).startswith("fire")]
    steps.check(len(fires) == 1 and PAIR in json.dumps(fires[0]),
                f"one 'fire' alert received on the host ({len(Receiver.bodies)} webhook call(s))")


def write_report(steps: Steps, ok: bool, error: str | None, total: float, logs: list[str]) -> None:
    docker_v = sh(["docker", "version", "-f", "{{.Server.Version}}"], check=False).stdout.strip()
    compose_v = sh(["docker-compose", "version", "--short"], check=False).stdout.strip()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    lines = [
        "# Docker stack test (`make stack-test`)", "",
        f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC · {'PASSED' if ok else 'FAILED'} · "
        f"total {total / 60:.1f} min", "",
        f"Machine: {os.cpu_count()} CPUs, {mem:.0f} GiB RAM, {platform.platform()}; Docker engine {docker_v}, "
        f"docker-compose {compose_v}.", "",
        "| step | seconds |", "| --- | ---: |",
        *[f"| {n} | {s:.0f} |" for n, s in steps.timings], f"| **total** | **{total:.0f}** |", "",
        "## Checks", "", *[f"- {c}" for c in steps.checks], *([f"- ERROR: {_cell(error)}"] if error else []), "",
        "## Notes", "", *[f"- {n}" for n in steps.notes], "",
        "## Container logs", "", "| service | lines | ERROR/Traceback lines | first such line |",
        "| --- | ---: | ---: | --- |", *logs, "",
    ]
    RESULTS.write_text("\n".join(lines))
    print(f"wrote {RESULTS.relative_to(REPO)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-only", action="store_true", help="stop after building the image")
    ap.add_argument("--keep", action="store_true", help="leave the stack (and a daemon it started) running")
    ap.add_argument("--local-bases", action="store_true", help="skip pulling; use Debian stand-in bases")
    args = ap.parse_args()
    steps, t0, daemon, stack, ok, error, logs = Steps(), time.monotonic(), None, None, False, None, []
    LOG.parent.mkdir(parents=True, exist_ok=True)
    LOG.write_text("")
    print(f"command output: {LOG.relative_to(REPO)}")
    receiver = None
    try:
        steps.run("tools (docker.io, docker-compose, debootstrap)", ensure_tools, steps)
        daemon = steps.run("Docker daemon", ensure_daemon, steps)
        python_base, postgres_image = steps.run("base images", bases, steps, args.local_bases)
        wheels = steps.run("wheelhouse (pip download, CPU torch)", wheelhouse, steps, python_base)
        steps.run(f"build {IMAGE}", build_image, steps, python_base, wheels)
        if args.build_only:
            ok = True
            return 0
        gw = json.loads(sh(["docker", "network", "inspect", "bridge"]).stdout)[0]["IPAM"]["Config"][0]["Gateway"]
        receiver = http.server.ThreadingHTTPServer((gw, 0), Receiver)
        threading.Thread(target=receiver.serve_forever, daemon=True).start()
        stack = Stack(postgres_image, python_base, receiver.server_address[1])
        stack.down()  # leftovers of an interrupted run
        steps.run("compose up (healthy, deploy exited 0)", stack.up)
        steps.check(True, "postgres, mlflow, prefect-server, worker healthy; deploy exited 0")
        scenario(steps, stack)
        ok = True
    except (StackError, subprocess.TimeoutExpired, OSError, ValueError, KeyError) as e:
        error = f"{type(e).__name__}: {e}"
        print(f"STACK TEST FAILED: {error}", file=sys.stderr)
    finally:
        if stack is not None:
            logs = stack.log_summary()
            if not args.keep:
                steps.run("compose down -v", stack.down)
        if receiver is not None:
            receiver.shutdown()
        if not args.keep:
            stop_daemon(daemon)
        if not args.build_only:
            write_report(steps, ok, error, time.monotonic() - t0, logs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
