"""The scale-out path: the nightly flow validates several pair versions concurrently through
prefect-dask's DaskTaskRunner on a local cluster (2 worker processes)."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from tests.support.models import save_tiny_checkpoint


@pytest.fixture
def env(tmp_path, monkeypatch, prefect_harness):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("SPECDEC_ALERT_CHANNELS", raising=False)
    rows = [{"id": f"p{i}", "category": ["a", "b"][i % 2], "prompt": f"abc abc abc {i} abc abc"} for i in range(4)]
    (tmp_path / "h.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    return tmp_path


def test_dask_task_runner_validates_pairs_in_parallel(env):
    from flows.nightly import nightly_flow_for
    from flows.register import register_pair_flow

    ckpt = save_tiny_checkpoint(env / "tiny")
    for pair in ("pair-a", "pair-b"):
        register_pair_flow(str(ckpt), "ngram", name=pair, target_name="tiny-target", max_new_tokens=8)
    flow = nightly_flow_for(parallel=True, dask_workers=2)
    assert type(flow.task_runner).__name__ == "DaskTaskRunner"
    results = flow(pairs=["pair-a", "pair-b"], aliases=("challenger",), heldout=str(env / "h.jsonl"), limit=None,
                   device="cpu", dtype="float32", scheduled_date=dt.date(2026, 11, 1))
    by_pair = {r.pair: r for r in results}
    assert set(by_pair) == {"pair-a", "pair-b"}
    for r in by_pair.values():
        assert r.status in {"passed", "failed", "inconclusive"}, r
        assert r.history_run_id is not None and r.mlflow_run_id
