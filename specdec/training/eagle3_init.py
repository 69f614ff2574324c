"""A fresh EAGLE-3 head for a target, and a parent head for a warm start (both :class:`Eagle3Head`).

A fresh head follows ``speculators``' ``Eagle3DraftModel.from_training_args``: one decoder layer of
the target's family and sizes, ``embed_tokens`` and ``lm_head`` copied from the target (the LM head's
rows of the draft vocabulary), ``fc`` and the layer initialised like ``transformers`` does
(normal, std ``initializer_range``), norms at one.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch


def _layer_config(target_config: Any) -> Any:
    """The head's decoder-layer config: the target's (Llama/Qwen3) with one layer; other families get a
    Llama layer of the same sizes."""
    from transformers import LlamaConfig

    from specdec.models.eagle3.config import SUPPORTED_LAYER_TYPES

    tc = target_config
    if tc.model_type in SUPPORTED_LAYER_TYPES:
        layer = copy.deepcopy(tc)
    else:
        layer = LlamaConfig(hidden_size=tc.hidden_size, intermediate_size=tc.intermediate_size,
                            num_attention_heads=tc.num_attention_heads,
                            num_key_value_heads=getattr(tc, "num_key_value_heads", None) or tc.num_attention_heads,
                            rms_norm_eps=getattr(tc, "rms_norm_eps", 1e-6), vocab_size=tc.vocab_size,
                            hidden_act=getattr(tc, "hidden_act", "silu"),
                            max_position_embeddings=getattr(tc, "max_position_embeddings", 2048))
    layer.num_hidden_layers = 1
    if getattr(layer, "head_dim", None) is None:
        layer.head_dim = layer.hidden_size // layer.num_attention_heads
    return layer


@torch.no_grad()
def new_head(target: Any, layer_ids: list[int], d2t: torch.Tensor, t2d: torch.Tensor, *, seed: int = 0,
             ttt_steps: int = 3) -> Any:
    """A freshly initialised head for ``target`` (a ``LoadedModel``).

    Args:
        layer_ids: ``eagle_aux_hidden_state_layer_ids``.
        d2t, t2d: the draft vocabulary (:func:`specdec.training.eagle3_features.draft_vocab_mapping`).
        seed: initialisation seed (the global RNG is left as it was).
    Returns:
        :class:`~specdec.models.eagle3.head.Eagle3Head`, float32, CPU.
    """
    from specdec.models.eagle3 import Eagle3Config, Eagle3Head

    model = target.model
    raw = {"speculators_config": {
        "algorithm": "eagle3", "default_proposal_method": "greedy",
        "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": ttt_steps}],
        "verifier": {"name_or_path": None, "architectures": list(getattr(model.config, "architectures", None) or [])}}}
    config = Eagle3Config(layer=_layer_config(model.config), draft_vocab_size=int(d2t.numel()),
                          aux_layer_ids=list(layer_ids), raw=raw)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = Eagle3Head(config).float()
        std = float(getattr(model.config, "initializer_range", 0.02))
        for m in head.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.normal_(0.0, std)
                if m.bias is not None:
                    m.bias.zero_()
    head.embed_tokens.weight.copy_(model.get_input_embeddings().weight.float())
    ids = torch.arange(d2t.numel()) + d2t
    head.lm_head.weight.copy_(model.get_output_embeddings().weight[ids].float())
    if head.d2t is not None:
        head.d2t.copy_(d2t)
        head.t2d.copy_(t2d)
    return head


def load_parent(path: str | Path, target: Any) -> dict[str, Any]:
    """The head to warm-start from: ``{"head", "weights_sha256", "layer_ids", "d2t", "t2d"}``.

    ``d2t``/``t2d`` are the parent's (identity when its draft vocabulary is the target's).

    Raises:
        FileNotFoundError / Eagle3ConfigError: not a loadable head; ValueError: its target vocabulary
        or aux layers do not fit ``target``.
    """
    from specdec.models.eagle3 import load_eagle3
    from specdec.models.hashes import weights_sha256

    head = load_eagle3(path, target=target.model, dtype=torch.float32)
    cfg = target.model.config
    if head.config.target_vocab_size != cfg.vocab_size:
        raise ValueError(f"head at {path} is for a vocabulary of {head.config.target_vocab_size} tokens; "
                         f"the target has {cfg.vocab_size}")
    layer_ids = head.config.layer_ids_for(cfg.num_hidden_layers)
    if head.d2t is None:
        d2t, t2d = torch.zeros(cfg.vocab_size, dtype=torch.long), torch.ones(cfg.vocab_size, dtype=torch.bool)
    else:
        d2t, t2d = head.d2t.cpu().clone(), head.t2d.cpu().clone()
    return {"head": head, "weights_sha256": weights_sha256(path), "layer_ids": layer_ids, "d2t": d2t, "t2d": t2d}
