"""Session fixtures shared by every vLLM test: one engine per configuration for the whole session (a vLLM start
takes a minute or more on 2 cores), the real pair as the core loads it, short held-out prompts, and the serving
configs ``pair show`` prints for the real pair (registered in a throwaway MLflow SQLite store).

Every fixture skips with one line where vLLM is not installed (:func:`tests.support.vllm.vllm_or_skip`).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time

import pytest
import torch

from tests.support.vllm import K, draft_dir, eagle3_head_dir, engine_args, engines_dir, target_dir, vllm_or_skip
from tests.support.gate import policy_gate
from tests.support.store import model_store
from tests.support.registry import open_registry_at

def SERVE_DIR(tmp) -> "os.PathLike":  # noqa: N802 - the directory the printed commands run in (vllm serve's cwd)
    d = tmp / "serve"
    d.mkdir(exist_ok=True)
    return d


#: wall seconds of each engine start in this session (printed at the end: the vLLM test cost)
STARTS: dict[str, float] = {}


@pytest.fixture(scope="session")
def vllm_install():
    return vllm_or_skip()


@pytest.fixture(scope="session")
def real_pair(vllm_install):
    """(target LoadedModel, draft LoadedModel): SmolLM2-135M-Instruct fp32 and its bf16 copy, loaded in fp32."""
    from specdec.models import load_causal_lm

    torch.set_num_threads(1)
    return load_causal_lm(str(target_dir()), dtype="float32",
                          store=model_store()), load_causal_lm(str(draft_dir()), dtype="float32", store=model_store())


@pytest.fixture(scope="session")
def short_heldout(tmp_path_factory):
    """The shortest Spec-Bench prompt of each category (6 prompts): the vLLM tests stay cheap."""
    from specdec.validation.heldout import load_heldout

    full = load_heldout("spec_bench")
    by_cat: dict[str, list] = {}
    for p in sorted(full.prompts, key=lambda p: len(json.dumps(p.canonical()))):
        by_cat.setdefault(p.category, []).append(p)
    path = tmp_path_factory.mktemp("heldout") / "short.jsonl"
    path.write_text("".join(json.dumps(ps[0].canonical()) + "\n" for ps in by_cat.values()))
    return load_heldout(path)


@pytest.fixture(scope="session")
def printed_configs(vllm_install, tmp_path_factory):
    """``{"draft_model": cfg, "ngram": cfg, "eagle3": cfg}``: the ``serving_config`` that ``specdec pair show --json``
    prints for the real target registered with the bf16 draft, the n-gram drafter and an EAGLE-3 head, each after a
    logged validation."""
    from typer.testing import CliRunner

    import registry as R
    from specdec.cli import app
    from tests.support.mlflow_server import sqlite_store
    from tests.support.reports import tiny_report

    tmp = tmp_path_factory.mktemp("registry")
    env = {"SPECDEC_TRACKING_URI": sqlite_store(tmp / "store"), "SPECDEC_HOME": str(tmp / "home"),
           "SPECDEC_MODELS_DIR": str(target_dir().parent.parent), "COLUMNS": "250"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        runner, out = CliRunner(), {}
        for name, draft, kind, ref, recipe in (
                ("smol-bf16", str(draft_dir()), "model", str(draft_dir()), None),
                ("smol-ngram", "ngram", "ngram", "ngram", {"max_ngram": 3, "min_ngram": 2}),
                ("smol-eagle3", f"eagle3:{eagle3_head_dir()}", "eagle3", str(eagle3_head_dir()), None)):
            r = runner.invoke(app, ["pair", "register", "--target", str(target_dir()), "--draft", draft, "-k", str(K),
                                    "--name", name], catch_exceptions=False)
            assert r.exit_code == 0, r.output
            rep = tiny_report(0.6, num_speculative_tokens=K)
            rep.drafter_kind, rep.drafter_ref, rep.drafter_recipe = kind, ref, recipe
            R.log_validation(name, "1", rep, tmp / f"rep-{name}", gate=policy_gate(), registry=open_registry_at())
            shown = runner.invoke(app, ["pair", "show", name, "1", "--json"], catch_exceptions=False)
            assert shown.exit_code == 0, shown.output
            cfg = json.loads(shown.stdout)["serving_config"]
            for cmd in cfg.get("download", []):  # what pair show says to run first (a head stored in MLflow)
                argv = shlex.split(cmd)
                assert argv[0] == "mlflow", cmd
                r = subprocess.run([sys.executable, "-m", "mlflow", *argv[1:]], cwd=SERVE_DIR(tmp),
                                   env={**os.environ, "MLFLOW_TRACKING_URI": env["SPECDEC_TRACKING_URI"]},
                                   capture_output=True, text=True, timeout=600)
                assert r.returncode == 0, r.stderr[-2000:]
            out[cfg["speculative_config"]["method"]] = cfg
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    out["cwd"] = SERVE_DIR(tmp)
    return out


def _serve(name: str, spec: dict, log_dir, cwd=None):
    from specdec.engines.vllm_server import VllmServer

    t0 = time.monotonic()
    server = VllmServer(engine_args(spec), log_dir / f"vllm-serve-{name}.log", engines_dir=engines_dir(), cwd=cwd).start()
    STARTS[f"vllm serve {name}"] = time.monotonic() - t0
    return server


@pytest.fixture(scope="session")
def serve_draft(printed_configs, tmp_path_factory):
    """``vllm serve`` of the real target with exactly the draft_model ``--speculative-config`` pair show prints."""
    server = _serve("draft_model", printed_configs["draft_model"]["speculative_config"], tmp_path_factory.mktemp("vllm"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def serve_ngram(printed_configs, tmp_path_factory):
    """``vllm serve`` of the real target with exactly the ngram ``--speculative-config`` pair show prints."""
    server = _serve("ngram", printed_configs["ngram"]["speculative_config"], tmp_path_factory.mktemp("vllm"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def serve_eagle3(printed_configs, tmp_path_factory):
    """``vllm serve`` of the real target with exactly the eagle3 ``--speculative-config`` pair show prints."""
    server = _serve("eagle3", printed_configs["eagle3"]["speculative_config"], tmp_path_factory.mktemp("vllm"),
                    cwd=printed_configs["cwd"])  # its model is the directory the printed download command wrote
    yield server
    server.stop()


def pytest_terminal_summary(terminalreporter):
    if STARTS:
        terminalreporter.write_line("vLLM engine starts: " + ", ".join(f"{k} {v:.0f} s" for k, v in STARTS.items()))
