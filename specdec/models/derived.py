"""Derived drafts: a lower-precision copy of the target (a cast, or torchao quantization).

A derived draft has no checkpoint of its own: it is the target plus a :class:`DerivedDraftRecipe`.
The recipe is stored with the pair, so the same draft can be derived again from a new target
version (this is how a draft goes stale after a target-only fine-tune: the old derived draft no
longer matches the new target).

Recipes that work with torchao 0.18 on CPU (measured on SmolLM2-135M-Instruct):

- ``int8``: ``Int8WeightOnlyConfig()`` (per-row int8 weights), α ≈ 0.96-0.98 vs the fp32 target;
- ``int4``: ``IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32))``, α ≈ 0.7-0.8.

In both the LM head stays in the target's dtype (``keep_lm_head_fp32``); embeddings are not
``nn.Linear`` and are never quantized. On CPU both drafts are *slower* than the fp32 target.

Precision recipes (the recipe records ``dtype``):

- ``bf16``: the whole target cast to bfloat16 (``Module.to(torch.bfloat16)``, LM head and
  embeddings included). On a CPU with native bf16 (AVX512-BF16 / AMX-BF16) a bf16 copy of an fp32
  SmolLM2 runs a decode pass in 0.3-0.45 of the target's time with α ≈ 0.95-0.99: a draft that
  pays. On the CPU its one-token passes skip oneDNN (:mod:`specdec.models.cpu_kernels`: ATen's bf16
  GEMV is about twice as fast there; with oneDNN c was 0.6-0.8 and the draft did not pay).
  Without native bf16 it is emulated and usually slower than the target
  (:func:`specdec.validation.machine.native_bf16`).
- ``fp8``: torchao float8 (e4m3) weights for every ``nn.Linear`` but the LM head
  (``Float8WeightOnlyConfig``), the GPU analogue of ``bf16`` for a bf16 target. Needs CUDA with
  compute capability >= 8.9 (Ada, Hopper or newer); anywhere else :func:`derive_draft` raises
  :class:`UnsupportedRecipeError` naming what is missing.
"""

from __future__ import annotations

import copy
import weakref
from dataclasses import asdict, dataclass, field
from typing import Literal

import torch

from specdec.models.cpu_kernels import use_gemv_for_single_row

KINDS = ("int8", "int4", "bf16", "fp8")
_METHODS = {
    "int8": "torchao.quantization.Int8WeightOnlyConfig",
    "int4": "torchao.quantization.IntxWeightOnlyConfig(weight_dtype=int4, granularity=PerGroup)",
    "bf16": "torch.nn.Module.to(torch.bfloat16)",
    "fp8": "torchao.quantization.Float8WeightOnlyConfig",
}
_DEFAULT_GROUP = {"int8": None, "int4": 32, "bf16": None, "fp8": None}
#: dtype of the draft's weights/activations recorded in the recipe (None: the target's dtype with
#: quantized weights, for int8/int4, which predate the field and keep their recipe hash).
_DTYPES = {"int8": None, "int4": None, "bf16": "bfloat16", "fp8": "float8_e4m3fn"}
#: CUDA compute capability float8 matmuls need (Ada Lovelace / Hopper).
FP8_MIN_CAPABILITY = (8, 9)


class UnsupportedRecipeError(ValueError):
    """The recipe cannot run on this device (e.g. ``derived:fp8`` without a float8-capable GPU)."""


def _torchao_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torchao")
    except PackageNotFoundError:  # pragma: no cover
        return "unknown"


@dataclass(frozen=True)
class DerivedDraftRecipe:
    """How to derive a draft from a target (a dtype cast, or torchao weight quantization).

    Attributes:
        kind: ``"int8"``, ``"int4"``, ``"bf16"`` or ``"fp8"``.
        method: the cast or torchao config used (informational, for lineage).
        group_size: int4 quantization group size along the input dim (``None`` otherwise; int8 is
            per output row).
        keep_lm_head_fp32: leave ``lm_head`` in the target's dtype. Default True, except for
            ``bf16`` where the whole model (head included) is cast; ``bf16`` refuses True.
        torchao_version: torchao version that made (or will make) the draft.
        dtype: the draft's precision, recorded for lineage: ``"bfloat16"`` for ``bf16``,
            ``"float8_e4m3fn"`` for ``fp8``, ``None`` for int8/int4 (target dtype, quantized
            weights). Set from ``kind``; a conflicting value raises ``ValueError``.
    """

    kind: Literal["int8", "int4", "bf16", "fp8"] = "int8"
    method: str = ""
    group_size: int | None = None
    keep_lm_head_fp32: bool | None = None
    torchao_version: str = field(default_factory=_torchao_version)
    dtype: str | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown derived draft kind {self.kind!r}; use one of {', '.join(KINDS)}")
        if not self.method:
            object.__setattr__(self, "method", _METHODS[self.kind])
        if self.kind == "int4" and self.group_size is None:
            object.__setattr__(self, "group_size", _DEFAULT_GROUP["int4"])
        if self.group_size is not None and self.group_size <= 0:
            raise ValueError(f"group_size must be positive, got {self.group_size}")
        if self.group_size is not None and self.kind != "int4":
            raise ValueError(f"group_size applies to int4 only, not {self.kind}")
        if self.keep_lm_head_fp32 is None:
            object.__setattr__(self, "keep_lm_head_fp32", self.kind != "bf16")
        if self.kind == "bf16" and self.keep_lm_head_fp32:
            raise ValueError("derived:bf16 casts the whole model (LM head included); keep_lm_head_fp32 must be False")
        want = _DTYPES[self.kind]
        if self.dtype is None:
            object.__setattr__(self, "dtype", want)
        elif self.dtype != want:
            raise ValueError(f"derived:{self.kind} has dtype {want}, got {self.dtype!r}")

    @property
    def adopts_target_prefix(self) -> bool:
        """Whether decoding lets this draft adopt its source target's prompt KV instead of a
        prefill of its own (:class:`specdec.core.drafters.ModelDrafter`): the speed recipes
        ``bf16`` / ``fp8``; int8/int4 drafts keep their own prefill."""
        return self.kind in ("bf16", "fp8")

    @property
    def spec(self) -> str:
        """The short CLI form, e.g. ``"derived:int8"``."""
        return f"derived:{self.kind}"

    def to_dict(self) -> dict:
        """JSON-serialisable dict (round-trips through :meth:`from_dict`). ``dtype`` is left out
        when ``None`` (int8/int4), so those recipes keep the dict, and the hash, they always had."""
        d = asdict(self)
        if d["dtype"] is None:
            del d["dtype"]
        return d

    @classmethod
    def from_dict(cls, data: dict) -> "DerivedDraftRecipe":
        """Inverse of :meth:`to_dict`; unknown keys are ignored (forward compatibility)."""
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)

    @classmethod
    def from_spec(cls, spec: str) -> "DerivedDraftRecipe":
        """Parse ``"derived:<kind>"`` (or just ``"<kind>"``) for a precision in :data:`KINDS`. The label's
        form (which prefix names the derived drafter kind) is :mod:`specdec.kinds.derived`'s; this reads
        the precision after the last ``:``.

        Raises:
            ValueError: not a derived-draft spec.
        """
        kind = spec.rpartition(":")[2]
        if kind not in KINDS:
            raise ValueError(f"not a derived draft spec: {spec!r} (use one of "
                             f"{', '.join('derived:' + k for k in KINDS)})")
        return cls(kind=kind)

    def torchao_config(self):
        """The torchao ``AOBaseConfig`` this recipe applies (``None`` for ``bf16``, a plain cast)."""
        if self.kind == "bf16":
            return None
        if self.kind == "fp8":
            from torchao.quantization import Float8WeightOnlyConfig

            return Float8WeightOnlyConfig()
        from torchao.quantization import Int8WeightOnlyConfig, IntxWeightOnlyConfig
        from torchao.quantization.granularity import PerGroup

        if self.kind == "int8":
            return Int8WeightOnlyConfig(set_inductor_config=False)
        return IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(self.group_size))


def recipe_support(recipe: DerivedDraftRecipe, device: torch.device | str) -> str | None:
    """Why ``recipe`` cannot run on ``device``, or ``None`` when it can.

    ``fp8`` needs CUDA with compute capability >= :data:`FP8_MIN_CAPABILITY`; the others run
    anywhere torch and torchao run (``bf16`` may be slow without native bf16:
    :func:`specdec.validation.machine.native_bf16` says).
    """
    if recipe.kind != "fp8":
        return None
    dev = torch.device(device)
    if dev.type != "cuda":
        return (f"derived:fp8 needs a CUDA GPU with float8 support (compute capability >= "
                f"{FP8_MIN_CAPABILITY[0]}.{FP8_MIN_CAPABILITY[1]}, e.g. L4/L40/H100); the target is on "
                f"{dev.type}. On a CPU with native bf16 use derived:bf16")
    cap = torch.cuda.get_device_capability(dev)
    if tuple(cap) < FP8_MIN_CAPABILITY:
        return (f"derived:fp8 needs compute capability >= {FP8_MIN_CAPABILITY[0]}.{FP8_MIN_CAPABILITY[1]}; "
                f"{torch.cuda.get_device_name(dev)} has {cap[0]}.{cap[1]}. Use derived:int8 or a bf16 target's "
                "derived:bf16 instead")
    return None


def _storage_ptrs(module: torch.nn.Module) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in list(module.parameters()) + list(module.buffers())
            if t.device.type != "meta"}


def derive_draft(target_model: torch.nn.Module, recipe: DerivedDraftRecipe) -> torch.nn.Module:
    """A lower-precision deep copy of ``target_model``; the target is left untouched.

    ``bf16``: the copy is cast to bfloat16 as a whole (weights, buffers, LM head), so its forward
    runs in bf16 and returns bf16 logits; on the CPU its one-row passes use ATen's GEMV instead of
    oneDNN (:func:`specdec.models.cpu_kernels.use_gemv_for_single_row`). ``int8`` / ``int4`` /
    ``fp8``: every ``nn.Linear`` of the copy except ``lm_head`` (when ``recipe.keep_lm_head_fp32``) gets torchao's weight-only
    quantization; activations stay in the model's dtype. With tied embeddings (SmolLM2), the copy's
    ``lm_head`` and ``embed_tokens`` keep sharing one unquantized tensor; if the head is to be
    quantized it is first untied in the copy.

    Args:
        target_model: a ``transformers`` causal LM (any device/dtype torchao supports there).
        recipe: what to apply.
    Returns:
        The draft ``nn.Module`` in eval mode, same device, with attributes ``derived_recipe`` and
        ``derived_source`` (a weak reference to ``target_model``: the decoding core lets a draft
        derived from the very target it serves adopt that target's prompt KV cache).
    Raises:
        UnsupportedRecipeError: the recipe cannot run on the target's device (``fp8`` off a
            float8-capable GPU), raised before anything is copied.
        ValueError: the group size does not divide a layer's input dimension.
        RuntimeError: the copy would share storage with the target (never expected).
    """
    why = recipe_support(recipe, next(target_model.parameters()).device)
    if why is not None:
        raise UnsupportedRecipeError(why)
    draft = copy.deepcopy(target_model)
    shared = _storage_ptrs(draft) & _storage_ptrs(target_model)
    if shared:
        raise RuntimeError(f"deep copy shares {len(shared)} storages with the target; refusing to quantize")
    if recipe.kind == "bf16":
        draft.to(torch.bfloat16)
        if next(draft.parameters()).device.type == "cpu":
            use_gemv_for_single_row(draft)  # oneDNN off for one-row passes: c 0.6-0.8 -> 0.3-0.45 here
        draft.eval()
        draft.derived_recipe = recipe
        draft.derived_source = weakref.ref(target_model)
        return draft
    from torchao.quantization import quantize_

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
    draft.derived_source = weakref.ref(target_model)  # lets the core share the prompt prefill
    return draft
