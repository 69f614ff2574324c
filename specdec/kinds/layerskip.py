"""The ``layerskip`` kind: the target's own first N layers + final norm + LM head (self-speculative decoding).

Specs: ``layerskip`` (N = half the target's layers) or ``layerskip:N``. The draft shares the target's
weights (:func:`specdec.models.layerskip.derive_layerskip`): no checkpoint of its own, re-derived from each
target version it is paired with, like a derived draft; its recipe ``{"num_layers": N}`` is the pair's
recipe. transformers serves it as ``assistant_early_exit=N``; vLLM, SGLang and llama.cpp have no such
method (their serving tables, :mod:`specdec.engines`, refuse it with the reason).
"""

from __future__ import annotations

from typing import Any

from specdec.kinds.base import DrafterKind, DrafterSpecError, RegisteredDrafter, ResolvedDrafter
from specdec.models.store import ModelStore

__all__ = ["LayerSkipKind"]

_FORM = "use layerskip or layerskip:N (N = decoder layers kept, >= 1)"


class LayerSkipKind(DrafterKind):
    """Early exit from the target itself (LayerSkip, Elhoushi et al. 2024; transformers' ``assistant_early_exit``)."""

    name = "layerskip"
    derives_from_target = True
    vllm_method = ""
    sglang_algorithm = ""

    def num_layers(self, spec: str) -> int | None:
        """N of ``layerskip:N`` (None for plain ``layerskip``: half the target's layers).

        Raises:
            DrafterSpecError: not this kind's spec, not an integer, or N < 1.
        """
        spec = spec.strip()
        if not self.owns(spec):
            raise DrafterSpecError(f"not a layer-skip spec: {spec!r} ({_FORM})")
        rest = spec.removeprefix(self.name).removeprefix(":")
        if not rest:
            return None
        if not rest.isdigit() or int(rest) < 1:
            raise DrafterSpecError(f"bad layer-skip spec {spec!r}: {_FORM}")
        return int(rest)

    def check(self, spec: str) -> str:
        self.num_layers(spec)
        return spec.strip()

    def pair_recipe(self, spec: str) -> dict | None:
        """``{"num_layers": N}`` (None for plain ``layerskip``: it depends on the target, resolved at load)."""
        n = self.num_layers(spec)
        return None if n is None else {"num_layers": n}

    def recipe_of(self, obj: Any) -> dict | None:
        recipe = getattr(obj, "derived_recipe", None)
        return recipe.to_dict() if recipe is not None else None

    def recipe_for(self, spec: str, target_layers: int) -> dict:
        """The recipe ``{"num_layers": N}`` of ``spec`` for a target of ``target_layers`` decoder layers (plain
        ``layerskip``: half of them), what a registered pair stores so it loads and serves the same N.

        Raises:
            DrafterSpecError: a bad spec, or N not below the target's layers.
        """
        n = self.num_layers(spec)
        n = n if n is not None else max(1, target_layers // 2)
        if n >= target_layers:
            raise DrafterSpecError(f"a layer-skip draft keeps fewer layers than the target: num_layers must be in "
                                   f"1..{target_layers - 1}, got {n}")
        return {"num_layers": n}

    def _built(self, target_model: Any, num_layers: int | None) -> ResolvedDrafter:
        from specdec.models.layerskip import LayerSkipRecipe, derive_layerskip, num_target_layers

        n = num_layers if num_layers is not None else self.recipe_for(self.name, num_target_layers(target_model))["num_layers"]
        recipe = LayerSkipRecipe(num_layers=n)
        try:
            draft = derive_layerskip(target_model, recipe)
        except ValueError as e:
            raise DrafterSpecError(str(e)) from None
        return ResolvedDrafter(drafter=draft, kind=self.name, ref=f"num_layers={n}", recipe=recipe.to_dict())

    def resolve(self, spec: str, target: Any, *, store: ModelStore, dtype=None,
                device=None) -> ResolvedDrafter:
        """The first N layers of ``target.model`` (shared weights).

        Raises:
            DrafterSpecError: a bad spec, N >= the target's layers, or an unsupported architecture.
        """
        return self._built(target.model, self.num_layers(spec))

    def load(self, reg: RegisteredDrafter, target: Any, loader, *, dtype=None, device=None) -> ResolvedDrafter:
        """Re-derive from the pair's target (``target.model``): the draft is always the served target's own layers."""
        return self._built(target.model, None if not reg.recipe else int(reg.recipe["num_layers"]))

    def cache_key(self, reg: RegisteredDrafter, loader) -> tuple:
        return (self.name, reg.target_key, repr(sorted((reg.recipe or {}).items())))

    def identity(self, label: str, weights_sha256: str | None, tokenizer_sha256: str | None) -> tuple[str, str, str]:
        return (label, "", tokenizer_sha256 or "")  # no weights of its own: the target's

    def compatibility_notes(self, label: str) -> list[str]:
        return ["layer-skip draft: the target's own first layers, embeddings and LM head (same tokenizer)"]

    def claims(self, obj: Any) -> bool:
        from specdec.models.layerskip import LayerSkipRecipe

        return isinstance(getattr(obj, "derived_recipe", None), LayerSkipRecipe)

    def draft_model(self, obj: Any) -> Any:
        return obj

    def describe(self, label: str, ref: str | None = None) -> str:
        return "layer-skip draft (the target's own first layers, shared weights)" + (f" {ref}" if ref else "")
