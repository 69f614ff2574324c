"""The ``ngram`` kind: prompt lookup (Saxena 2023), vLLM's ``ngram`` method; no model, no weights.

Specs: ``ngram`` / ``ngram:N`` / ``ngram:N:M`` (``max_ngram=N``, default 3; ``min_ngram=M``, default 2: the
faster choice on a CPU, see NgramDrafter; ``ngram:3:1`` is the classic prompt lookup), run as
:class:`specdec.core.drafters.NgramDrafter`. The stored label is ``ngram`` whatever the sizes; a registered
pair keeps the sizes as its recipe (``{"max_ngram": N, "min_ngram": M}``, tag ``drafter_recipe``), and a pair
registered before recipes were stored ran the then default ``3:1`` (:attr:`NgramKind.legacy_recipe`).
"""

from __future__ import annotations

from typing import Any

from specdec.kinds.base import DrafterKind, DrafterSpecError, RegisteredDrafter, ResolvedDrafter
from specdec.models.store import ModelStore

__all__ = ["NgramKind"]

_FORMS = "use ngram, ngram:MAX or ngram:MAX:MIN"


class NgramKind(DrafterKind):
    """Copy the continuation of an earlier occurrence of the context's suffix."""

    name = "ngram"
    model_free = True
    beside_served_target = True
    vllm_method = "ngram"
    sglang_algorithm = "NGRAM"
    legacy_recipe = {"max_ngram": 3, "min_ngram": 1}

    def sizes(self, spec: str) -> tuple[int, int]:
        """``(max_ngram, min_ngram)`` of a spec.

        Raises:
            DrafterSpecError: not integers, more than two, or out of range.
        """
        parts = spec.strip().split(":")[1:]
        try:
            sizes = [int(x) for x in parts]
        except ValueError:
            raise DrafterSpecError(f"bad n-gram spec {spec!r}: {_FORMS}") from None
        if len(sizes) > 2:
            raise DrafterSpecError(f"bad n-gram spec {spec!r}: {_FORMS}")
        from specdec.core.drafters import NgramDrafter

        max_n = sizes[0] if sizes else NgramDrafter.DEFAULT_MAX_NGRAM
        min_n = sizes[1] if len(sizes) > 1 else min(NgramDrafter.DEFAULT_MIN_NGRAM, max_n)
        return self._checked(max_n, min_n, f"spec {spec!r}")

    @staticmethod
    def _checked(max_n: int, min_n: int, what: str) -> tuple[int, int]:
        if min_n < 1 or max_n < min_n:
            raise DrafterSpecError(f"bad n-gram {what}: need 1 <= min_ngram <= max_ngram, got {min_n}, {max_n}")
        return max_n, min_n

    @staticmethod
    def _recipe(max_n: int, min_n: int) -> dict:
        return {"max_ngram": max_n, "min_ngram": min_n}

    def check(self, spec: str) -> str:
        self.sizes(spec)
        return spec.strip()

    def pair_recipe(self, spec: str) -> dict:
        """``{"max_ngram": N, "min_ngram": M}`` of a spec (defaults filled in; :meth:`sizes` raises)."""
        return self._recipe(*self.sizes(spec))

    def recipe_of(self, obj: Any) -> dict:
        return self._recipe(obj.max_ngram, obj.min_ngram)

    def sizes_of(self, recipe: dict | None) -> tuple[int, int]:
        """``(max_ngram, min_ngram)`` of a recipe; None is the defaults.

        Raises:
            DrafterSpecError: a recipe without integer sizes, or sizes out of range.
        """
        if recipe is None:
            return self.sizes(self.name)
        try:
            max_n, min_n = int(recipe["max_ngram"]), int(recipe["min_ngram"])
        except (KeyError, TypeError, ValueError):
            raise DrafterSpecError(f"bad n-gram recipe {recipe!r}: need integer max_ngram and min_ngram") from None
        return self._checked(max_n, min_n, f"recipe {recipe!r}")

    def _built(self, recipe: dict | None) -> ResolvedDrafter:
        from specdec.core.drafters import NgramDrafter

        max_n, min_n = self.sizes_of(recipe)
        return ResolvedDrafter(drafter=NgramDrafter(max_ngram=max_n, min_ngram=min_n), kind=self.name,
                               ref=f"max_ngram={max_n},min_ngram={min_n}", recipe=self._recipe(max_n, min_n))

    def resolve(self, spec: str, target: Any = None, *, store: ModelStore, dtype=None,
                device=None) -> ResolvedDrafter:
        return self._built(self.pair_recipe(spec))

    def load(self, reg: RegisteredDrafter, target: Any, loader, *, dtype=None, device=None) -> ResolvedDrafter:
        return self._built(reg.recipe)

    def cache_key(self, reg: RegisteredDrafter, loader) -> tuple:
        return (self.name, *self.sizes_of(reg.recipe))  # no weights: one per worker and sizes

    def compatibility_notes(self, label: str) -> list[str]:
        return ["n-gram drafter: proposes target-tokenizer ids copied from the context"]

    def claims(self, obj: Any) -> bool:
        from specdec.core.drafters import NgramDrafter

        return isinstance(obj, NgramDrafter)

    def describe(self, label: str, ref: str | None = None) -> str:
        return "n-gram drafter (prompt lookup, no model)" + (f" {ref}" if ref and ref != self.name else "")

    def finding(self, group: Any) -> str | None:
        g = group
        return ("n-gram drafter: alpha_tf/top-1/TV are over the positions where the lookup proposes "
                f"(coverage {g.tf_coverage:.0%}); KL is undefined for a one-hot q; the predicted speedup "
                f"counts the steps as they ran: {g.draft_tokens_per_step:.2f} of k={g.num_speculative_tokens} "
                "tokens proposed per draft step on average, misses as plain target steps")
