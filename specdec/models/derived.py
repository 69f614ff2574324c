"""Derived drafts: a weight-only quantized copy of the target, made with torchao.

A derived draft has no checkpoint of its own: it is the target plus a :class:`DerivedDraftRecipe`.
The recipe is stored with the pair, so the same draft can be derived again from a new target
version (this is how a draft goes stale after a target-only fine-tune: the old derived draft no
longer matches the new target).

Recipes that work with torchao 0.18 on CPU (measured on SmolLM2-135M-Instruct):

- ``int8``: ``Int8WeightOnlyConfig()`` (per-row int8 weights), α ≈ 0.96-0.98 vs the fp32 target;
- ``int4``: ``IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32))``, α ≈ 0.7-0.8.

In both the LM head stays in the target's dtype (``keep_lm_head_fp32``); embeddings are not
``nn.Linear`` and are never quantized. On CPU both drafts are *slower* than the fp32 target.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from typing import Literal

import torch

KINDS = ("int8", "int4")
_METHODS = {
    "int8": "torchao.quantization.Int8WeightOnlyConfig",
    "int4": "torchao.quantization.IntxWeightOnlyConfig(weight_dtype=int4, granularity=PerGroup)",
}
_DEFAULT_GROUP = {"int8": None, "int4": 32}


def _torchao_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torchao")
    except PackageNotFoundError:  # pragma: no cover
        return "unknown"


@dataclass(frozen=True)
class DerivedDraftRecipe:
    """How to derive a draft from a target (weight-only quantization with torchao).

    Attributes:
        kind: ``"int8"`` or ``"int4"``.
        method: the torchao config used (informational, for lineage).
        group_size: int4 quantization group size along the input dim (``None`` for int8, which is
            per output row).
        keep_lm_head_fp32: leave ``lm_head`` unquantized (in the target's dtype). Default True.
        torchao_version: torchao version that made (or will make) the draft.
    """

    kind: Literal["int8", "int4"] = "int8"
    method: str = ""
    group_size: int | None = None
    keep_lm_head_fp32: bool = True
    torchao_version: str = field(default_factory=_torchao_version)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown derived draft kind {self.kind!r}; use one of {', '.join(KINDS)}")
        if not self.method:
            object.__setattr__(self, "method", _METHODS[self.kind])
        if self.kind == "int4" and self.group_size is None:
            object.__setattr__(self, "group_size", _DEFAULT_GROUP["int4"])
        if self.group_size is not None and self.group_size <= 0:
            raise ValueError(f"group_size must be positive, got {self.group_size}")

    @property
    def spec(self) -> str:
        """The short CLI form, e.g. ``"derived:int8"``."""
        return f"derived:{self.kind}"

    def to_dict(self) -> dict:
        """JSON-serialisable dict (round-trips through :meth:`from_dict`)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "DerivedDraftRecipe":
        """Inverse of :meth:`to_dict`; unknown keys are ignored (forward compatibility)."""
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)

    @classmethod
    def from_spec(cls, spec: str) -> "DerivedDraftRecipe":
        """Parse ``"derived:int8"`` / ``"derived:int4"`` (or just ``"int8"`` / ``"int4"``).

        Raises:
            ValueError: not a derived-draft spec.
        """
        kind = spec.split(":", 1)[1] if spec.startswith("derived:") else spec
        if kind not in KINDS:
            raise ValueError(f"not a derived draft spec: {spec!r} (use derived:int8 or derived:int4)")
        return cls(kind=kind)

    def torchao_config(self):
        """The torchao ``AOBaseConfig`` this recipe applies."""
        from torchao.quantization import Int8WeightOnlyConfig, IntxWeightOnlyConfig
        from torchao.quantization.granularity import PerGroup

        if self.kind == "int8":
            return Int8WeightOnlyConfig(set_inductor_config=False)
        return IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(self.group_size))


def is_derived_spec(spec: str) -> bool:
    """True for ``"derived:int8"`` / ``"derived:int4"``-style draft specs."""
    return isinstance(spec, str) and spec.startswith("derived:")


def _storage_ptrs(module: torch.nn.Module) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in list(module.parameters()) + list(module.buffers())
            if t.device.type != "meta"}


def derive_draft(target_model: torch.nn.Module, recipe: DerivedDraftRecipe) -> torch.nn.Module:
    """A weight-only quantized deep copy of ``target_model``; the target is left untouched.

    Every ``nn.Linear`` of the copy except ``lm_head`` (when ``recipe.keep_lm_head_fp32``) gets
    torchao's weight-only quantization; activations stay in the model's dtype. With tied
    embeddings (SmolLM2), the copy's ``lm_head`` and ``embed_tokens`` keep sharing one unquantized
    tensor; if the head is to be quantized it is first untied in the copy.

    Args:
        target_model: a ``transformers`` causal LM (any device/dtype torchao supports there).
        recipe: what to apply.
    Returns:
        The draft ``nn.Module`` in eval mode, same device, with attribute ``derived_recipe``.
    Raises:
        ValueError: the group size does not divide a layer's input dimension.
        RuntimeError: the copy would share storage with the target (never expected).
    """
    from torchao.quantization import quantize_

    draft = copy.deepcopy(target_model)
    shared = _storage_ptrs(draft) & _storage_ptrs(target_model)
    if shared:
        raise RuntimeError(f"deep copy shares {len(shared)} storages with the target; refusing to quantize")

    head = draft.get_output_embeddings() if hasattr(draft, "get_output_embeddings") else None
    if head is not None and not recipe.keep_lm_head_fp32:
        emb = draft.get_input_embeddings()
        if emb is not None and head.weight is emb.weight:  # untie in the copy only
            head.weight = torch.nn.Parameter(head.weight.detach().clone())
            if hasattr(draft.config, "tie_word_embeddings"):
                draft.config.tie_word_embeddings = False

    if recipe.group_size is not None and recipe.kind == "int4":
        for name, mod in draft.named_modules():
            if isinstance(mod, torch.nn.Linear) and (mod is not head or not recipe.keep_lm_head_fp32):
                if mod.in_features % recipe.group_size:
                    raise ValueError(f"group_size {recipe.group_size} does not divide in_features "
                                     f"{mod.in_features} of {name}")

    def keep(mod: torch.nn.Module, fqn: str) -> bool:
        if not isinstance(mod, torch.nn.Linear):
            return False
        return not (recipe.keep_lm_head_fp32 and (mod is head or fqn.endswith("lm_head")))

    quantize_(draft, recipe.torchao_config(), filter_fn=keep)
    draft.eval()
    draft.derived_recipe = recipe
    return draft
