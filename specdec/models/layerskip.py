"""Self-speculative drafts: the target's own first N decoder layers, its final norm and its LM head.

The draft is built from the target's modules (no copy, no weights of its own: LayerSkip, Elhoushi et al.
2024; transformers' ``assistant_early_exit=N``; Draft & Verify, Zhang et al. 2023): embeddings, decoder
layers ``0 .. N-1``, final norm, LM head, all *shared* with the target. It costs about ``N / L`` of a
target pass plus the LM head, on any device and in any dtype the target runs in, so it pays where
weight-only quantized copies do not (a bf16 target on a GPU, where int8/fp8 weight-only copies of a small
model are slower than the target). Its KV cache for a prompt is exactly the target's first N layers'
cache, so it adopts the target's prompt prefill (:class:`~specdec.core.drafters.ModelDrafter`).

Like the derived drafts (:mod:`specdec.models.derived`) it is the target plus a recipe
(:class:`LayerSkipRecipe`, ``num_layers``), re-derived from every target version it is paired with; as it
shares the target's weights, it follows a fine-tuned target at once (it can never be a stale copy).

Supported: decoder-only transformers causal LMs whose base model holds ``layers`` (a ``ModuleList``) and
``norm`` (Llama, Mistral, Qwen2/3, Gemma, Phi-3, SmolLM, ...); others raise :class:`ValueError`.
"""

from __future__ import annotations

import copy
import weakref
from dataclasses import asdict, dataclass

import torch

__all__ = ["LayerSkipRecipe", "derive_layerskip", "num_target_layers"]


@dataclass(frozen=True)
class LayerSkipRecipe:
    """The draft = the target's first ``num_layers`` decoder layers + final norm + LM head (shared weights).

    Attributes:
        num_layers: decoder layers kept (1 .. L - 1 for a target of L layers; checked at derivation).
        method: informational, for lineage.
    Raises:
        ValueError: ``num_layers`` < 1.
    """

    num_layers: int
    method: str = "early exit: target layers [0, num_layers) + final norm + lm_head, weights shared"

    def __post_init__(self):
        if isinstance(self.num_layers, bool) or not isinstance(self.num_layers, int) or self.num_layers < 1:
            raise ValueError(f"num_layers must be an integer >= 1, got {self.num_layers!r}")

    @property
    def adopts_target_prefix(self) -> bool:
        """The draft's prompt KV is the target's first ``num_layers`` layers' KV: always adopted."""
        return True

    def to_dict(self) -> dict:
        """JSON-serialisable dict (round-trips through :meth:`from_dict`)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "LayerSkipRecipe":
        """Inverse of :meth:`to_dict`; unknown keys are ignored. Raises ValueError: bad ``num_layers``."""
        return cls(num_layers=int(data["num_layers"]), **({"method": data["method"]} if "method" in data else {}))


def _decoder(model: torch.nn.Module) -> torch.nn.Module:
    """The base model holding ``layers`` and ``norm``. Raises ValueError: not such a model."""
    base = getattr(model, getattr(model, "base_model_prefix", "model"), None)
    if base is None or not isinstance(getattr(base, "layers", None), torch.nn.ModuleList) or getattr(base, "norm", None) is None:
        raise ValueError(f"{type(model).__name__} has no <base>.layers and <base>.norm: a layer-skip draft needs a "
                         "decoder-only model of the Llama family (Llama, Mistral, Qwen2/3, Gemma, Phi-3, SmolLM)")
    return base


def num_target_layers(model: torch.nn.Module) -> int:
    """The number of decoder layers of ``model``. Raises ValueError: unsupported architecture."""
    return len(_decoder(model).layers)


def derive_layerskip(target_model: torch.nn.Module, recipe: LayerSkipRecipe) -> torch.nn.Module:
    """A causal LM of the same class as ``target_model`` running its first ``recipe.num_layers`` layers.

    Nothing is copied: the returned module's embeddings, layers, rotary embedding, final norm and LM head
    are the target's own modules (same tensors; a fine-tune of the target changes the draft too). Its
    config is the target's with ``num_hidden_layers`` (and ``layer_types``) cut to ``num_layers``.

    Args:
        target_model: a transformers decoder-only causal LM (any device and dtype).
        recipe: how many layers to keep.
    Returns:
        The draft in eval mode, with ``derived_recipe`` (the recipe) and ``derived_source`` (a weak reference
        to ``target_model``: the decoding core lets it adopt that target's prompt KV cache).
    Raises:
        ValueError: an unsupported architecture, or ``num_layers`` >= the target's layers.
    """
    base = _decoder(target_model)
    total = len(base.layers)
    if recipe.num_layers >= total:
        raise ValueError(f"a layer-skip draft keeps fewer layers than the target: num_layers must be in 1..{total - 1}, "
                         f"got {recipe.num_layers}")
    config = copy.deepcopy(target_model.config)
    config.num_hidden_layers = recipe.num_layers
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = config.layer_types[: recipe.num_layers]
    with torch.device("meta"):
        draft = type(target_model)(config)
    draft_base = _decoder(draft)
    for name, child in base.named_children():  # embeddings, rotary embedding, norm, ...: the target's own
        setattr(draft_base, name, child)
    draft_base.layers = torch.nn.ModuleList(list(base.layers)[: recipe.num_layers])
    for name, child in target_model.named_children():  # lm_head (and anything else beside the base model)
        if child is not base:
            setattr(draft, name, child)
    left = [n for n, t in list(draft.named_parameters()) + list(draft.named_buffers()) if t.device.type == "meta"]
    if left:
        raise ValueError(f"could not share every module of {type(target_model).__name__} with its layer-skip draft: {left[:3]}")
    draft.eval()
    draft.derived_recipe = recipe
    draft.derived_source = weakref.ref(target_model)
    return draft
