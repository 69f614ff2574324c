#!/usr/bin/env python3
"""The docker stack, end to end, on this machine (``make stack-test``; not part of ``make test``).

Steps (each timed):

1-5. ``docker/stack_build.py``: Debian tools if missing (as root), ``dockerd`` if none runs (stopped
   again at the end), public or local stand-in bases, a wheelhouse with the CPU torch wheel, and an
   offline ``docker build`` of ``specdec:cpu``.
6. up: ``docker-compose -p specdec-stacktest -f docker/compose.yaml -f docker/stack-test.override.yaml
   up -d`` (Postgres, MLflow server, Prefect server, deploy, CPU worker); waits for health and deploy's
   exit 0. Ports are free ones on 127.0.0.1; the password is random; alerts go to a webhook receiver
   on the host.
7. scenario: both UIs serve HTML. In the worker container a tiny random target and an unrelated tiny
   random draft are saved and registered as ``specdec-pair`` through the MLflow server (``specdec pair
   register``); the ``nightly-validation`` deployment is run through the Prefect API on a 12-prompt
   held-out file and waited for. Checks: the flow run COMPLETED; one FINISHED MLflow run for the pair
   with ``acceptance_rate`` < 0.40 and ``report.json`` among its artifacts; one history row in Postgres
   (``validation_runs``) with the same acceptance rate and MLflow run id; exactly one ``fire`` alert
   received on the host.
8. down: logs summarized, ``docker-compose down -v`` (containers, network, volumes).

Timings, checks and the log summary go to ``benchmarks/results/stack.md``. Exit status 0 only if every
check passed. Standard library only (runs with the system ``python3``; no project venv needed).

Usage: ``python3 docker/stack_test.py [--keep] [--local-bases]``; ``SPECDEC_COMPOSE`` picks the Compose CLI
(default ``docker-compose``; ``"docker compose"`` for the v2 plugin), ``SPECDEC_STACK_RESULTS`` the results
file (default ``benchmarks/results/stack.md``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.server
import json
import os
import platform
import secrets
import shlex
import socket
import subprocess
import sys
import threading
import time
import urllib.request

from stack_build import IMAGE, LOG, REPO, Steps, StackError, build_all, sh, stop_daemon

RESULTS = REPO / "benchmarks" / "results" / "stack.md"
PROJECT = "specdec-stacktest"
SERVICES = ("postgres", "mlflow", "prefect-server", "deploy", "worker")
PAIR = "specdec-pair"
DATA = "/data/specdec/stack-test"  # in the worker's specdec-data volume
# The Compose CLI: Debian's docker-compose 1.29 by default; e.g. SPECDEC_COMPOSE="docker compose" for v2.
COMPOSE = shlex.split(os.environ.get("SPECDEC_COMPOSE", "docker-compose"))
RESULTS = REPO / os.environ.get("SPECDEC_STACK_RESULTS", str(RESULTS.relative_to(REPO)))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url: str, body: dict | None = None, timeout: float = 30) -> object:
    """GET (``body`` None) or POST JSON; returns the decoded JSON answer."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"null")


def host_gateway() -> str:
    """The host's address on Docker's default bridge (what ``host-gateway`` resolves to in a container)."""
    ipam = json.loads(sh(["docker", "network", "inspect", "bridge"]).stdout)[0]["IPAM"]["Config"]
    if ipam and ipam[0].get("Gateway"):
        return ipam[0]["Gateway"]
    out = sh(["ip", "-4", "-o", "addr", "show", "dev", "docker0"]).stdout.split()
    return out[out.index("inet") + 1].split("/")[0]


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
        self.compose = [*COMPOSE, "-p", PROJECT, "-f", "docker/compose.yaml", "-f",
                        "docker/stack-test.override.yaml", "--env-file", "docker/.env.example"]
        self.mlflow = f"http://127.0.0.1:{self.ports['mlflow']}"
        self.prefect = f"http://127.0.0.1:{self.ports['prefect']}/api"

    def dc(self, *args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess:
        return sh([*self.compose, *args], env=self.env, timeout=timeout, check=check)

    def container(self, service: str) -> str:
        return self.dc("ps", "-a", "-q", service).stdout.strip()  # -a: v2 lists exited ones only so

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


# The image does not ship tests/: the worker runs the tiny-model helpers' source (which imports nothing from
# this repository) followed by the setup below.
SETUP = (REPO / "tests" / "support" / "models.py").read_text() + f"""
import json, pathlib
d = pathlib.Path({DATA!r}); d.mkdir(parents=True, exist_ok=True)
save_tiny_checkpoint(d / "target", seed=0, hidden_size=64)
save_tiny_checkpoint(d / "draft", seed=1, hidden_size=64)   # unrelated weights: acceptance far below 0.40
rows = [dict(id=f"p{{i}}", category=["chat", "code"][i % 2],
             prompt=f"Question {{i}}: tell me about the {{['sea', 'sky', 'land'][i % 3]}} and count to {{i + 3}}.")
        for i in range(12)]
(d / "heldout.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in rows))
"""


def check_uis(steps: Steps, st: Stack) -> None:
    """The MLflow and Prefect UIs answer on their published ports with an HTML page."""
    for name, url in (("MLflow", st.mlflow + "/"), ("Prefect", st.prefect.removesuffix("/api") + "/")):
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                ok = r.status == 200 and b"<html" in r.read(4096).lower()
        except OSError as e:
            ok, url = False, f"{url} ({e})"
        steps.check(ok, f"{name} UI serves HTML at {url}")


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


def machine_line() -> str:
    """One line about this machine and its Docker (call while the daemon still runs)."""
    docker_v = sh(["docker", "version", "-f", "{{.Server.Version}}"], check=False).stdout.strip()
    driver = sh(["docker", "info", "-f", "{{.Driver}}"], check=False).stdout.strip()
    compose_v = sh([*COMPOSE, "version", "--short"], check=False).stdout.strip()
    commit = sh(["git", "rev-parse", "--short", "HEAD"], check=False).stdout.strip()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"Machine: {os.cpu_count()} CPUs, {mem:.0f} GiB RAM, {platform.platform()}; Docker engine {docker_v} "
            f"({driver}), {' '.join(COMPOSE)} {compose_v}; repository at {commit or '?'}. Load average at the end "
            f"(1/5/15 min): {' / '.join(f'{x:.1f}' for x in os.getloadavg())} (CPUs shared with other work).")


def write_report(steps: Steps, ok: bool, error: str | None, total: float, logs: list[str], machine: str) -> None:
    lines = [
        "# Docker stack test (`make stack-test`)", "",
        "Written by `docker/stack_test.py` (what runs and what is checked: its docstring; every command's "
        "output: `.specdec/docker/stack-test.log`).", "",
        f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC · {'PASSED' if ok else 'FAILED'} · "
        f"total {total / 60:.1f} min", "",
        machine, "",
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
    ap.add_argument("--keep", action="store_true", help="leave the stack (and a daemon it started) running")
    ap.add_argument("--local-bases", action="store_true", help="skip pulling; use Debian stand-in bases")
    args = ap.parse_args()
    steps, t0, daemon, stack, ok, error, logs = Steps(), time.monotonic(), None, None, False, None, []
    LOG.parent.mkdir(parents=True, exist_ok=True)
    LOG.write_text("")
    print(f"command output: {LOG.relative_to(REPO)}")
    receiver = None
    try:
        daemon, python_base, postgres_image = build_all(steps, args.local_bases)
        receiver = http.server.ThreadingHTTPServer((host_gateway(), 0), Receiver)
        threading.Thread(target=receiver.serve_forever, daemon=True).start()
        stack = Stack(postgres_image, python_base, receiver.server_address[1])
        stack.down()  # leftovers of an interrupted run
        steps.run("compose up (healthy, deploy exited 0)", stack.up)
        steps.check(True, "postgres, mlflow, prefect-server, worker healthy; deploy exited 0")
        check_uis(steps, stack)
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
        machine = machine_line()
        if not args.keep:
            stop_daemon(daemon)
        write_report(steps, ok, error, time.monotonic() - t0, logs, machine)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
