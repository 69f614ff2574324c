"""The ``speculators`` EAGLE-3 head config (``config.json`` with ``speculators_model_type: "eagle3"``).

Field names are ``speculators``' own (``speculators.models.eagle3.config.Eagle3SpeculatorConfig``,
speculators 0.9.0), so a config written here loads with their classes and theirs loads here:

* ``transformer_layer_config``: the decoder layer config (a transformers ``LlamaConfig`` or
  ``Qwen3Config`` as a dict; ``model_type`` picks the class, Qwen3 when absent, as speculators does).
  Its ``vocab_size`` is the *target* vocabulary (embeddings, t2d), ``num_hidden_layers`` the head's
  own decoder layers (usually 1).
* ``draft_vocab_size``: rows of the head's ``lm_head``; the ``d2t``/``t2d`` buffers (in the
  safetensors) map draft ids to target ids (``target = draft + d2t[draft]``) when it differs from
  the target vocabulary.
* ``eagle_aux_hidden_state_layer_ids``: which target hidden states feed the head (see
  :mod:`specdec.core.features`); ``None`` = the default ``[2, L // 2, L - 3]`` of the target's
  ``L`` layers (speculators ``resolve_target_layer_ids``; vLLM ``get_eagle3_aux_hidden_state_layers``).
* ``norm_before_residual``, ``norm_before_fc``, ``fc_norm``, ``norm_output``: the norm flags.
* ``target_hidden_size``: hidden size of the target when it differs from the head's (vLLM's fc input).
* ``speculators_config``: algorithm, proposal methods and the verifier's ``name_or_path``. The
  verifier path is informational here: the target always comes from the pair.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Eagle3Config", "Eagle3ConfigError", "default_layer_ids", "SUPPORTED_LAYER_TYPES"]

#: decoder-layer families the head supports (speculators 0.9.0 ``model_classes`` for eagle3)
SUPPORTED_LAYER_TYPES = ("llama", "qwen3")


class Eagle3ConfigError(ValueError):
    """A head config that is not a supported speculators EAGLE-3 config (one clear line)."""


def default_layer_ids(num_target_layers: int) -> list[int]:
    """``[2, L // 2, L - 3]``: the aux layer ids speculators and vLLM pick when a config has none.

    Raises:
        Eagle3ConfigError: the defaults are not distinct ids within ``[0, L]`` (targets under 8 layers).
    """
    ids = [2, num_target_layers // 2, num_target_layers - 3]
    if len(set(ids)) != 3 or min(ids) < 0 or max(ids) > num_target_layers:
        raise Eagle3ConfigError(
            f"default aux layer ids {ids} are invalid for a target with {num_target_layers} layers: "
            "set eagle_aux_hidden_state_layer_ids in the head config")
    return ids


@dataclass
class Eagle3Config:
    """A parsed EAGLE-3 head config (speculators field names).

    Attributes:
        layer: the transformers decoder-layer config (``LlamaConfig`` / ``Qwen3Config``) with every
            default filled in (checkpoints store only the non-default values).
        draft_vocab_size: rows of ``lm_head``.
        aux_layer_ids: ``eagle_aux_hidden_state_layer_ids`` (None = target default).
        norm_before_residual, norm_before_fc, fc_norm, norm_output: speculators' flags.
        target_hidden_size: target hidden size (None = the head's ``hidden_size``).
        raw: the config dict as read (kept for round-trips: unknown keys are written back).
    """

    layer: Any
    draft_vocab_size: int
    aux_layer_ids: list[int] | None = None
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    target_hidden_size: int | None = None
    raw: dict = field(default_factory=dict)

    @property
    def layer_type(self) -> str:
        return self.layer.model_type

    @property
    def hidden_size(self) -> int:
        return self.layer.hidden_size

    @property
    def target_vocab_size(self) -> int:
        return self.layer.vocab_size

    @property
    def num_aux(self) -> int:
        """Aux hidden states concatenated into ``fc`` (3 when the ids are left to the default)."""
        return len(self.aux_layer_ids) if self.aux_layer_ids else 3

    @property
    def fc_in_features(self) -> int:
        return self.num_aux * (self.target_hidden_size or self.hidden_size)

    @property
    def verifier_name_or_path(self) -> str | None:
        return ((self.raw.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")

    @classmethod
    def from_dict(cls, d: dict) -> Eagle3Config:
        """Parse a speculators ``config.json`` dict.

        Raises:
            Eagle3ConfigError: not an eagle3 config, an unsupported layer type, or a missing/bad field.
        """
        if d.get("speculators_model_type") != "eagle3":
            raise Eagle3ConfigError(
                f"not an EAGLE-3 head: speculators_model_type is {d.get('speculators_model_type')!r}, expected 'eagle3'")
        layer_dict = dict(d.get("transformer_layer_config") or {})
        layer_type = layer_dict.get("model_type", "qwen3")
        if layer_type not in SUPPORTED_LAYER_TYPES:
            raise Eagle3ConfigError(
                f"unsupported EAGLE-3 decoder layer type {layer_type!r}: supported are {', '.join(SUPPORTED_LAYER_TYPES)}")
        from transformers import AutoConfig

        layer_dict.pop("model_type", None)
        layer = AutoConfig.for_model(layer_type, **layer_dict)
        if getattr(layer, "head_dim", None) is None:
            layer.head_dim = layer.hidden_size // layer.num_attention_heads
        ids = d.get("eagle_aux_hidden_state_layer_ids")
        if ids is not None and (not isinstance(ids, list) or not ids or any(not isinstance(i, int) for i in ids)):
            raise Eagle3ConfigError(f"eagle_aux_hidden_state_layer_ids must be a non-empty list of ints, got {ids!r}")
        if d.get("norm_before_fc") and d.get("fc_norm"):
            raise Eagle3ConfigError("norm_before_fc and fc_norm are mutually exclusive (speculators)")
        dv = d.get("draft_vocab_size", 32000)
        if not isinstance(dv, int) or dv < 1 or dv > layer.vocab_size:
            raise Eagle3ConfigError(f"draft_vocab_size {dv!r} must be an int in [1, {layer.vocab_size}] (the target vocabulary)")
        return cls(layer=layer, draft_vocab_size=dv, aux_layer_ids=list(ids) if ids else None,
                   norm_before_residual=bool(d.get("norm_before_residual", False)),
                   norm_before_fc=bool(d.get("norm_before_fc", False)), fc_norm=bool(d.get("fc_norm", False)),
                   norm_output=bool(d.get("norm_output", False)), target_hidden_size=d.get("target_hidden_size"),
                   raw=copy.deepcopy(d))

    def to_dict(self) -> dict:
        """The speculators ``config.json`` dict (unknown keys of :attr:`raw` kept; the layer config
        as its diff dict with ``model_type``, as speculators serializes it)."""
        d = copy.deepcopy(self.raw)
        layer = self.layer.to_diff_dict()
        layer["model_type"] = self.layer.model_type
        d.update({
            "speculators_model_type": "eagle3",
            "architectures": d.get("architectures") or ["Eagle3Speculator"],
            "transformer_layer_config": layer,
            "draft_vocab_size": self.draft_vocab_size,
            "norm_before_residual": self.norm_before_residual,
            "norm_before_fc": self.norm_before_fc,
            "fc_norm": self.fc_norm,
            "norm_output": self.norm_output,
            "target_hidden_size": self.target_hidden_size,
            "eagle_aux_hidden_state_layer_ids": self.aux_layer_ids,
        })
        d.setdefault("speculators_config", {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": None, "architectures": []},
        })
        d.setdefault("speculators_version", "0.9.0")
        return d

    def layer_ids_for(self, num_target_layers: int) -> list[int]:
        """The aux layer ids for a target with ``num_target_layers`` layers (config or default)."""
        return list(self.aux_layer_ids) if self.aux_layer_ids else default_layer_ids(num_target_layers)
