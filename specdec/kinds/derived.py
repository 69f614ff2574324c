"""The ``derived`` kind: a lower-precision copy of the target (``derived:<int8|int4|bf16|fp8>``).

The draft has no checkpoint of its own: it is the target plus a
:class:`~specdec.models.derived.DerivedDraftRecipe` (:func:`~specdec.models.derived.derive_draft`), and
the stored label carries the precision (``derived:int8``, ...). The precision names are the recipe's
(:data:`specdec.models.derived.KINDS`); comparing a recipe's precision (``recipe.kind == "int4"``) is
the recipe module's business, not a drafter-kind comparison.
"""

from __future__ import annotations

from typing import Any

from specdec.kinds.base import DrafterKind, DrafterSpecError, RegisteredDrafter, ResolvedDrafter
from specdec.models.store import ModelStore

__all__ = ["DerivedKind"]


class DerivedKind(DrafterKind):
    """The target cast (bf16), or its weights quantized (int8, int4, fp8), re-derived per target version."""

    name = "derived"
    derives_from_target = True

    def precision(self, spec: str) -> str:
        """The precision of ``derived:<precision>`` (the recipe's ``kind``; checked against the recipes).

        Raises:
            DrafterSpecError: not one of the recipes (the message lists them).
        """
        return self.recipe(spec).kind

    def recipe(self, spec: str):
        """The :class:`~specdec.models.derived.DerivedDraftRecipe` a ``derived:<precision>`` spec names.

        Raises:
            DrafterSpecError: not one of the recipes.
        """
        from specdec.models.derived import KINDS, DerivedDraftRecipe

        precision = spec.strip().removeprefix(self.name + ":")
        if precision not in KINDS or not self.owns(spec.strip()):
            raise DrafterSpecError(f"not a derived draft spec: {spec!r} (use one of "
                                   f"{', '.join(self.label_of(k) for k in KINDS)})")
        return DerivedDraftRecipe(kind=precision)

    def label_of(self, precision: str) -> str:
        """The stored label of a precision (``int8`` -> ``derived:int8``)."""
        return f"{self.name}:{precision}"

    def labels(self) -> tuple[str, ...]:
        from specdec.models.derived import KINDS

        return tuple(self.label_of(k) for k in KINDS)

    def check(self, spec: str) -> str:
        self.recipe(spec)
        return spec.strip()

    def label(self, spec: str) -> str:
        return self.label_of(self.precision(spec))

    def slug(self, spec: str) -> str:
        return self.precision(spec)

    def reuse_spec(self, spec: str, version_uri: str) -> str:
        return version_uri  # the derived-recipe version: lineage to the target it was derived from

    def resolve(self, spec: str, target: Any, *, store: ModelStore, dtype=None,
                device=None) -> ResolvedDrafter:
        """Derive the draft from ``target.model`` (the recipe travels with it).

        Raises:
            DrafterSpecError: bad precision. specdec.models.derived.UnsupportedRecipeError: not on this device.
        """
        from specdec.models.derived import derive_draft

        recipe = self.recipe(spec)
        return ResolvedDrafter(drafter=derive_draft(target.model, recipe), kind=self.label_of(recipe.kind),
                               recipe=recipe.to_dict())

    def load(self, reg: RegisteredDrafter, target: Any, loader, *, dtype=None, device=None) -> ResolvedDrafter:
        """Re-derive from the target version the draft was derived from (``reg.base_uri``, with the LoRA adapter it
        was derived with, ``reg.base_adapter``; shared with the target's load when it is the pair's target): a stale
        derived draft stays stale."""
        from specdec.models.derived import DerivedDraftRecipe, derive_draft

        base = loader.checkpoint(reg.base_uri, shared=True, adapter=reg.base_adapter)
        r = DerivedDraftRecipe.from_dict(reg.recipe) if reg.recipe else self.recipe(reg.label)
        return ResolvedDrafter(drafter=derive_draft(base.model, r), kind=reg.label, ref=reg.base_uri, recipe=r.to_dict())

    def cache_key(self, reg: RegisteredDrafter, loader) -> tuple:
        key = ("derived", reg.base_uri, loader.weights_sha256(reg.base_uri), reg.label,
               repr(sorted((reg.recipe or {}).items())), reg.device, reg.dtype)
        return key + (("lora", reg.base_adapter["weights_sha256"]),) if reg.base_adapter else key

    def registered_draft_problem(self, label: str, uri: str, artifact: str, recipe: dict | None) -> str | None:
        want = self.precision(label)
        if artifact != "derived-recipe" or (recipe or {}).get("kind") != want:
            return (f"drafter kind {label} needs a draft registered with register_derived_draft(kind={want!r}); "
                    f"{uri} is a {artifact} ({(recipe or {}).get('kind', 'no recipe')})")
        return None

    def same_as_target(self, label: str, target_dtype: Any) -> str | None:
        import torch

        if self.precision(label) == "bf16" and target_dtype == torch.bfloat16:
            return "the target already runs in bf16: its bf16 copy is the target"
        return None

    def serving_note(self, label: str) -> str | None:
        """How an engine serves a derived draft (the target's checkpoint + the recipe)."""
        how = self.precision(label)
        if how == "bf16":
            return (f"{label} is the target cast to bf16: an engine that already runs the target in bf16 would draft "
                    "with the target itself (cost ratio c = 1), which cannot pay; there, validate another draft")
        return (f"{label} is the target with {how} weights: load the target checkpoint as the draft with the engine's "
                f"{how} weight-only quantization, or save the quantized copy and point `model` at it")

    def claims(self, obj: Any) -> bool:
        return False  # a derived draft is a causal LM: decoding objects are the model kind's

    def describe(self, label: str, ref: str | None = None) -> str:
        return f"{label} (the target with {self.precision(label)} weights)"
