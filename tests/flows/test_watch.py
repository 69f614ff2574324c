"""``specdec pair watch`` end to end, every piece real: a ``mlflow server`` (SQLite store, webhooks
allowed to http://127.0.0.1), a ``prefect server``, the nightly deployment served by a Prefect runner
(flow runs in their own processes), the watcher CLI as a process, and an HTTP alert receiver.

- registering a version triggers its validation (v1 passes, v2 fails);
- @champion moved by hand to the failing v2: within 2 minutes one watch flow run of v2 and one
  "Ungated promotion" alert with a link to the version;
- a forged signature, a replayed (stale) delivery and a duplicate delivery change nothing;
- with ``--revert``: moving @champion by hand to v1 (passing) resolves the incident; moving it to v2
  again brings it back to v1, and the alert and v2's description say so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from monitoring.receiver import WebhookReceiver
from tests.support.net import free_port
from tests.support.mlflow_server import MlflowServer
from registry.webhooks import sign
from tests.support.models import save_tiny_checkpoint
from tests.support.gate import policy_gate
from tests.support.store import model_store
from tests.support.registry import open_registry_at

pytestmark = pytest.mark.server
REPO = Path(__file__).resolve().parents[2]
PAIR = "watch-pair"
SECRET = "watch-secret-" + uuid.uuid4().hex
DEPLOYMENT = "nightly-validation/nightly-validation"

SERVE = r"""
import json, sys
from flows.nightly import nightly_validation_flow
nightly_validation_flow.serve(name="nightly-validation", parameters=json.loads(sys.argv[1]))
"""


def _wait(pred, timeout: float, what: str, step: float = 1.0, logs: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = pred()
        except httpx.TransportError:  # a server slow to answer on a loaded machine: ask again
            value = None
        if value:
            return value
        time.sleep(step)
    tail = "".join(f"\n--- {p.name}:\n{p.read_text(errors='replace')[-2500:]}" for p in sorted(logs.glob("*.log"))) if logs else ""
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{tail}")


def _proc(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "wb") as f:
        return subprocess.Popen(args, env=env, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, prefect_server):
    tmp = tmp_path_factory.mktemp("watch")
    mp = pytest.MonkeyPatch()
    for k, v in {"MLFLOW_WEBHOOK_ALLOWED_SCHEMES": "http,https", "MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS": "true",
                 "MLFLOW_WEBHOOK_CACHE_TTL": "1", "SPECDEC_HOME": str(tmp / "home")}.items():
        mp.setenv(k, v)
    alerts = WebhookReceiver().start()
    server = MlflowServer(tmp / "mlflow").start()
    mp.setenv("MLFLOW_TRACKING_URI", server.uri)
    mp.delenv("SPECDEC_TRACKING_URI", raising=False)
    rows = [{"id": f"p{i}", "category": ["chat", "code"][i % 2],
             "prompt": f"Question {i}: tell me about the {['sea', 'sky', 'land'][i % 3]} and count to {i + 3}."}
            for i in range(12)]
    (tmp / "heldout.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    env = {**os.environ, "PREFECT_API_URL": prefect_server["api"], "PREFECT_RUNNER_POLL_FREQUENCY": "2",
           "PREFECT_HOME": str(tmp / "prefect-client"), "PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": server.uri,
           "SPECDEC_HOME": str(tmp / "home"), "SPECDEC_WATCH_SECRET": SECRET,
           "SPECDEC_ALERT_CHANNELS": json.dumps([{"type": "webhook", "url": alerts.url("/alerts"), "name": "ops"}])}
    params = {"pairs": [PAIR], "aliases": ["champion", "challenger"], "heldout": str(tmp / "heldout.jsonl"),
              "limit": None, "device": "cpu", "dtype": "float32", "method": "decode", "fail_on_failure": True}
    runner = _proc([sys.executable, "-c", SERVE, json.dumps(params)], env, tmp / "runner.log")
    api = prefect_server["api"]
    # the server is shared with test_server.py, which deploys the same name with other parameters: wait for ours
    served = lambda: any(d["parameters"].get("pairs") == [PAIR]  # noqa: E731
                         for d in httpx.post(f"{api}/deployments/filter", json={}, timeout=30).json())
    _wait(served, 300, "the served deployment")
    state = {"tmp": tmp, "env": env, "server": server, "alerts": alerts, "api": api, "port": free_port(),
             "runner": runner, "watcher": None}
    yield state
    for p in (state["watcher"], runner):
        if p is not None:
            _stop(p)
    server.stop()
    alerts.stop()
    mp.undo()


def _start_watcher(stack, *extra: str) -> None:
    if stack["watcher"] is not None:
        _stop(stack["watcher"])
    port = stack["port"]
    stack["watcher"] = _proc([sys.executable, "-m", "specdec.cli", "pair", "watch", PAIR, "--listen", f"127.0.0.1:{port}",
                              "--deployment", DEPLOYMENT, *extra], stack["env"], stack["tmp"] / f"watcher{len(extra)}.log")

    def up():
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            assert stack["watcher"].poll() is None, (stack["tmp"] / f"watcher{len(extra)}.log").read_text()[-3000:]
            return False

    _wait(up, 120, "the watcher")


def _client(stack):
    from mlflow import MlflowClient

    return MlflowClient(stack["server"].uri, registry_uri=stack["server"].uri)


def _status(stack, version: str) -> str | None:
    return _client(stack).get_model_version(PAIR, version).tags.get("validation_status")


def _flow_runs(stack, prefix: str) -> list[dict]:
    runs = httpx.post(f"{stack['api']}/flow_runs/filter", json={"limit": 200}, timeout=60).json()
    return [r for r in runs if r["name"].startswith(prefix)]


def _ungated(stack) -> list[dict]:
    return [r.body for r in stack["alerts"].accepted if str(r.body.get("title", "")).startswith("Ungated promotion")]


def _register(stack, target: str, draft: str) -> str:
    from registry.register import register_pair_from_refs
    from specdec.core.config import SamplingConfig, SpeculativeConfig

    reg = register_pair_from_refs(target, draft, name=PAIR, target_name="watch-target", draft_name="watch-int8",
                                  config=SpeculativeConfig(4, SamplingConfig(), 24), registry=open_registry_at(stack["server"].uri),
                                  store=model_store())
    return reg.pair.version


def _post(port: int, body: dict, *, secret: str = SECRET, ts: int | None = None, delivery_id: str | None = None) -> int:
    text = json.dumps(body)
    did, stamp = delivery_id or str(uuid.uuid4()), str(int(time.time()) if ts is None else ts)
    headers = {"Content-Type": "application/json", "X-MLflow-Delivery-Id": did, "X-MLflow-Timestamp": stamp,
               "X-MLflow-Signature": sign(secret, did, stamp, text)}
    return httpx.post(f"http://127.0.0.1:{port}/webhook", content=text.encode(), headers=headers, timeout=60).status_code


def test_watch_validates_new_versions_and_gates_a_hand_moved_champion(stack, tmp_path):
    from monitoring.db import Database
    from monitoring.deliveries import deliveries
    from registry import promote
    from registry import check_gate

    v1_dir = save_tiny_checkpoint(tmp_path / "target-v1", seed=0, hidden_size=64)
    v2_dir = save_tiny_checkpoint(tmp_path / "target-v2", seed=0, hidden_size=64, perturb=0.05)
    _start_watcher(stack)
    port, client = stack["port"], _client(stack)
    registry = open_registry_at(stack["server"].uri)

    # registering a version triggers its validation
    assert _register(stack, str(v1_dir), "derived:int8") == "1"
    _wait(lambda: _status(stack, "1"), 240, "v1's validation", logs=stack["tmp"])
    assert check_gate(PAIR, "1", registry=registry, gate=policy_gate()).passed  # speed may be inconclusive under load
    promote(PAIR, "1", actor="test", registry=registry, gate=policy_gate())  # through the gate: nothing to do
    assert _register(stack, str(v2_dir), "models:/watch-int8/1") == "2"
    assert _wait(lambda: _status(stack, "2"), 240, "v2's validation", logs=stack["tmp"]) == "failed"
    assert not check_gate(PAIR, "2", registry=registry, gate=policy_gate()).passed
    assert len(_flow_runs(stack, f"watch validate {PAIR} v1")) == 1 and len(_flow_runs(stack, f"watch validate {PAIR} v2")) == 1

    # @champion moved by hand to the failing v2: validated and alerted within 2 minutes
    t0, load0 = time.monotonic(), os.getloadavg()[0]
    client.set_registered_model_alias(PAIR, "champion", "2")
    alert = _wait(lambda: _ungated(stack), 300, "the ungated-promotion alert", logs=stack["tmp"])
    took, busy = time.monotonic() - t0, max(load0, os.getloadavg()[0]) / (os.cpu_count() or 1)
    print(f"hand move -> ungated alert: {took:.0f} s (load per CPU {busy:.2f})")
    # the 2-minute bound holds on a machine that is not overloaded (the project's bound for timings,
    # specdec.validation.machine.OVERLOADED_LOAD_PER_CPU); a shared, overloaded CI box only gets 5 min
    from specdec.validation.machine import OVERLOADED_LOAD_PER_CPU

    assert took < (120 if busy <= OVERLOADED_LOAD_PER_CPU else 300), f"{took:.0f} s at load {busy:.2f}/CPU"
    gate_runs = _flow_runs(stack, f"watch gate-champion {PAIR} v2")
    assert len(gate_runs) == 1 and len(alert) == 1
    assert alert[0]["title"] == f"Ungated promotion: {PAIR} v2 (champion)"
    assert f"#/models/{PAIR}/versions/2" in json.dumps(alert[0]) and "Moved @champion back" not in alert[0]["text"]
    assert client.get_registered_model(PAIR).aliases["champion"] == "2"  # no --revert: left where it was
    assert len(_flow_runs(stack, f"watch gate-champion {PAIR} v1")) == 0  # the gated promotion ran nothing

    # forged, replayed and duplicate deliveries change nothing
    db = Database(f"sqlite:///{stack['tmp'] / 'home' / 'history.db'}")
    before = deliveries(db)
    gate_row = next(r for r in before if r.action == "gate-champion" and r.version == "2")
    sent_at = gate_row.trigger_key.split(":", 3)[3]
    move = {"entity": "model_version_alias", "action": "created", "timestamp": sent_at,
            "data": {"name": PAIR, "alias": "champion", "version": "2"}}
    assert _post(port, move, secret="not-the-secret-at-all") == 401
    assert _post(port, move, ts=int(time.time()) - 3600) == 401
    assert _post(port, move, delivery_id=gate_row.delivery_id) == 200  # MLflow's retry of the same delivery
    assert _post(port, move) == 200  # another delivery of the same move
    time.sleep(8)  # longer than the runner's poll
    assert len(_flow_runs(stack, f"watch gate-champion {PAIR}")) == 1 and len(_ungated(stack)) == 1
    after = deliveries(db)
    assert [r.delivery_id for r in after[:len(before)]] == [r.delivery_id for r in before]
    assert [r.action.split(":")[0] for r in after[len(before):]] == ["ignored"]
    log = (stack["tmp"] / "watcher0.log").read_text()
    assert "refused (401)" in log and SECRET not in log

    # --revert: a hand move to the passing v1 resolves the incident; back to v2 is reverted to v1
    _wait(lambda: all(r["state_type"] in ("COMPLETED", "FAILED", "CRASHED") for r in _flow_runs(stack, "watch ")),
          300, "the watch flow runs to finish")
    _start_watcher(stack, "--revert")
    client.set_registered_model_alias(PAIR, "champion", "1")
    _wait(lambda: any(r.body.get("event") == "resolve" for r in stack["alerts"].accepted), 60, "the resolve")
    client.set_registered_model_alias(PAIR, "champion", "2")
    fired = _wait(lambda: _ungated(stack)[1:], 300, "the second ungated alert", logs=stack["tmp"])
    assert "Moved @champion back to v1" in fired[0]["text"]
    assert client.get_registered_model(PAIR).aliases["champion"] == "1"
    assert "reverted to v1" in client.get_model_version(PAIR, "2").description
    assert len(_flow_runs(stack, f"watch gate-champion {PAIR} v2")) == 2
    assert SECRET not in (stack["tmp"] / "watcher1.log").read_text()


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_ctrl_c_and_sigterm_stop_the_watcher_with_one_line(stack, sig):
    """issue 43, item 1: a watcher stopped by Ctrl-C (or SIGTERM) ends within seconds with 128 + the signal
    (130 / 143), one ``stopped: SIG... received`` line and no traceback (before: uvicorn re-raised the
    signal after its graceful stop: SIGINT ended it without a word, SIGTERM killed it, exit -15)."""
    import signal

    _start_watcher(stack, "--replace")
    p, stack["watcher"] = stack["watcher"], None
    os.kill(p.pid, getattr(signal, sig))
    try:
        p.wait(60)
    except subprocess.TimeoutExpired:
        _stop(p)
        pytest.fail(f"the watcher was still running 60 s after {sig}")
    said = (stack["tmp"] / "watcher1.log").read_text()
    assert p.returncode == 128 + getattr(signal, sig), (p.returncode, said[-3000:])
    assert said.count(f"stopped: {sig} received") == 1 and "Traceback" not in said and "Aborted" not in said, said[-3000:]
