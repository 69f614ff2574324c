"""Identical ``specdec pair register`` processes at once against a real ``mlflow server`` (issue 43,
item 6).

Before: one succeeded and the other printed a 408-line traceback (the issue's report); here, with four at
once, each printed "registered" as if it had made the version. Now registrations of one pair on one machine take turns
(:func:`registry.register.registration_lock`): the others wait, say so in one line, then find the
first's version and reports it as already registered. The registry ends with one pair version and one
target version.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.registry.test_store import mlflow_server  # noqa: F401 (fixture: a real `mlflow server`)
from tests.support.models import save_tiny_checkpoint

pytestmark = pytest.mark.server
PAIR = "race-pair"


RACERS = 4  # with 2 the old code's race did not show here; with 4 each said "registered" (not one "already")


def test_identical_registrations_at_once_end_with_one_version(tmp_path, mlflow_server):  # noqa: F811
    mlflow = mlflow_server
    ckpt = save_tiny_checkpoint(tmp_path / "tiny")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "SPECDEC_"))}
    env.update({"SPECDEC_HOME": str(tmp_path / "home"), "MLFLOW_TRACKING_URI": mlflow.uri, "HF_HUB_OFFLINE": "1",
                "COLUMNS": "200"})
    cmd = [sys.executable, "-m", "specdec.cli", "pair", "register", "--target", str(ckpt), "--draft", "ngram:3:1",
           "--name", PAIR, "--target-name", "race-target", "--max-new-tokens", "8"]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(RACERS)]
    outs = [p.communicate(timeout=900)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
        assert "Traceback" not in out and "│" not in out, out[-3000:]
    assert sum("already registered as" in out for out in outs) == RACERS - 1, outs  # the others found the first's
    from mlflow import MlflowClient

    c = MlflowClient(mlflow.uri)
    assert [mv.version for mv in c.search_model_versions(f"name='{PAIR}'")] == ["1"]
    assert [mv.version for mv in c.search_model_versions("name='race-target'")] == ["1"]
