"""Register a whole pair from references: target, draft (or drafter spec), compatibility, pair version.

This is what ``specdec pair register`` and the Prefect ``register_pair_flow`` both call.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry.models import ModelVersionRef
from registry.pairs import PairVersion
from registry.service import Registry, open_registry
from specdec.core.config import SpeculativeConfig
from specdec.kinds import DERIVED, MODEL, kind_of, kind_of_label


@dataclass
class PairRegistration:
    """The outcome of :func:`register_pair_from_refs`."""

    pair: PairVersion
    target: ModelVersionRef
    draft: ModelVersionRef | None
    drafter_kind: str


def resolve_checkpoint(ref: str, revision: str | None = None, *, registry: Registry | None = None) -> dict[str, Any]:
    """Resolve a model reference to a local checkpoint + tokenizer + config, without registering.

    ``ref``: Hub id, local dir, ``.gguf`` file, ``smollm2``, or ``models:/<name>/<v>`` (an already
    registered checkpoint version, downloaded to the cache of ``registry``). Returns a dict with ``path``,
    ``source``, ``registered`` (ModelVersionRef or None), ``tokenizer``, ``config``, ``ref``.

    Raises:
        specdec.models.ModelNotFoundError, registry.ModelNotFound, ValueError (not a checkpoint).
    """
    from transformers import AutoConfig, AutoTokenizer

    if ref.startswith("models:/"):
        from registry.models import download_model_version, get_model_version

        mref = get_model_version(ref, registry=registry)
        if mref.artifact != "checkpoint":
            raise ValueError(f"{ref} is a {mref.artifact}, not a checkpoint")
        path, source, registered = download_model_version(mref, registry=registry), mref.source, mref
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


def check_budget_fits(config: SpeculativeConfig, target_config) -> None:
    """Refuse a ``max_new_tokens`` no prompt can fit: at least one prompt token plus the budget must fit
    the target's context (``max_position_embeddings``), else every held-out prompt would be skipped.

    Raises:
        ValueError: the budget does not fit (the message names both numbers).
    """
    ctx = getattr(target_config, "max_position_embeddings", None)
    if ctx is not None and config.max_new_tokens >= int(ctx):
        raise ValueError(f"max_new_tokens {config.max_new_tokens} leaves no room for a prompt in the target's "
                         f"context of {ctx} tokens (max_new_tokens must be below it)")


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
    registry: Registry | None = None,
    engine: str | None = None,
) -> PairRegistration:
    """Check compatibility, then register (or reuse) the target, the draft and the pair version.

    Args:
        target: a model reference (see :func:`resolve_checkpoint`).
        draft: ``ngram`` or ``ngram:MAX:MIN`` (the sizes are stored as the pair's recipe);
            ``eagle3:<head dir or models:/<head>/<v>>`` (:func:`register_eagle3_pair`);
            ``derived:int8`` / ``int4`` / ``bf16`` / ``fp8`` (derived from this target); a model
            reference, optionally ``model:<ref>``; or ``models:/<name>/<v>`` of an already
            registered draft, including a derived-recipe version (e.g. an old derived draft kept
            after a target-only fine-tune).
        name: pair registered model (default: the registry section's ``pair_name``, ``specdec-pair``).
        config: decoding config recorded with the pair.
        registry: the job's registry service (else one opened for ``tracking_uri``, for this call).
        engine: serving engine profile (``vllm`` / ``sglang`` / ``transformers``; see
            :func:`specdec.validation.serving.engine_config`), None to read it from the config.
    Returns:
        :class:`PairRegistration`.
    Raises:
        specdec.IncompatiblePairError: mismatched vocabularies / special tokens.
        registry.RegistryError subclasses; ValueError on a bad name or spec.
    """
    from registry.models import validate_name

    for n in (name, target_name, draft_name):
        if n:
            validate_name(n)
    reg = open_registry(registry, tracking_uri)
    name = name or reg.settings.pair_name
    with registration_lock(name, reg):
        return _register_pair_from_refs(target, draft, name=name, target_name=target_name, draft_name=draft_name,
                                        config=config, revision=revision, model_card=model_card,
                                        registry=reg, engine=engine)


REGISTRATION_LOCK_TIMEOUT_S = 1800.0  # a registration uploads checkpoints: minutes for a large one


@contextmanager
def registration_lock(pair: str, registry: Registry) -> Iterator[None]:
    """Serialise registrations of ``pair`` into one MLflow store on this machine: a second
    ``pair register`` of the same pair waits (saying so on stderr) for the first, then finds its version
    (reused) instead of racing it into MLflow. A file lock under ``<home>/locks`` (``registry``'s section),
    keyed by ``registry``'s URI and the pair; released when the process ends, even by ``kill -9``.

    Raises:
        RegistryError: still held after :data:`REGISTRATION_LOCK_TIMEOUT_S` seconds.
    """
    import hashlib
    import sys

    from filelock import FileLock, Timeout

    from registry.errors import RegistryError

    key = hashlib.sha256(f"{registry.uri}\0{pair}".encode()).hexdigest()[:16]
    locks = registry.settings.home / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(locks / f"register-{key}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(f"waiting for another registration of {pair} to finish ...", file=sys.stderr, flush=True)
        try:
            lock.acquire(timeout=REGISTRATION_LOCK_TIMEOUT_S)
        except Timeout:
            raise RegistryError(f"another registration of {pair} has held its lock ({lock.lock_file}) for "
                                f"{REGISTRATION_LOCK_TIMEOUT_S:.0f} s; re-run when it has finished") from None
    try:
        yield
    finally:
        lock.release()


def _register_pair_from_refs(target: str, draft: str, *, name: str, target_name, draft_name, config, revision,
                             model_card, registry: Registry, engine) -> PairRegistration:
    """:func:`register_pair_from_refs` as pair ``name`` in ``registry``, under its lock."""
    from registry.models import get_model_version, register_derived_draft, register_model_version
    from registry.pairs import compatibility_to_dict, register_pair
    from specdec.models import check_pair_compatible

    spec = draft.strip()
    dkind = kind_of(spec)
    if dkind.retrainable:  # an EAGLE-3 head, with its lineage tags (registry.heads)
        return register_eagle3_pair(target, dkind.ref(spec), name=name, head_name=draft_name,
                                    config=config, registry=registry, engine=engine)
    t = resolve_checkpoint(target, revision, registry=registry)
    check_budget_fits(config, t["config"])
    d = None
    dref: ModelVersionRef | None = None
    recipe = drafter_recipe = None
    if dkind.model_free:
        kind, drafter_recipe = dkind.label(spec), dkind.pair_recipe(spec)  # e.g. ngram:3:1 -> ngram + its sizes
        compat: dict[str, Any] = {"compatible": True, "notes": dkind.compatibility_notes(kind)}
    elif dkind.derives_from_target:
        recipe = DERIVED.recipe(spec)
        kind = dkind.label(spec)
        compat = compatibility_to_dict(check_pair_compatible(t["tokenizer"], t["tokenizer"], t["config"], t["config"]))
        compat.setdefault("notes", []).append(f"{kind} draft is re-derived from the target at load time")
    elif spec.startswith("models:/") and get_model_version(spec, registry=registry).artifact == "derived-recipe":
        dref = get_model_version(spec, registry=registry)
        kind = DERIVED.label_of((dref.recipe or {}).get('kind') or dref.tags.get('derived.kind', 'int8'))
        base = resolve_checkpoint(str(dref.derived_from), registry=registry)
        compat = compatibility_to_dict(check_pair_compatible(t["tokenizer"], base["tokenizer"], t["config"], base["config"]))
        compat.setdefault("notes", []).append(f"{kind} draft derived from {dref.derived_from}")
    else:
        kind = MODEL.label(spec)
        d = resolve_checkpoint(MODEL.ref(spec), registry=registry)
        compat = compatibility_to_dict(check_pair_compatible(t["tokenizer"], d["tokenizer"], t["config"], d["config"]))
    tref = t["registered"] or register_model_version(target_name or default_model_name(t, name, "target"), t["path"],
                                                     source=t["source"], model_card=model_card, registry=registry)
    if recipe is not None and dref is None:
        dref = register_derived_draft(tref, recipe.to_dict(), name=draft_name, registry=registry)
    elif d is not None:
        dref = d["registered"] or register_model_version(draft_name or default_model_name(d, name, "draft"), d["path"],
                                                         source=d["source"], registry=registry)
    pv = register_pair(tref, dref, drafter_kind=kind, config=config, compatibility=compat, name=name,
                       registry=registry, engine=engine, drafter_recipe=drafter_recipe)
    return PairRegistration(pair=pv, target=tref, draft=dref, drafter_kind=kind)


def register_eagle3_pair(target: str, head: str, *, name: str | None = None, head_name: str | None = None,
                         config=None, tracking_uri: str | None = None, registry: Registry | None = None,
                         engine: str | None = None):
    """Register (or reuse) the target, the head and the ``eagle3`` pair version.

    Args:
        target: the target reference (as for ``specdec pair register --target``).
        head: a head directory (registered with lineage; it must have been trained on ``target``), or
            an already registered head version ``models:/<name>/<v>`` (any target: a target-only
            fine-tune leaves the old head with the new target, and its lineage says so).
        name: pair registered model (default: the registry section's ``pair_name``). head_name: registered
            model of a new head (default ``<pair>-eagle3``: the re-trained heads of a pair are versions of one
            registered model).
        registry: the job's registry service (else one opened for ``tracking_uri``, for this call).
        config: ``SpeculativeConfig`` of the pair (default: its defaults).
    Returns:
        :class:`registry.register.PairRegistration` (drafter kind ``eagle3``).
    Raises:
        ValueError: incompatible head/target, a directory trained on another target, or a registered
        version that is not an EAGLE-3 head; registry errors.
    """
    from registry.heads import head_compatibility, register_eagle3_head
    from registry.models import register_model_version
    from registry.pairs import register_pair
    from registry.models import download_model_version, get_model_version

    reg = open_registry(registry, tracking_uri)
    href = None
    if head.startswith("models:/"):
        href = get_model_version(head, registry=reg)
        hkind = kind_of_label(href.tags.get("specdec.draft_kind"))
        if hkind is None or not hkind.retrainable:
            raise ValueError(f"{head} is not a registered EAGLE-3 head")
        head_dir = download_model_version(href, registry=reg)
    else:
        head_dir = Path(head)
        if not (head_dir / "config.json").is_file():
            raise FileNotFoundError(f"no EAGLE-3 head at {head_dir}: config.json not found")
    t = resolve_checkpoint(target, registry=reg)
    compat = head_compatibility(Path(head_dir), t["config"])
    if not compat["compatible"]:
        raise ValueError("head and target are incompatible: " + "; ".join(compat["problems"]))
    pair_name = name or reg.settings.pair_name
    tref = t["registered"] or register_model_version(default_model_name(t, pair_name, "target"), t["path"],
                                                     source=t["source"], registry=reg)
    href = href or register_eagle3_head(head_dir, tref, name=head_name or f"{pair_name}-eagle3", registry=reg)
    pv = register_pair(tref, href, drafter_kind="eagle3", config=config or SpeculativeConfig(),
                       compatibility=compat, name=pair_name, registry=reg, engine=engine)
    return PairRegistration(pair=pv, target=tref, draft=href, drafter_kind="eagle3")


def register_trained_head(head: str | Path, pair: str, target: str, *, head_name: str | None = None,
                          alias: str | None = "challenger", config=None, tracking_uri: str | None = None,
                          registry: Registry | None = None, engine: str | None = None):
    """:func:`register_eagle3_pair` under ``pair``, then point the ungated ``alias`` at the new version
    (``None`` leaves aliases alone). What ``specdec draft train eagle3 --register`` and the
    re-alignment flow call. Returns the :class:`registry.pairs.PairVersion`."""
    from registry.promotion import promote

    service = open_registry(registry, tracking_uri)
    reg = register_eagle3_pair(target, str(head), name=pair, head_name=head_name, config=config,
                               registry=service, engine=engine)
    if alias:
        promote(pair, reg.pair.version, alias, registry=service)
    return reg.pair


def head_registry_hooks():
    """The registry functions ``specdec draft train eagle3`` uses (:class:`specdec.training.cli.HeadRegistry`)."""
    from registry.heads import head_directory
    from specdec.training.cli import HeadRegistry

    return HeadRegistry(register=register_trained_head, head_directory=head_directory,
                        checkpoint_directory=lambda ref: resolve_checkpoint(ref)["path"])
