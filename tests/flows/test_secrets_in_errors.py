"""No secret anywhere after a malformed URL (issue 25, item 4).

Each case puts a token where a URL's port, password or path goes (alert channel, history DB, MLflow
tracking URI) and runs the real commands as processes: ``specdec nightly run`` (which starts a real
Prefect API on SQLite and talks to a real ``mlflow server``), ``alerts test``, ``history``,
``pair list``. Afterwards the token is searched for, byte for byte, in the terminal output and in
every file the run could write: ``<SPECDEC_HOME>`` (logs, history DB), the Prefect home (its
database) and the MLflow server's directory (backend store, artifacts, server log).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.mlflow_server import MlflowServer

pytestmark = pytest.mark.server
TOKEN = "SECRETTOKEN9f3a"

CHANNEL = "SPECDEC_ALERT_CHANNELS"
CASES = {
    "channel-token-as-port": (CHANNEL, f"https://hooks.slack.com:{TOKEN}/services/T0/B0/x"),
    "channel-token-in-bad-host": (CHANNEL, f"https://{TOKEN}@hooks slack.com/x"),
    "channel-token-in-ipv6": (CHANNEL, f"https://[{TOKEN}/x"),
    "db-token-as-port": ("SPECDEC_DB_URL", f"postgresql://u:{TOKEN}@127.0.0.1:{TOKEN}/x"),
    "db-password-unreachable": ("SPECDEC_DB_URL", f"postgresql://u:{TOKEN}@127.0.0.1:1/x"),
    "tracking-token-as-port": ("SPECDEC_TRACKING_URI", f"http://127.0.0.1:{TOKEN}/x"),
    "tracking-password-unreachable": ("SPECDEC_TRACKING_URI", f"http://u:{TOKEN}@127.0.0.1:1"),
}
NIGHTLY_CASES = ("channel-token-as-port", "db-token-as-port")  # each starts a Prefect API (~40 s)


@pytest.fixture(scope="module")
def mlflow(tmp_path_factory):
    server = MlflowServer(tmp_path_factory.mktemp("mlflow")).start()
    yield server
    server.stop()


def _value(name: str, value: str) -> str:
    return json.dumps([{"type": "slack", "url": value}]) if name == CHANNEL else value


def _run(args: list[str], home: Path, mlflow: MlflowServer, name: str, value: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_TRACKING", "SPECDEC_"))}
    env.update({"SPECDEC_HOME": str(home), "PREFECT_HOME": str(home.parent / "prefect"),
                "MLFLOW_TRACKING_URI": mlflow.uri, "COLUMNS": "200", "HF_HUB_OFFLINE": "1",
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "true"})
    env[name] = _value(name, value)
    return subprocess.run([sys.executable, "-m", "specdec.cli", *args], capture_output=True, text=True, env=env,
                          timeout=400)


def _files_with_token(*roots: Path) -> list[str]:
    hits = []
    for root in roots:
        for p in root.rglob("*") if root.exists() else []:
            if p.is_file():
                try:
                    if TOKEN.encode() in p.read_bytes():
                        hits.append(str(p))
                except OSError:
                    pass
    return hits


@pytest.mark.parametrize("case", sorted(CASES))
def test_no_secret_anywhere_after_a_malformed_url(tmp_path, mlflow, case):
    name, value = CASES[case]
    home = tmp_path / "home"
    commands = [["alerts", "test"], ["history"], ["pair", "list"]]
    if case in NIGHTLY_CASES:
        commands.append(["nightly", "run", "--pair", "no-such-pair", "--alias", "champion", "--device", "cpu"])
    for args in commands:
        p = _run(args, home, mlflow, name, value)
        said = p.stdout + p.stderr
        assert TOKEN not in said, f"{' '.join(args)} printed the token:\n{said[-3000:]}"
        assert "Traceback" not in said, f"{' '.join(args)}:\n{said[-3000:]}"
        if args[0] == "nightly" or (args[0] == "pair") == name.endswith("TRACKING_URI"):
            assert p.returncode != 0, f"{' '.join(args)} exited 0 with a malformed URL:\n{said[-2000:]}"
    assert _files_with_token(home, tmp_path / "prefect", mlflow.directory) == []


def test_no_password_of_the_tracking_uri_in_the_nightly_log_file(tmp_path, mlflow):
    """issue 32, item 6: with ``MLFLOW_TRACKING_URI=http://user:PASSWORD@host:port`` and a reachable
    server, the nightly's log file held ``INFO httpx: HTTP Request: GET http://user:PASSWORD@.../health``
    (a library logger writing the request URL). No logger of any library may write it."""
    from mlflow import MlflowClient

    from registry.pairs import PAIR_MODEL_DESCRIPTION

    home = tmp_path / "home"
    uri = mlflow.uri.replace("://", f"://specdec:{TOKEN}@", 1)
    # a registered pair with no versions: the night gets past the up-front pair check and fails on the alias
    MlflowClient(tracking_uri=mlflow.uri).create_registered_model("empty-pair", description=PAIR_MODEL_DESCRIPTION)
    p = _run(["nightly", "run", "--pair", "empty-pair", "--alias", "champion", "--device", "cpu"], home, mlflow,
             "MLFLOW_TRACKING_URI", uri)
    said = p.stdout + p.stderr
    logs = list((home / "logs").glob("nightly-*.log"))
    assert logs and "empty-pair" in said, said[-3000:]
    assert "HTTP Request" in "".join(q.read_text() for q in logs)  # the library logger did write its lines
    assert TOKEN not in said, said[-3000:]
    assert _files_with_token(home, tmp_path / "prefect") == []
