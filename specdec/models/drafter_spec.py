"""Turn a drafter spec string (``ngram``, ``derived:int8``, ``model:<ref>``, ...) into a drafter.

Specs, as accepted by ``specdec validate --draft``:

- ``ngram`` / ``ngram:N`` / ``ngram:N:M``: prompt-lookup drafter (:class:`~specdec.NgramDrafter`,
  ``max_ngram=N`` (default 3), ``min_ngram=M`` (default 1)); no model.
- ``derived:int8`` / ``derived:int4`` / ``derived:bf16`` / ``derived:fp8``: a lower-precision copy of
  the target (:func:`specdec.models.derived.derive_draft`); the recipe travels with the drafter.
- ``model:<ref>`` or a plain ``<ref>``: a draft causal LM loaded with
  :func:`specdec.load_causal_lm` (local dir, Hub id, ``.gguf``, ``smollm2``), checked with
  :func:`specdec.check_pair_compatible`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["DrafterSpecError", "ResolvedDrafter", "resolve_drafter"]


class DrafterSpecError(ValueError):
    """The drafter spec string cannot be parsed."""


@dataclass
class ResolvedDrafter:
    """A drafter ready for :func:`specdec.speculative_generate` / :func:`specdec.validation.validate_pair`.

    Attributes:
        drafter: a transformers causal LM (``model``, ``derived:*``) or an ``NgramDrafter``.
        kind: ``"model"``, ``"ngram"``, ``"derived:<int8|int4|bf16|fp8>"``.
        ref: the draft model reference (``model``), the n-gram sizes (``ngram``), or ``None``.
        recipe: the :class:`~specdec.models.derived.DerivedDraftRecipe` as a dict (derived drafts only).
        loaded: the :class:`~specdec.models.LoadedModel` of a ``model`` drafter.
        compatibility: the :class:`~specdec.models.CompatibilityResult` as a dict (``model`` only).
    """

    drafter: Any
    kind: str
    ref: str | None = None
    recipe: dict | None = None
    loaded: Any = None
    compatibility: dict | None = None


def check_drafter_spec(spec: str) -> str:
    """Check a drafter spec's syntax without loading anything (so a CLI refuses ``derived:int3``
    before the target loads). Returns the stripped spec; ``auto`` passes.

    Raises:
        DrafterSpecError: empty or malformed spec (the message names the accepted forms).
    """
    spec = (spec or "").strip()
    if not spec:
        raise DrafterSpecError("empty drafter spec: use ngram, derived:int8, derived:int4, derived:bf16, derived:fp8 or model:<ref>")
    if spec == "ngram" or spec.startswith("ngram:"):
        _ngram(spec)
    elif spec.startswith("derived:"):
        from specdec.models.derived import DerivedDraftRecipe

        try:
            DerivedDraftRecipe.from_spec(spec)
        except ValueError as e:
            raise DrafterSpecError(str(e)) from e
    elif spec == "model:":
        raise DrafterSpecError("model: needs a reference, e.g. model:./my-draft or model:org/name")
    return spec


def resolve_drafter(
    spec: str,
    target: Any,
    *,
    dtype: torch.dtype | str | None = None,
    device: str | torch.device | None = None,
) -> ResolvedDrafter:
    """Build the drafter a spec names, for ``target``.

    Args:
        spec: see the module docstring.
        target: the :class:`~specdec.models.LoadedModel` of the target (model + tokenizer).
        dtype, device: for a ``model`` drafter; default to the target model's dtype and device.
    Returns:
        :class:`ResolvedDrafter`.
    Raises:
        DrafterSpecError: empty or malformed spec (e.g. ``derived:int3``, ``ngram:x``).
        specdec.models.ModelNotFoundError: the draft model reference cannot be found.
        specdec.IncompatiblePairError: the draft's tokenizer/vocabulary does not match the target's.
    """
    spec = (spec or "").strip()
    if not spec:
        raise DrafterSpecError("empty drafter spec: use ngram, derived:int8, derived:int4, derived:bf16, derived:fp8 or model:<ref>")
    if spec == "ngram" or spec.startswith("ngram:"):
        return _ngram(spec)
    if spec.startswith("derived:"):
        from specdec.models.derived import DerivedDraftRecipe, derive_draft

        try:
            recipe = DerivedDraftRecipe.from_spec(spec)
        except ValueError as e:
            raise DrafterSpecError(str(e)) from e
        draft = derive_draft(target.model, recipe)
        return ResolvedDrafter(drafter=draft, kind=f"derived:{recipe.kind}", recipe=recipe.to_dict())
    ref = spec.removeprefix("model:")
    if not ref:
        raise DrafterSpecError("model: needs a reference, e.g. model:./my-draft or model:org/name")
    from specdec.models import check_loaded_pair, load_causal_lm

    p = next(target.model.parameters())
    loaded = load_causal_lm(ref, dtype=dtype or p.dtype, device=device or p.device)
    compat = check_loaded_pair(target, loaded)
    return ResolvedDrafter(
        drafter=loaded.model,
        kind="model",
        ref=str(loaded.source.get("ref") or ref),
        loaded=loaded,
        compatibility=compat.to_dict() if hasattr(compat, "to_dict") else None,
    )


def _ngram(spec: str) -> ResolvedDrafter:
    from specdec.core.drafters import NgramDrafter

    parts = spec.split(":")[1:]
    try:
        sizes = [int(x) for x in parts]
    except ValueError:
        raise DrafterSpecError(f"bad n-gram spec {spec!r}: use ngram, ngram:MAX or ngram:MAX:MIN") from None
    if len(sizes) > 2:
        raise DrafterSpecError(f"bad n-gram spec {spec!r}: use ngram, ngram:MAX or ngram:MAX:MIN")
    max_n = sizes[0] if sizes else 3
    min_n = sizes[1] if len(sizes) > 1 else 1
    try:
        drafter = NgramDrafter(max_ngram=max_n, min_ngram=min_n)
    except ValueError as e:
        raise DrafterSpecError(f"bad n-gram spec {spec!r}: {e}") from e
    return ResolvedDrafter(drafter=drafter, kind="ngram", ref=f"max_ngram={max_n},min_ngram={min_n}")
