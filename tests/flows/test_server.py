"""Against a real ``prefect server`` process (same command as docker/compose.yaml): the nightly
deployment is registered with its cron schedule, and a flow run reports to the server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.net import free_port
from tests.support.models import save_tiny_checkpoint

pytestmark = pytest.mark.server
REPO = Path(__file__).resolve().parents[2]


SCRIPT = r"""
import json, sys
from flows.deploy import deployment_parameters
from flows.nightly import nightly_validation_flow
from flows.register import register_pair_flow
from flows.settings import NightlySettings

s = NightlySettings(cron="0 2 * * *")
dep = nightly_validation_flow.to_deployment(name=s.deployment_name, cron=s.cron, parameters=deployment_parameters(s))
dep_id = dep.apply()
pv = register_pair_flow(sys.argv[1], "ngram", name="server-pair", target_name="tiny-target", max_new_tokens=8)
print(json.dumps({"deployment_id": str(dep_id), "version": pv["version"]}))
"""


def test_deployment_schedule_and_flow_run_on_real_server(prefect_server, tmp_path):
    ckpt = save_tiny_checkpoint(tmp_path / "tiny")
    env = {**prefect_server["env"], "PREFECT_API_URL": prefect_server["api"], "SPECDEC_HOME": str(tmp_path / "home")}
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(ckpt)], env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    info = json.loads(out.stdout.strip().splitlines()[-1])
    api = prefect_server["api"]
    dep = httpx.get(f"{api}/deployments/{info['deployment_id']}", timeout=10).json()
    crons = [sch["schedule"].get("cron") for sch in dep.get("schedules", [])]
    assert crons == ["0 2 * * *"], dep
    assert dep["parameters"]["aliases"] == ["champion", "challenger"]
    runs = httpx.post(f"{api}/flow_runs/filter", json={"limit": 20}, timeout=10).json()
    done = [r for r in runs if r["state_type"] == "COMPLETED"]
    assert any(r["name"] for r in done), runs
    flows_ = httpx.post(f"{api}/flows/filter", json={}, timeout=10).json()
    assert {"register-pair", "nightly-validation"} <= {f["name"] for f in flows_}
