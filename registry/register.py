"""Register a whole pair from references: target, draft (or drafter spec), compatibility, pair version.

This is what ``specdec pair register`` and the Prefect ``register_pair_flow`` both call.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry.models import ModelVersionRef
from registry.pairs import PairVersion
from specdec.core.config import SpeculativeConfig


@dataclass
class PairRegistration:
    """The outcome of :func:`register_pair_from_refs`."""

    pair: PairVersion
    target: ModelVersionRef
    draft: ModelVersionRef | None
    drafter_kind: str


def resolve_checkpoint(ref: str, revision: str | None = None, tracking_uri: str | None = None) -> dict[str, Any]:
    """Resolve a model reference to a local checkpoint + tokenizer + config, without registering.

    ``ref``: Hub id, local dir, ``.gguf`` file, ``smollm2``, or ``models:/<name>/<v>`` (an already
    registered checkpoint version, downloaded to the cache). Returns a dict with ``path``,
    ``source``, ``registered`` (ModelVersionRef or None), ``tokenizer``, ``config``, ``ref``.

    Raises:
        specdec.models.ModelNotFoundError, registry.ModelNotFound, ValueError (not a checkpoint).
    """
    from transformers import AutoConfig, AutoTokenizer

    if ref.startswith("models:/"):
        from registry.models import download_model_version, get_model_version

        mref = get_model_version(ref, tracking_uri=tracking_uri)
        if mref.artifact != "checkpoint":
            raise ValueError(f"{ref} is a {mref.artifact}, not a checkpoint")
        path, source, registered = download_model_version(mref, tracking_uri=tracking_uri), mref.source, mref
    else:
        from specdec.models import resolve_model_ref

        path, source = resolve_model_ref(ref, revision=revision)
        registered = None
    return {"ref": ref, "path": Path(path), "source": source, "registered": registered,
            "tokenizer": AutoTokenizer.from_pretrained(path), "config": AutoConfig.from_pretrained(path)}


def default_model_name(resolved: dict[str, Any], pair: str, role: str) -> str:
    """A registered-model name for a resolved reference: a Hub id keeps its name and a ``.gguf`` file
    its file stem (both name the weights); a local checkpoint directory becomes ``<pair>-<role>``
    (``specdec-pair-target``), so registering from ``./target`` does not create a server-wide
    registered model called ``target``."""
    from registry.models import sanitize_name

    src = resolved["source"]
    ref = str(src.get("ref") or resolved["ref"])
    if ref.endswith(".gguf"):
        return sanitize_name(Path(ref).stem)
    if src.get("kind") == "local" or Path(ref).exists():
        return sanitize_name(f"{pair}-{role}")
    return sanitize_name(ref)


def register_pair_from_refs(
    target: str,
    draft: str,
    *,
    name: str | None = None,
    target_name: str | None = None,
    draft_name: str | None = None,
    config: SpeculativeConfig = SpeculativeConfig(),
    revision: str | None = None,
    model_card: str | None = None,
    tracking_uri: str | None = None,
) -> PairRegistration:
    """Check compatibility, then register (or reuse) the target, the draft and the pair version.

    Args:
        target: a model reference (see :func:`resolve_checkpoint`).
        draft: ``ngram``; ``derived:int8`` / ``int4`` / ``bf16`` / ``fp8`` (derived from this target); a model
            reference, optionally ``model:<ref>``; or ``models:/<name>/<v>`` of an already
            registered draft, including a derived-recipe version (e.g. an old derived draft kept
            after a target-only fine-tune).
        name: pair registered model (default ``specdec-pair``).
        config: decoding config recorded with the pair.
    Returns:
        :class:`PairRegistration`.
    Raises:
        specdec.IncompatiblePairError: mismatched vocabularies / special tokens.
        registry.RegistryError subclasses; ValueError on a bad name or spec.
    """
    from registry.models import (get_model_version, register_derived_draft, register_model_version,
                                 validate_name)
    from registry.pairs import compatibility_to_dict, register_pair
    from specdec.models import check_pair_compatible

    for n in (name, target_name, draft_name):
        if n:
            validate_name(n)
    t = resolve_checkpoint(target, revision, tracking_uri)
    spec = draft.strip()
    d = None
    dref: ModelVersionRef | None = None
    recipe = None
    if spec == "ngram":
        kind = "ngram"
        compat: dict[str, Any] = {"compatible": True,
                                  "notes": ["n-gram drafter: proposes target-tokenizer ids copied from the context"]}
    elif spec.startswith("derived:"):
        from specdec.models.derived import DerivedDraftRecipe

        recipe = DerivedDraftRecipe.from_spec(spec)
        kind = f"derived:{recipe.kind}"
        compat = compatibility_to_dict(check_pair_compatible(t["tokenizer"], t["tokenizer"], t["config"], t["config"]))
        compat.setdefault("notes", []).append(f"{kind} draft is re-derived from the target at load time")
    elif spec.startswith("models:/") and get_model_version(spec, tracking_uri=tracking_uri).artifact == "derived-recipe":
        dref = get_model_version(spec, tracking_uri=tracking_uri)
        kind = f"derived:{(dref.recipe or {}).get('kind') or dref.tags.get('derived.kind', 'int8')}"
        base = resolve_checkpoint(str(dref.derived_from), None, tracking_uri)
        compat = compatibility_to_dict(check_pair_compatible(t["tokenizer"], base["tokenizer"], t["config"], base["config"]))
        compat.setdefault("notes", []).append(f"{kind} draft derived from {dref.derived_from}")
    else:
        kind = "model"
        d = resolve_checkpoint(spec.removeprefix("model:"), None, tracking_uri)
        compat = compatibility_to_dict(check_pair_compatible(t["tokenizer"], d["tokenizer"], t["config"], d["config"]))
    from registry.settings import get_settings

    pair = name or get_settings().pair_name
    tref = t["registered"] or register_model_version(target_name or default_model_name(t, pair, "target"), t["path"],
                                                     source=t["source"], model_card=model_card,
                                                     tracking_uri=tracking_uri)
    if kind.startswith("derived:") and dref is None:
        assert recipe is not None
        dref = register_derived_draft(tref, recipe.to_dict(), name=draft_name, tracking_uri=tracking_uri)
    elif kind == "model":
        assert d is not None
        dref = d["registered"] or register_model_version(draft_name or default_model_name(d, pair, "draft"), d["path"],
                                                         source=d["source"], tracking_uri=tracking_uri)
    pv = register_pair(tref, dref, drafter_kind=kind, config=config, compatibility=compat, name=name,
                       tracking_uri=tracking_uri)
    return PairRegistration(pair=pv, target=tref, draft=dref, drafter_kind=kind)
