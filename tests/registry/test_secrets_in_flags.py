"""No credential the user gives reaches a terminal, a log, MLflow or the history (issue 43, item 7).

Real commands as processes against a real ``mlflow server`` reached through a tracking URI with a
password (``http://alice:PASSWORD@127.0.0.1:port``; the server has no auth, so the URI works):

- MLflow's own "View run NAME at: http://alice:PASSWORD@..." lines (6 from ``pair register``, 2 from
  ``nightly run`` before) reach no terminal;
- ``pair engine --url http://bob:PASSWORD@host`` printed the password and stored it in the MLflow tag;
- ``--api-key KEY`` inside ``pair engine --flags`` was stored in MLflow (and in every night's history row).

Afterwards every secret is searched for, byte for byte, in what each command printed, in every file under
``SPECDEC_HOME`` (logs, history DB) and the MLflow server's directory (backend store, artifacts, log).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.registry.test_store import mlflow_server  # noqa: F401 (fixture: a real `mlflow server`)
from tests.support.models import save_tiny_checkpoint

pytestmark = pytest.mark.server
PASSWORD, URL_PASSWORD, API_KEY = "TRACKPW5c1e", "ENGINEPW77ab", "APIKEY0d9e3"
SECRETS = (PASSWORD, URL_PASSWORD, API_KEY)
PAIR = "secret-pair"


def _run(args: list[str], home: Path, uri: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "SPECDEC_"))}
    env.update({"SPECDEC_HOME": str(home), "PREFECT_HOME": str(home / "prefect"), "MLFLOW_TRACKING_URI": uri,
                "COLUMNS": "200", "HF_HUB_OFFLINE": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "DO_NOT_TRACK": "true", "MLFLOW_DISABLE_TELEMETRY": "true"})
    p = subprocess.run([sys.executable, "-m", "specdec.cli", *args], capture_output=True, text=True, env=env,
                       timeout=900)
    said = p.stdout + p.stderr
    assert "Traceback" not in said, said[-3000:]
    for s in SECRETS:
        assert s not in said, f"{' '.join(args[:2])} printed {s}:\n{said[-3000:]}"
    return said if p.returncode == 0 or args[0] == "nightly" else pytest.fail(f"{args}: exit {p.returncode}\n{said[-3000:]}")


def _files_with(secret: str, *roots: Path) -> list[str]:
    return [str(p) for root in roots for p in root.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def test_no_credential_from_a_url_or_a_flag_reaches_a_terminal_mlflow_or_the_history(tmp_path, mlflow_server):  # noqa: F811
    mlflow = mlflow_server
    home = tmp_path / "home"
    uri = mlflow.uri.replace("://", f"://alice:{PASSWORD}@", 1)
    ckpt = save_tiny_checkpoint(tmp_path / "tiny")
    rows = [{"id": f"p{i}", "category": "a", "prompt": f"abc abc abc {i} abc abc"} for i in range(2)]
    (tmp_path / "h.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")

    said = _run(["pair", "register", "--target", str(ckpt), "--draft", "ngram:3:1", "--name", PAIR,
                 "--max-new-tokens", "8"], home, uri)
    assert "registered" in said
    said = _run(["pair", "engine", PAIR, "1", "--url", f"http://bob:{URL_PASSWORD}@127.0.0.1:9",
                 "--flags", f"VLLM_API_KEY={API_KEY} llama-server -m t.gguf --API_KEY={API_KEY} --api-key {API_KEY} "
                            "--port 9"], home, uri)
    assert "http://127.0.0.1:9" in said and "not stored" in said, said  # the user is told what was left out

    from mlflow import MlflowClient

    tags = MlflowClient(mlflow.uri).get_model_version(PAIR, "1").tags
    assert tags["engine_url"] == "http://127.0.0.1:9", tags
    assert json.loads(tags["engine_flags"]) == ["VLLM_API_KEY=***", "llama-server", "-m", "t.gguf", "--API_KEY=***",
                                                "--api-key", "***", "--port", "9"]

    # a night (the engine is down: its row is an error, with no secret in it either)
    _run(["nightly", "run", "--pair", PAIR, "--alias", "challenger", "--heldout", str(tmp_path / "h.jsonl"),
          "--device", "cpu"], home, uri)
    for s in SECRETS:
        assert _files_with(s, home, mlflow.directory) == [], s


def test_flags_tagged_before_the_fix_are_redacted_before_they_reach_the_history():
    """An ``engine_flags`` tag written by an older ``pair engine`` (or by hand in the UI) still holds the
    key: the nightly's engine step reads it redacted, so the history row's fingerprint never holds it."""
    from flows.engine_check import engine_endpoint
    from registry.pairs import PairVersion

    pv = PairVersion.__new__(PairVersion)
    pv.tags = {"engine_url": "http://127.0.0.1:9",
               "engine_flags": json.dumps(["vllm", "serve", "m", "--api-key=" + API_KEY, "--hf-token", API_KEY])}
    flags = engine_endpoint(pv, api_key=None).flags
    assert API_KEY not in json.dumps(flags) and flags == ("vllm", "serve", "m", "--api-key=***", "--hf-token", "***")
