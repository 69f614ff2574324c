"""Turn a drafter spec string (``ngram``, ``derived:int8``, ``model:<ref>``, ...) into a drafter.

Specs, as accepted by ``specdec validate --draft``:

- ``ngram`` / ``ngram:N`` / ``ngram:N:M``: prompt-lookup drafter (:class:`~specdec.NgramDrafter`,
  ``max_ngram=N`` (default 3), ``min_ngram=M`` (default 1)); no model.
- ``derived:int8`` / ``derived:int4`` / ``derived:bf16`` / ``derived:fp8``: a lower-precision copy of
  the target (:func:`specdec.models.derived.derive_draft`); the recipe travels with the drafter.
- ``eagle3:<dir>`` (or ``eagle3:<hub id>``, from the local Hub cache): an EAGLE-3 head in the
  ``speculators`` format (:mod:`specdec.models.eagle3`), checked against the target
  (:func:`~specdec.models.eagle3.compat.check_head_target`) and run as an
  :class:`~specdec.core.head_drafter.Eagle3Drafter`. A registered head (``models:/...``) is
  downloaded by the registry, which then passes its directory.
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
    """A drafter ready for :func:`specdec.speculative_generate` / :func:`specdec.validation.validate`.

    Attributes:
        drafter: a transformers causal LM (``model``, ``derived:*``) or an ``NgramDrafter``.
        kind: ``"model"``, ``"ngram"``, ``"derived:<int8|int4|bf16|fp8>"``, ``"eagle3"``.
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
        raise DrafterSpecError("empty drafter spec: use ngram, derived:int8, derived:int4, derived:bf16, derived:fp8, eagle3:<dir> or model:<ref>")
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
    elif spec.startswith("eagle3:"):
        _eagle3_config(spec)
    return spec


def _eagle3_config(spec: str):
    """``(head directory, Eagle3Config)`` of an ``eagle3:`` spec; reads only ``config.json``.

    Raises:
        DrafterSpecError: no reference, a ``models:/`` URI (the registry resolves those), no head
            there, or not a supported speculators eagle3 config.
    """
    from pathlib import Path

    from specdec.models.eagle3 import Eagle3ConfigError, read_eagle3_config

    ref = spec.removeprefix("eagle3:").strip()
    if not ref:
        raise DrafterSpecError("eagle3: needs a head directory, e.g. eagle3:./my-head")
    if ref.startswith("models:/"):
        raise DrafterSpecError(f"{ref} is a registry URI: resolve it with the registry (it downloads the head), "
                               "then pass eagle3:<its directory>")
    path = Path(ref).expanduser()
    if not path.exists():
        try:
            from huggingface_hub import snapshot_download

            path = Path(snapshot_download(ref, local_files_only=True))
        except (OSError, ValueError):  # not a valid Hub id, or not in the local cache
            raise DrafterSpecError(f"no EAGLE-3 head at {ref}: not a directory, and not a Hub id in the local cache") from None
    try:
        return path, read_eagle3_config(path)
    except (FileNotFoundError, Eagle3ConfigError) as e:
        raise DrafterSpecError(str(e)) from None


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
        raise DrafterSpecError("empty drafter spec: use ngram, derived:int8, derived:int4, derived:bf16, derived:fp8, eagle3:<dir> or model:<ref>")
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
    if spec.startswith("eagle3:"):
        return _eagle3(spec, target, dtype, device)
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


def _eagle3(spec: str, target: Any, dtype, device) -> ResolvedDrafter:
    """An ``eagle3:`` spec: config and d2t checked against the target, then the head loaded
    (missing embeddings/LM head taken from the target) and wrapped in an Eagle3Drafter.

    Raises:
        DrafterSpecError: bad spec or config. IncompatiblePairError: head and target do not fit.
    """
    from specdec.core.head_drafter import Eagle3Drafter
    from specdec.models.eagle3 import load_eagle3
    from specdec.models.eagle3.compat import check_head_target, read_d2t

    path, config = _eagle3_config(spec)
    ids = check_head_target(config, target.model, read_d2t(path))
    p = next(target.model.parameters())
    head = load_eagle3(path, target=target.model, dtype=dtype or p.dtype, device=device or p.device)
    compat = {"compatible": True, "aux_layer_ids": ids, "draft_vocab_size": config.draft_vocab_size,
              "target_vocab_size": config.target_vocab_size, "hidden_size": config.hidden_size,
              "layer_type": config.layer_type, "verifier_name_or_path": config.verifier_name_or_path, "notes": []}
    return ResolvedDrafter(drafter=Eagle3Drafter(head, ids), kind="eagle3", ref=str(path), compatibility=compat)


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
