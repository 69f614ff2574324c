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
from tests.support.registry import open_registry_at

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
    from specdec.validation import engine_continuations as ec

    install = engine_or_skip()
    pv = register_pair_flow(str(target_gguf()), "ngram", name="pair-e", max_new_tokens=16)
    flags = LlamaServerFlags(model=str(target_gguf()), spec_type="none", ctx_size=2048, threads=1)
    with start_server(install, flags, env) as server:
        registry = open_registry_at()
        set_engine("pair-e", pv["version"], tags=engine_tags(server.url, None)[0], registry=registry)
        registry.client.set_model_version_tag("pair-e", str(pv["version"]), "engine", "llamacpp")
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


def test_engine_night_with_an_engine_step_never_loads_the_target(env, monkeypatch):
    """A healthy engine night of a draft-model pair whose engine (llama-server with the Q8_0 draft, the flags the
    pair declares) is checked too: the replay and the engine step both run with the target served, so the nightly
    never loads the target's weights (every model load is recorded: only the draft's), the engine step finds
    nothing, and its report says the audit used the engine's own continuations."""
    from flows import loading
    from flows.nightly import nightly_validation_flow
    from flows.register import register_pair_flow
    from registry.pairs import engine_tags, set_engine
    from tests.support.engine import draft_gguf

    install = engine_or_skip()
    d_gguf = draft_gguf(install, "Q8_0")
    pv = register_pair_flow(str(target_gguf()), str(d_gguf), name="pair-d", max_new_tokens=16)
    loads: list[str] = []
    real_load = loading._RegistryLoader.load
    monkeypatch.setattr(loading._RegistryLoader, "load", lambda self, uri: loads.append(uri) or real_load(self, uri))
    flags = LlamaServerFlags(model=str(target_gguf()), draft=str(d_gguf), n_max=4, ctx_size=2048, threads=1)
    with start_server(install, flags, env) as server:
        registry = open_registry_at()
        set_engine("pair-d", pv["version"], tags=engine_tags(server.url, list(server.command))[0], registry=registry)
        registry.client.set_model_version_tag("pair-d", str(pv["version"]), "engine", "llamacpp")
        results = nightly_validation_flow(pairs=["pair-d"], aliases=("challenger",), heldout=str(env / "h.jsonl"),
                                          limit=None, device="cpu", dtype="float32", method="replay",
                                          continuations="engine", scheduled_date=dt.date(2026, 11, 4))
    by_source = {"engine" if "engine" in r.alias else "nightly": r for r in results}
    assert by_source["nightly"].status in {"passed", "failed", "inconclusive"}, by_source["nightly"]
    assert by_source["engine"].status not in {"error"} and by_source["engine"].acceptance_rate is not None, by_source
    assert loads and pv["target_uri"] not in loads, (pv["target_uri"], loads)  # the draft was loaded, never the target
    [doc] = [json.loads(p.read_text()) for p in (env / "home" / "reports").rglob("engine_check.json")]
    assert any("the target was not loaded here" in n for n in doc["notes"]), doc["notes"]
    a = doc["audit"]
    assert a["checked"] > 0 and a["identical"] + a["near_tie"] + a["divergent"] == a["checked"], a
