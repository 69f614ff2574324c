"""Continuations from an engine, against a scripted llama.cpp-shaped engine on 127.0.0.1 whose answers are the
tiny target's own greedy continuations (tests/support/scripted_engine.py; the real llama-server's test is
test_engine_continuations.py): the replay night with a served target (no weights, meta device) equals the
core-continuation night exactly; its cache entries carry the engine's fingerprint (a re-run asks the engine
nothing, another engine build asks again); an engine that dies mid-night raises one line and leaves only whole
cache entries; a served target is refused where the target would have to run."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from specdec import NgramDrafter, SamplingConfig, autoregressive_generate, load_causal_lm
from specdec.engines.errors import EngineRequestError
from specdec.engines.profile import EngineEndpoint, EngineLimits
from specdec.validation import engine_continuations as ec
from specdec.validation.api import ValidationRequest, validate
from specdec.validation.config import ValidationConfig
from specdec.validation.continuation_cache import ContinuationCache
from specdec.validation.heldout import HeldoutPrompt, HeldoutSet, content_version
from specdec.validation.served_target import is_served, served_target
from tests.support.models import perturbed_copy, save_tiny_checkpoint
from tests.support.scripted_engine import ScriptedEngine, llamacpp_props
from tests.support.continuations import home_continuations
from tests.support.store import model_store

CFG = ValidationConfig(max_new_tokens=10, bootstrap_resamples=200, warmup=False, seed=3)


def _heldout(n=6):
    prompts = [HeldoutPrompt(id=f"q{i}", category="ab"[i % 2],
                             messages=[{"role": "user", "content": f"item {i} " + "ab " * (i % 3)}]) for i in range(n)]
    return HeldoutSet("toy", content_version(prompts), prompts)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    path = save_tiny_checkpoint(tmp_path_factory.mktemp("t") / "target")
    target = load_causal_lm(str(path), store=model_store())
    return target, perturbed_copy(target.model, scale=0.3, seed=4)


def _core_answer(target):
    """The scripted engine's answer: the target's own greedy continuation (target-only decoding)."""
    eos = target.model.generation_config.eos_token_id

    def answer(prompt_ids, n):
        out = autoregressive_generate(target.model, torch.tensor([prompt_ids]), max_new_tokens=n, eos_token_id=eos,
                                      sampling=SamplingConfig())
        return out.token_ids, 0, 0
    return answer


def _counted(r):
    o = r.overall
    return (o.num_prompts, o.num_drafts, o.num_draft_tokens, o.num_accepted_tokens, o.acceptance_rate,
            tuple(o.acceptance_rate_ci), {c: (g.num_accepted_tokens, tuple(g.acceptance_rate_ci)) for c, g in r.categories.items()},
            [{n: v for n, v in row.items() if n != "produced_by"} for row in r.replay["prompts"]],
            json.dumps(r.replay["acceptance_by_k"], sort_keys=True))


def test_engine_night_with_a_served_target_equals_the_core_night(pair, tmp_path):
    target, draft = pair
    drafters = [draft, NgramDrafter()]
    core = validate(ValidationRequest(target, drafters, _heldout(), CFG, method="replay", kmax=5,
                                      cache=ContinuationCache(tmp_path / "core")))
    served = served_target(target.path)
    assert is_served(served.model)
    cache = ContinuationCache(tmp_path / "engine")

    def night(eng):
        engine = ec.connect_engine(EngineEndpoint(url=eng.url), EngineLimits())
        try:
            return validate(ValidationRequest(served, drafters, _heldout(), CFG, method="replay", kmax=5, cache=cache,
                                              engine=engine, target_weights="w" * 64))
        finally:
            engine.close()

    with ScriptedEngine(_core_answer(target)) as eng:
        first = night(eng)
        asked = eng.completions
        again = night(eng)
        assert eng.completions == asked == 6  # the re-run read every continuation from the cache
    for c, e in zip(core, first):
        assert c.overall.num_draft_tokens > 0 and _counted(c) == _counted(e)
        assert e.replay["continuations"]["engine"] == 6 and e.replay["target"]["loaded"] is False
        assert e.device == "engine:llamacpp"
    assert again[0].replay["continuations"]["cache"] == 6 and _counted(again[0]) == _counted(first[0])
    with ScriptedEngine(_core_answer(target), props=llamacpp_props(build_info="b1-other")) as other:
        third = night(other)
        assert other.completions == 6 and third[0].replay["continuations"]["engine"] == 6  # another engine: asked again
    entry = json.loads(next((tmp_path / "engine").rglob("*.json")).read_text())
    assert entry["produced_by"] == "engine" and len(entry["key"]["engine"]) == 64 and entry["key"]["device"] == "engine:llamacpp"


def test_engine_dying_mid_night_raises_one_line_and_keeps_whole_entries(pair, tmp_path, monkeypatch):
    target, draft = pair
    served, cache = served_target(target.path), ContinuationCache(tmp_path)
    eng = ScriptedEngine(_core_answer(target)).__enter__()
    real, calls = ec.EngineContinuations.continuation, []

    def dies_after_two(self, *a, **kw):
        if len(calls) == 2:
            eng.__exit__(None, None, None)
        calls.append(1)
        return real(self, *a, **kw)

    monkeypatch.setattr(ec.EngineContinuations, "continuation", dies_after_two)
    engine = ec.connect_engine(EngineEndpoint(url=eng.url), EngineLimits())
    with pytest.raises(EngineRequestError) as err:
        validate(ValidationRequest(served, [draft], _heldout(), CFG, method="replay", kmax=3, cache=cache, engine=engine))
    assert "\n" not in str(err.value) and "127.0.0.1" in str(err.value)
    entries = [json.loads(p.read_text()) for p in tmp_path.rglob("*.json") if p.name != "weights-sha256.json"]
    assert len(entries) == 2 and all(e["produced_by"] == "engine" for e in entries)
    assert not list(tmp_path.rglob("*.tmp"))


def test_a_served_target_is_refused_where_the_target_would_run(pair):
    target, draft = pair
    served = served_target(target.path)
    with pytest.raises(ValueError, match="served target"):
        validate(ValidationRequest(served, [draft], _heldout(), CFG, method="both"))
    with pytest.raises(ValueError, match="served target"):
        validate(ValidationRequest(served, [draft], _heldout(), CFG, method="replay"))
    # its modules hold no weights: every parameter is on the meta device, and so is anything computed from them
    assert {p.device.type for p in served.model.parameters()} == {"meta"}
    assert served.model(torch.tensor([[1, 2, 3]], device="meta")).logits.device.type == "meta"
    hot = dataclasses.replace(CFG, speculative=dataclasses.replace(CFG.speculative, sampling=dataclasses.replace(
        CFG.speculative.sampling, temperature=0.7)))
    from specdec.validation.replay_run import replay_prompts

    with pytest.raises(ValueError, match="greedy"):
        replay_prompts(_heldout(), served.model, served.tokenizer, [draft], hot, eos=2, ctx_limit=None,
                       cache=home_continuations(), target_weights="w", engine=object())
