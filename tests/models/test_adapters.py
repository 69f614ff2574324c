"""LoRA adapters on a shared base (specdec.models.adapters): the adapted target is the merged model, bit for bit, and
decodes token for token as the merged checkpoint does (B = 1 and batched, greedy and sampled); the base is left as it
was; derived drafts derive from the adapted weights; a base the adapter does not fit is refused in one line."""

from __future__ import annotations

import pytest
import torch

from specdec import NgramDrafter, SamplingConfig, autoregressive_generate, speculative_generate
from specdec.kinds import DrafterSpecError, resolve_drafter
from specdec.models import load_causal_lm
from specdec.models.adapters import AdapterError, AdapterMismatchError, attach_adapter, read_adapter
from specdec.models.hashes import adapted_weights_sha256, weights_sha256
from specdec.models.store import ModelStore
from tests.support.adapters import save_lora_adapter, save_merged
from tests.support.models import save_tiny_checkpoint

GREEDY = SamplingConfig(temperature=0.0)
PROMPTS = [[1, 9, 10, 11, 12], [1, 20, 21], [1, 30, 31, 32, 33, 34, 35], [1, 40]]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    base = save_tiny_checkpoint(root / "base", seed=0)
    adapter = save_lora_adapter(base, root / "support-v3", seed=1)
    return {"base": base, "adapter": adapter, "merged": save_merged(base, adapter, root / "merged"),
            "store": ModelStore(root / "models"), "root": root}


@pytest.fixture(scope="module")
def models(dirs):
    store = dirs["store"]
    base = load_causal_lm(dirs["base"], store=store)
    return {"base": base, "adapted": attach_adapter(base, dirs["adapter"]),
            "merged": load_causal_lm(dirs["merged"], store=store)}


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_adapted_is_the_merged_model_bit_for_bit_and_the_base_is_untouched(dirs, models):
    fresh_base = load_causal_lm(dirs["base"], store=dirs["store"]).model.state_dict()
    adapted, merged, base = (_state(models[n].model) for n in ("adapted", "merged", "base"))
    assert adapted.keys() == merged.keys() == base.keys()
    assert all(torch.equal(adapted[k], merged[k]) for k in merged)
    assert all(torch.equal(base[k], fresh_base[k]) for k in base)  # attach_adapter merged into copies
    changed = sorted(k for k in base if not torch.equal(base[k], adapted[k]))
    assert changed == sorted(f"model.layers.{i}.self_attn.{m}.weight" for i in (0, 1) for m in ("q_proj", "v_proj"))
    # what the adapter does not touch is shared with the base, not copied
    a_mlp, b_mlp = models["adapted"].model.model.layers[0].mlp, models["base"].model.model.layers[0].mlp
    assert a_mlp.gate_proj.weight.data_ptr() == b_mlp.gate_proj.weight.data_ptr()
    info = models["adapted"].adapter
    assert info.to_dict() == {"name": "support-v3", "ref": str(dirs["adapter"].resolve()),
                              "weights_hash": weights_sha256(dirs["adapter"]), "base_hash": None, "rank": 4,
                              "target_modules": ["q_proj", "v_proj"]}
    assert adapted_weights_sha256("b" * 64, info.weights_hash) not in ("b" * 64, info.weights_hash)


@pytest.mark.parametrize("drafter", ["base", "ngram"])
def test_greedy_tokens_of_the_adapted_target_equal_the_merged_model_b1_and_batched(models, drafter):
    tokens = {}
    for name in ("adapted", "merged", "base"):
        target = models[name].model
        draft = models["base"].model if drafter == "base" else NgramDrafter()  # the shared, unadapted draft
        rows = [speculative_generate(target, draft, torch.tensor([p]), num_speculative_tokens=3, max_new_tokens=16,
                                     sampling=GREEDY).token_ids for p in PROMPTS]
        ref = [autoregressive_generate(target, torch.tensor([p]), max_new_tokens=16, sampling=GREEDY).token_ids
               for p in PROMPTS]
        width = max(map(len, PROMPTS))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in PROMPTS])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in PROMPTS])
        batch = speculative_generate(target, draft, ids, mask, num_speculative_tokens=3, max_new_tokens=16,
                                     sampling=GREEDY)
        assert rows == ref  # speculative decoding is exact on the adapted target too
        tokens[name] = (rows, [r.token_ids for r in batch.rows])
    assert tokens["adapted"] == tokens["merged"]
    assert tokens["adapted"][1] == tokens["merged"][1] == tokens["adapted"][0]
    assert tokens["adapted"][0] != tokens["base"][0]  # the adapter's B matrices are not zero: it moves the output


def test_sampling_draws_the_same_tokens_as_the_merged_model(models):
    out = {}
    for name in ("adapted", "merged"):
        gen = torch.Generator().manual_seed(7)
        out[name] = [speculative_generate(models[name].model, models["base"].model, torch.tensor([p]),
                                          num_speculative_tokens=3, max_new_tokens=16, generator=gen,
                                          sampling=SamplingConfig(temperature=1.0)).token_ids for p in PROMPTS]
    assert out["adapted"] == out["merged"]


def test_derived_draft_and_hidden_states_come_from_the_adapted_weights(dirs, models):
    store = dirs["store"]
    drafts = {n: resolve_drafter("derived:bf16", models[n], store=store).drafter for n in ("adapted", "merged", "base")}
    a, m, b = (d.state_dict() for d in drafts.values())
    assert all(torch.equal(a[k], m[k]) for k in m)
    assert not torch.equal(a["model.layers.0.self_attn.q_proj.weight"], b["model.layers.0.self_attn.q_proj.weight"])
    ids = torch.tensor([PROMPTS[2]])
    with torch.no_grad():  # what an EAGLE-3 head reads
        ha, hm = (models[n].model(ids, output_hidden_states=True).hidden_states for n in ("adapted", "merged"))
    assert all(torch.equal(x, y) for x, y in zip(ha, hm))


def test_a_draft_adapter_adapts_a_draft_model_only(dirs, models):
    store = dirs["store"]
    draft = resolve_drafter(f"model:{dirs['base']}", models["base"], store=store, adapter=dirs["adapter"])
    assert draft.loaded.adapter.name == "support-v3"
    merged = models["merged"].model.state_dict()
    assert all(torch.equal(v, merged[k]) for k, v in draft.drafter.state_dict().items())
    plain = resolve_drafter(f"model:{dirs['base']}", models["base"], store=store)
    assert plain.loaded.adapter is None  # the shared draft stays unadapted unless an adapter is named
    with pytest.raises(DrafterSpecError, match="has no checkpoint of its own"):
        resolve_drafter("ngram", models["base"], store=store, adapter=dirs["adapter"])


def test_a_base_the_adapter_does_not_fit_is_refused_in_one_line(dirs, models):
    root, store = dirs["root"], dirs["store"]
    wider = load_causal_lm(save_tiny_checkpoint(root / "wider", seed=0, hidden_size=48), store=store)
    with pytest.raises(AdapterMismatchError) as e:
        attach_adapter(wider, dirs["adapter"])
    assert "\n" not in str(e.value)
    assert "adapter support-v3 does not fit base LlamaForCausalLM: model.layers.0.self_attn.q_proj is 48x48" in str(e.value)
    recorded = save_lora_adapter(dirs["base"], root / "recorded", seed=1, base_hash="0" * 64)
    with pytest.raises(AdapterMismatchError, match="trained on base weights 0000000000000000, this base is "):
        load_causal_lm(dirs["base"], store=store, adapter=recorded)
    right = save_lora_adapter(dirs["base"], root / "right", seed=1, base_hash=weights_sha256(dirs["base"]))
    assert load_causal_lm(dirs["base"], store=store, adapter=right).adapter.base_hash == weights_sha256(dirs["base"])
    with pytest.raises(AdapterError, match="no adapter_config.json"):
        read_adapter(dirs["base"])
    with pytest.raises(AdapterError, match="already has adapter support-v3"):
        attach_adapter(models["adapted"], dirs["adapter"])
