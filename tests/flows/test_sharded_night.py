"""One pair's night split into shards (flows.sharding) on a local Dask cluster of 2 worker processes
(prefect-dask's DaskTaskRunner) gives the one-process night's report: same counters, same CIs, same rows."""

from __future__ import annotations

import csv
import datetime as dt
import json
import shutil
from pathlib import Path

import pytest

from tests.support.models import save_tiny_checkpoint


@pytest.fixture
def env(tmp_path, monkeypatch, prefect_harness):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("SPECDEC_ALERT_CHANNELS", raising=False)
    rows = [{"id": f"p{i}", "category": "abc"[i % 3], "prompt": f"abc {i} " + "ab " * (i % 4)} for i in range(10)]
    (tmp_path / "h.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    return tmp_path


def _same_parts(report_dir: str) -> dict:
    """The report without what depends on when and where it ran (times, timestamps, environment)."""
    r = json.loads((Path(report_dir) / "report.json").read_text())
    o, rep = r["overall"], r["replay"]
    counters = ("num_prompts", "num_drafts", "num_draft_tokens", "num_accepted_tokens", "acceptance_rate",
                "acceptance_rate_ci", "per_token_acceptance", "per_token_acceptance_ci", "mean_accepted_length")
    return {"overall": {n: o[n] for n in counters},
            "categories": {c: {n: g[n] for n in counters} for c, g in r["categories"].items()},
            # each k's predicted speedup uses the night's timed pass costs (c, v): timing, not a count
            "acceptance_by_k": [{n: v for n, v in row.items() if n != "predicted_speedup"} for row in rep["acceptance_by_k"]],
            "rows": [{n: v for n, v in row.items() if n != "produced_by"} for row in rep["prompts"]],  # provenance
            "prompts_csv": [{n: p[n] for n in ("prompt_id", "status", "num_drafts", "num_draft_tokens",
                                               "num_accepted_tokens")}
                            for p in csv.DictReader((Path(report_dir) / "prompts.csv").open())]}


def _night_equals_the_one_process_night(env, flow):
    """One pair's night sharded in two on ``flow`` (a nightly flow with a parallel runner) equals the one-process
    night on the same prompts: same counters, CIs and rows, the rows produced by the shards."""
    from flows.nightly import nightly_validation_flow
    from flows.register import register_pair_flow

    target = save_tiny_checkpoint(env / "tiny")
    draft = save_tiny_checkpoint(env / "draft", perturb=0.3)
    register_pair_flow(str(target), str(draft), name="pair-s", target_name="tiny-target", draft_name="tiny-draft",
                       max_new_tokens=10)
    night = dict(pairs=["pair-s"], aliases=("challenger",), heldout=str(env / "h.jsonl"), limit=None, device="cpu",
                 dtype="float32", method="replay")
    [one] = nightly_validation_flow(**night, scheduled_date=dt.date(2026, 11, 1))
    shutil.rmtree(env / "home" / "continuations")  # the shards make their own continuations
    [sharded] = flow(**night, shards=2, scheduled_date=dt.date(2026, 11, 2))
    assert one.status == sharded.status and one.status in {"passed", "failed", "inconclusive"}, (one, sharded)
    a, b = _same_parts(one.report_dir), _same_parts(sharded.report_dir)
    assert a["overall"]["num_prompts"] == 10 and a["overall"]["num_draft_tokens"] > 0
    assert 0 < a["overall"]["acceptance_rate"] < 1
    assert a == b
    rows = json.loads((Path(sharded.report_dir) / "report.json").read_text())["replay"]["prompts"]
    assert {r["produced_by"] for r in rows} != {"cache"}  # the shards produced them, not the first night's cache
    assert (one.acceptance_rate, one.acceptance_rate_ci) == (sharded.acceptance_rate, sharded.acceptance_rate_ci)


def test_sharded_night_on_two_dask_workers_equals_the_one_process_night(env):
    from flows.nightly import nightly_flow_for

    _night_equals_the_one_process_night(env, nightly_flow_for(parallel=True, dask_workers=2))


def test_sharded_night_on_a_local_ray_equals_the_one_process_night(env):
    """The same night with the shards on Ray (prefect-ray's RayTaskRunner, a local Ray of 2 CPUs): each shard ran
    on Ray's worker processes."""
    pytest.importorskip("prefect_ray", reason="prefect-ray is not installed: pip install 'specdec[ray]'")
    from flows.nightly import nightly_flow_for

    from prefect_ray import RayTaskRunner

    flow = nightly_flow_for(ray_address="local", dask_workers=2)
    assert isinstance(flow.task_runner, RayTaskRunner) and flow.task_runner.init_kwargs["num_cpus"] == 2
    _night_equals_the_one_process_night(env, flow)


def test_sharding_parameters_are_checked(env):
    from flows.nightly import nightly_validation_flow

    with pytest.raises(ValueError, match="shards"):
        nightly_validation_flow(pairs=["x"], heldout=str(env / "h.jsonl"), method="decode", shards=2)
    with pytest.raises(ValueError, match="continuations"):
        nightly_validation_flow(pairs=["x"], heldout=str(env / "h.jsonl"), method="replay", continuations="vllm")
    with pytest.raises(ValueError, match="method 'replay'"):
        nightly_validation_flow(pairs=["x"], heldout=str(env / "h.jsonl"), method="both", continuations="engine")


def test_ray_without_prefect_ray_is_refused_in_one_line(monkeypatch):
    """``--ray-address`` where prefect-ray is not installed: one line naming the extra, before any work."""
    import importlib.util

    from flows.cli import check_ray

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "prefect_ray" else real(name, *a))
    check_ray(None)  # no Ray asked: nothing to check
    with pytest.raises(ValueError, match=r"pip install 'specdec\[ray\]'") as e:
        check_ray("auto")
    assert "\n" not in str(e.value)
