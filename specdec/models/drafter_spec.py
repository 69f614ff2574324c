"""Turn a drafter spec string (``ngram``, ``derived:int8``, ``model:<ref>``, ...) into a drafter.

Specs, as accepted by ``specdec validate --draft``; each is parsed, checked and loaded by its kind
(:mod:`specdec.kinds`, one class per kind):

- ``ngram`` / ``ngram:N`` / ``ngram:N:M``: prompt-lookup drafter (:class:`~specdec.NgramDrafter`,
  ``max_ngram=N`` (default 3), ``min_ngram=M`` (default 1)); no model (:mod:`specdec.kinds.ngram`).
- ``derived:int8`` / ``derived:int4`` / ``derived:bf16`` / ``derived:fp8``: a lower-precision copy of
  the target (:func:`specdec.models.derived.derive_draft`); the recipe travels with the drafter
  (:mod:`specdec.kinds.derived`).
- ``eagle3:<dir>`` (or ``eagle3:<hub id>``, from the local Hub cache): an EAGLE-3 head in the
  ``speculators`` format, checked against the target and run as an
  :class:`~specdec.core.head_drafter.Eagle3Drafter` (:mod:`specdec.kinds.eagle3`). A registered head
  (``models:/...``) is downloaded by the registry, which then passes its directory.
- ``model:<ref>`` or a plain ``<ref>``: a draft causal LM loaded with :func:`specdec.load_causal_lm`
  (local dir, Hub id, ``.gguf``, ``smollm2``), checked with :func:`specdec.check_pair_compatible`
  (:mod:`specdec.kinds.model`).
"""

from __future__ import annotations

from typing import Any

import torch

from specdec.kinds import DrafterSpecError, ResolvedDrafter, kind_of

__all__ = ["DrafterSpecError", "ResolvedDrafter", "resolve_drafter", "check_drafter_spec"]


def check_drafter_spec(spec: str) -> str:
    """Check a drafter spec's syntax without loading anything (so a CLI refuses ``derived:int3``
    before the target loads). Returns the stripped spec; ``auto`` passes (a ``model`` reference here).

    Raises:
        DrafterSpecError: empty or malformed spec (one line naming the accepted forms).
    """
    spec = (spec or "").strip()
    return kind_of(spec).check(spec)


def resolve_drafter(
    spec: str,
    target: Any,
    *,
    dtype: torch.dtype | str | None = None,
    device: str | torch.device | None = None,
) -> ResolvedDrafter:
    """Build the drafter a spec names, for ``target`` (:meth:`specdec.kinds.DrafterKind.resolve`).

    Args:
        spec: see the module docstring.
        target: the :class:`~specdec.models.LoadedModel` of the target (model + tokenizer).
        dtype, device: for a ``model`` drafter or a head; default to the target model's dtype and device.
    Returns:
        :class:`ResolvedDrafter`.
    Raises:
        DrafterSpecError: empty or malformed spec (e.g. ``derived:int3``, ``ngram:x``).
        specdec.models.ModelNotFoundError: the draft model reference cannot be found.
        specdec.IncompatiblePairError: the draft's tokenizer/vocabulary does not match the target's.
    """
    spec = (spec or "").strip()
    return kind_of(spec).resolve(spec, target, dtype=dtype, device=device)
