#!/usr/bin/env python3
"""Build the docker stack's images on this machine: the first half of ``make stack-test``.

Steps (each timed, for ``benchmarks/results/stack.md``):

1. tools: ``docker``, ``dockerd``, ``docker-compose``, ``debootstrap``; as root, missing ones are installed
   from Debian (``docker.io docker-compose debootstrap``).
2. daemon: a running Docker daemon is used as it is; otherwise ``dockerd`` is started (overlay2, else
   vfs); the caller stops it again.
3. bases: ``python:3.11-slim-bookworm`` and ``postgres:16`` are pulled; where no registry answers,
   ``docker/local_bases.sh`` builds stand-ins from Debian packages (PostgreSQL 15).
4. wheelhouse: ``pip download`` of the CPU torch wheel and every dependency into
   ``.specdec/docker/wheelhouse`` with this machine's pip settings, for the base image's exact Python;
   refused if a CUDA wheel got in. Reused while pyproject's dependencies and that Python stay the same.
5. image: ``docker build`` of ``docker/Dockerfile.cpu`` (``specdec:cpu``), offline, with the wheelhouse
   served on 127.0.0.1 (``--network host``, ``PIP_FIND_LINKS``, ``PIP_NO_INDEX=1``).

Standard library only (system ``python3``). As a script: ``python3 docker/stack_build.py [--local-bases]``
builds the images and leaves a daemon it started running; then ``docker-compose ... up -d`` without
``--build`` (docker/README.md, "Without Docker Hub").
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCKER_DIR = REPO / "docker"
WHEELHOUSE = REPO / ".specdec" / "docker" / "wheelhouse"
LOG = REPO / ".specdec" / "docker" / "stack-test.log"  # every command's output, this run
IMAGE = "specdec:cpu"
PUBLIC_BASES = ("python:3.11-slim-bookworm", "postgres:16")
LOCAL_BASES = ("specdec-local/python:3.11-bookworm", "specdec-local/postgres:15-bookworm")


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
    stamp, key = WHEELHOUSE / ".complete", json.dumps([version, _dependencies()])
    if stamp.exists() and stamp.read_text() == key:
        steps.notes.append(f"wheelhouse: reused {WHEELHOUSE.relative_to(REPO)} (same dependencies, Python {version})")
        return WHEELHOUSE
    stamp.unlink(missing_ok=True)
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
    stamp.write_text(key)
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
    """``docker build`` of Dockerfile.cpu from the wheelhouse, served on 127.0.0.1. The port is fixed
    (``SPECDEC_WHEELHOUSE_PORT``, default 38917) because the legacy builder keys its layer cache on
    build-arg values: a new URL each run would rebuild every layer."""
    port = int(os.environ.get("SPECDEC_WHEELHOUSE_PORT", "38917"))
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




def build_all(steps: Steps, local_bases: bool) -> tuple[subprocess.Popen | None, str, str]:
    """Steps 1-5. Returns (dockerd this call started or None, python base, postgres image)."""
    steps.run("tools (docker.io, docker-compose, debootstrap)", ensure_tools, steps)
    daemon = steps.run("Docker daemon", ensure_daemon, steps)
    try:
        python_base, postgres_image = steps.run("base images", bases, steps, local_bases)
        wheels = steps.run("wheelhouse (pip download, CPU torch)", wheelhouse, steps, python_base)
        steps.run(f"build {IMAGE}", build_image, steps, python_base, wheels)
    except BaseException:
        stop_daemon(daemon)
        raise
    return daemon, python_base, postgres_image


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--local-bases", action="store_true", help="skip pulling; use Debian stand-in bases")
    args = ap.parse_args()
    LOG.parent.mkdir(parents=True, exist_ok=True)
    LOG.write_text("")
    steps = Steps()
    try:
        _, python_base, postgres_image = build_all(steps, args.local_bases)
    except StackError as e:
        print(f"BUILD FAILED: {e}", file=sys.stderr)
        return 1
    print("\n".join(steps.notes))
    print(f"compose settings: SPECDEC_PYTHON_BASE_IMAGE={python_base} POSTGRES_IMAGE={postgres_image}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
