"""The ``model`` kind: a draft causal LM of its own (a checkpoint), vLLM's ``draft_model`` method.

Specs: ``model:<ref>`` or a plain ``<ref>`` (local dir, Hub id, ``.gguf``, ``smollm2``), loaded with
:func:`specdec.load_causal_lm` and checked with :func:`specdec.check_pair_compatible`. It is the
registry's default kind: a spec no other kind owns is a model reference.
"""

from __future__ import annotations

from typing import Any

from specdec.kinds.base import DrafterKind, DrafterSpecError, RegisteredDrafter, ResolvedDrafter
from specdec.models.store import ModelStore

__all__ = ["ModelKind"]


class ModelKind(DrafterKind):
    """A draft causal LM with its own weights (:class:`specdec.core.drafters.ModelDrafter` around it)."""

    name = "model"
    needs_draft_weights = True
    beside_served_target = True

    def check(self, spec: str) -> str:
        spec = spec.strip()
        if not self.ref(spec):
            raise DrafterSpecError("model: needs a reference, e.g. model:./my-draft or model:org/name")
        return spec

    def resolve(self, spec: str, target: Any, *, store: ModelStore, dtype=None,
                device=None) -> ResolvedDrafter:
        """Load the draft ``model:<ref>`` (through ``store``'s caches) in the target's dtype/device (or
        ``dtype``/``device``) and check it.

        Raises:
            DrafterSpecError: no reference. specdec.models.ModelNotFoundError: not found.
            specdec.IncompatiblePairError: tokenizer/vocabulary mismatch.
        """
        from specdec.models import check_loaded_pair, load_causal_lm

        ref = self.ref(self.check(spec))
        p = next(target.model.parameters())
        loaded = load_causal_lm(ref, store=store, dtype=dtype or p.dtype, device=device or p.device)
        compat = check_loaded_pair(target, loaded)
        return ResolvedDrafter(drafter=loaded.model, kind=self.name, ref=str(loaded.source.get("ref") or ref),
                               loaded=loaded, compatibility=compat.to_dict() if hasattr(compat, "to_dict") else None)

    def load(self, reg: RegisteredDrafter, target: Any, loader, *, dtype=None, device=None) -> ResolvedDrafter:
        """The registered draft checkpoint ``reg.uri``, checked against ``target``."""
        from specdec.models import check_loaded_pair

        draft = loader.checkpoint(reg.uri)
        compat = check_loaded_pair(target, draft)
        return ResolvedDrafter(drafter=draft.model, kind=self.name, ref=reg.uri, loaded=draft,
                               compatibility=compat.to_dict())

    def claims(self, obj: Any) -> bool:
        import torch

        from specdec.core.drafters import ModelDrafter

        return isinstance(obj, (ModelDrafter, torch.nn.Module))

    def draft_model(self, obj: Any) -> Any:
        from specdec.core.drafters import ModelDrafter

        return obj.model if isinstance(obj, ModelDrafter) else obj

    def describe(self, label: str, ref: str | None = None) -> str:
        return "draft model" + (f" {ref}" if ref else "")
