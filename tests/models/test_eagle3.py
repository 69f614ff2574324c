"""EAGLE-3 head: speculators config parsing, checkpoint round trips, the norm flags, Qwen3 layers."""

from __future__ import annotations

import json

import pytest
import torch

from specdec.core.features import target_features
from specdec.models.eagle3 import Eagle3Config, Eagle3ConfigError, default_layer_ids, load_eagle3, save_eagle3
from tests.support.eagle3 import head_config, random_head, tiny_target


@pytest.fixture(scope="module")
def target():
    return tiny_target(0)


def _logits(head, target, ids):
    """Head logits over a teacher-forced sequence: entry t reads x[t + 1] and the target features at t."""
    with torch.no_grad():
        _, feats = target_features(target, ids, head.config.layer_ids_for(target.config.num_hidden_layers))
        T = ids.shape[1]
        return head(ids[:, 1:], head.combine(feats[:, : T - 1]), torch.arange(T - 1)[None], head.new_cache(1))[1]


IDS = torch.tensor([[5, 17, 33, 8, 91, 4, 60, 61, 2, 44]])


@pytest.mark.parametrize("kwargs", [
    {},
    {"layer_type": "qwen3", "draft_vocab_size": 40, "norm_before_residual": True},
    {"num_layers": 2, "norm_before_fc": True, "norm_output": True},
    {"fc_norm": True, "draft_vocab_size": 64},
])
def test_save_load_round_trip_gives_the_same_logits(target, tmp_path, kwargs):
    head = random_head(head_config(target, **kwargs), target, seed=3)
    save_eagle3(head, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and cfg["transformer_layer_config"]["model_type"] == kwargs.get("layer_type", "llama")
    back = load_eagle3(tmp_path)
    assert torch.equal(_logits(head, target, IDS), _logits(back, target, IDS))
    if kwargs.get("layer_type") == "qwen3":
        assert "layers.0.self_attn.q_norm.weight" in back.state_dict()


def test_missing_embeddings_come_from_the_target(target, tmp_path):
    from safetensors.torch import load_file, save_file

    head = random_head(head_config(target, draft_vocab_size=50), target, seed=4)
    save_eagle3(head, tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    del state["embed_tokens.weight"]
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(Eagle3ConfigError, match="lacks embed_tokens.weight"):
        load_eagle3(tmp_path)
    back = load_eagle3(tmp_path, target=target)
    assert torch.equal(back.embed_tokens.weight, target.get_input_embeddings().weight)
    assert torch.equal(_logits(head, target, IDS), _logits(back, target, IDS))


def test_draft_vocabulary_maps_through_d2t_and_gives_q_zero_elsewhere(target):
    head = random_head(head_config(target, draft_vocab_size=30), target, seed=5)
    z = head.target_logits(torch.randn(2, 30), 103)
    allowed = head.t2d.nonzero().flatten()
    assert torch.equal(head.to_target_ids(torch.arange(30)), allowed)  # target = draft + d2t[draft]
    assert torch.isfinite(z[:, allowed]).all() and torch.isinf(z[:, ~head.t2d]).all()


def test_config_errors_are_one_clear_line(target):
    good = head_config(target).to_dict()
    cases = [
        ({**good, "speculators_model_type": "eagle"}, "not an EAGLE-3 head"),
        ({**good, "transformer_layer_config": {**good["transformer_layer_config"], "model_type": "gpt2"}}, "unsupported"),
        ({**good, "eagle_aux_hidden_state_layer_ids": "1,2"}, "list of ints"),
        ({**good, "norm_before_fc": True, "fc_norm": True}, "mutually exclusive"),
        ({**good, "draft_vocab_size": 500}, "draft_vocab_size"),
    ]
    for d, msg in cases:
        with pytest.raises(Eagle3ConfigError, match=msg) as e:
            Eagle3Config.from_dict(d)
        assert "\n" not in str(e.value)


def test_default_layer_ids_follow_speculators_and_vllm():
    assert default_layer_ids(32) == [2, 16, 29]
    assert default_layer_ids(8) == [2, 4, 5]
    with pytest.raises(Eagle3ConfigError, match="set eagle_aux_hidden_state_layer_ids"):
        default_layer_ids(4)


def test_weights_that_do_not_match_the_config_are_refused(target, tmp_path):
    head = random_head(head_config(target), target, seed=6)
    save_eagle3(head, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["transformer_layer_config"]["intermediate_size"] = 48
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(Eagle3ConfigError, match="has shape"):
        load_eagle3(tmp_path)
