"""First use of the engine check through a real ``specdec nightly run`` process (issue 43, item 8).

A GGUF pair registered for llama.cpp, a real ``llama-server`` serving it, ``pair engine`` naming it, then the
night. Before: the night exited 1 on every such night and said "recorded in the history ... but not logged
to MLflow (reason in the log)" with no reason in the log, because the engine row never got an MLflow run.
Now a healthy pair's night exits 0 and the engine check is its own MLflow run (experiment
``specdec-engine-checks``) with ``engine_check.json`` as its evidence and its figures as metrics.
Skipped with one line where the engine is not built (tests/support/engine.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from specdec.engines.llama_server import LlamaServerFlags
from specdec.settings import get_settings
from specdec.validation.heldout import load_heldout
from tests.support.engine import draft_gguf, engine_or_skip, start_server, target_gguf
from tests.support.mlflow_server import sqlite_store

pytestmark = [pytest.mark.slow, pytest.mark.server]
K = 4


def _specdec(args: list[str], env: dict) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "specdec.cli", *args], env=env, capture_output=True, text=True,
                       timeout=1200)
    assert "Traceback" not in p.stdout + p.stderr, (p.stdout + p.stderr)[-3000:]
    return p


def test_a_healthy_pair_with_an_engine_endpoint_exits_0_and_logs_the_engine_run(tmp_path):
    engine = engine_or_skip()
    t_gguf, d_gguf = target_gguf(), draft_gguf(engine, "Q8_0")
    full = load_heldout("spec_bench")
    short = sorted(full.prompts, key=lambda p: len(json.dumps(p.canonical())))[:4]
    (tmp_path / "short.jsonl").write_text("".join(json.dumps(p.canonical()) + "\n" for p in short))
    uri = sqlite_store(tmp_path / "store")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "SPECDEC_"))}
    env.update({"SPECDEC_HOME": str(tmp_path / "home"), "SPECDEC_TRACKING_URI": uri, "HF_HUB_OFFLINE": "1",
                "COLUMNS": "200", "SPECDEC_MODELS_DIR": str(get_settings().models_dir),  # reuse the GGUF conversions
                "SPECDEC_ENGINES_DIR": os.environ.get("SPECDEC_ENGINES_DIR", ""),
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "true"})
    env = {k: v for k, v in env.items() if v}
    p = _specdec(["pair", "register", "--target", str(t_gguf), "--draft", str(d_gguf), "--engine", "llamacpp",
                  "-k", str(K), "--max-new-tokens", "16", "--name", "smol-gguf"], env)
    assert p.returncode == 0, p.stdout + p.stderr
    flags = LlamaServerFlags(model=str(t_gguf), draft=str(d_gguf), n_max=K, ctx_size=2048, threads=1)
    with start_server(engine, flags, tmp_path) as server:
        p = _specdec(["pair", "engine", "smol-gguf", "1", "--url", server.url, "--flags", " ".join(server.command)], env)
        assert p.returncode == 0, p.stdout + p.stderr
        night = _specdec(["nightly", "run", "--pair", "smol-gguf", "--alias", "challenger", "--heldout",
                          str(tmp_path / "short.jsonl"), "--device", "cpu"], env)
    said = night.stdout + night.stderr
    assert "not logged to MLflow" not in said, said[-3000:]
    assert night.returncode == 0, said[-3000:]
    assert "engine:llamacpp" in said  # the engine row is in the night's table

    from mlflow import MlflowClient

    c = MlflowClient(uri)
    exp = c.get_experiment_by_name("specdec-engine-checks")
    [run] = c.search_runs([exp.experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["specdec.source"] == "engine:llamacpp"
    assert 0 <= run.data.metrics["engine_acceptance_rate"] <= 1
    assert [a.path for a in c.list_artifacts(run.info.run_id)] == ["engine_check.json"]
