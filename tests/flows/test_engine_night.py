"""A nightly whose continuations come from the engine serving the target (``continuations="engine"``), where
the engine (a real ``llama-server`` on 127.0.0.1) dies mid-night: the night is ``error`` with one line, the
history row is ``error`` with no metrics, no report and no MLflow run are written, and the continuations it
did give are whole cache entries (the next night resumes from them). Skipped where llama-server is not built."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from specdec.engines.llama_server import LlamaServerFlags
from tests.support.engine import engine_or_skip, start_server, target_gguf

pytestmark = pytest.mark.slow
DONE_BEFORE_DEATH = 3


@pytest.fixture
def env(tmp_path, monkeypatch, prefect_harness):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("SPECDEC_ALERT_CHANNELS", raising=False)
    rows = [{"id": f"p{i}", "category": "ab"[i % 2], "prompt": f"Name {i + 2} colours."} for i in range(8)]
    (tmp_path / "h.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    return tmp_path


def test_engine_dying_mid_night_leaves_the_night_error_and_nothing_half_recorded(env, monkeypatch):
    import monitoring
    from flows.nightly import nightly_validation_flow
    from flows.register import register_pair_flow
    from monitoring.history import list_runs
    from registry.pairs import engine_tags, set_engine
    from registry.service import open_registry
    from specdec.validation import engine_continuations as ec

    install = engine_or_skip()
    pv = register_pair_flow(str(target_gguf()), "ngram", name="pair-e", max_new_tokens=16)
    flags = LlamaServerFlags(model=str(target_gguf()), spec_type="none", ctx_size=2048, threads=1)
    with start_server(install, flags, env) as server:
        set_engine("pair-e", pv["version"], tags=engine_tags(server.url, None)[0])
        open_registry().client.set_model_version_tag("pair-e", str(pv["version"]), "engine", "llamacpp")
        real, calls = ec.EngineContinuations.continuation, []

        def dies_after_some(self, *a, **kw):  # the real engine answers, then its process is killed
            if len(calls) == DONE_BEFORE_DEATH:
                server.stop()
            calls.append(1)
            return real(self, *a, **kw)

        monkeypatch.setattr(ec.EngineContinuations, "continuation", dies_after_some)
        results = nightly_validation_flow(pairs=["pair-e"], aliases=("challenger",), heldout=str(env / "h.jsonl"),
                                          limit=None, device="cpu", dtype="float32", method="replay",
                                          continuations="engine", scheduled_date=dt.date(2026, 11, 3))
    # the validation's result (the engine step, which finds the engine dead too, is a result of its own)
    [res] = [r for r in results if r.alias == "challenger" and "validation failed" in r.message]
    assert res.status == "error" and res.mlflow_run_id is None, res
    assert "\n" not in res.message and "EngineRequestError" in res.message and "Traceback" not in res.message
    [row] = list_runs(monitoring.connect(monitoring.get_settings()), pair_name="pair-e", source="nightly")
    assert row.status == "error" and row.acceptance_rate is None and "EngineRequestError" in row.error
    assert not list((env / "home").rglob("report.json"))
    entries = list((env / "home" / "continuations").rglob("*.json"))
    entries = [p for p in entries if p.name != "weights-sha256.json"]
    assert len(entries) == DONE_BEFORE_DEATH and not list((env / "home" / "continuations").rglob("*.tmp"))
    for p in entries:
        e = json.loads(p.read_text())
        assert e["produced_by"] == "engine" and e["key"]["engine"] and len(e["tokens"]) >= 1
