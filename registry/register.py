"""Register a whole pair from references: target, draft (or drafter spec), compatibility, pair version.

This is what ``specdec pair register`` and the Prefect ``register_pair_flow`` both call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from registry.models import ModelVersionRef
from registry.pairs import PairVersion
from registry.service import Registry
from specdec.core.config import SpeculativeConfig
from specdec.kinds import DERIVED, EAGLE3, LAYERSKIP, MODEL, NGRAM, DrafterKind, KindTable, kind_of, kind_of_label
from specdec.models.store import ModelStore


@dataclass
class PairRegistration:
    """The outcome of :func:`register_pair_from_refs`."""

    pair: PairVersion
    target: ModelVersionRef
    draft: ModelVersionRef | None
    drafter_kind: str
    target_adapter: ModelVersionRef | None = None
    draft_adapter: ModelVersionRef | None = None


def resolve_checkpoint(ref: str, revision: str | None = None, *, store: ModelStore,
                       registry: Registry) -> dict[str, Any]:
    """Resolve a model reference to a local checkpoint + tokenizer + config, without registering.

    ``ref``: Hub id, local dir, ``.gguf`` file, ``smollm2`` (fetched/converted into ``store``, the caller's
    :class:`~specdec.models.ModelStore`), or ``models:/<name>/<v>`` (an already registered checkpoint version,
    downloaded to the cache of ``registry``). Returns a dict with ``path``,
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

        path, source = resolve_model_ref(ref, store=store, revision=revision)
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
    registry: Registry,
    engine: str | None = None,
    store: ModelStore,
    target_adapter: str | None = None,
    draft_adapter: str | None = None,
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
        registry: the job's registry service (:class:`registry.service.Registry`).
        engine: serving engine profile (``vllm`` / ``sglang`` / ``transformers``; see
            :func:`specdec.validation.serving.engine_config`), None to read it from the config.
        store: the model caches references are fetched/converted into (the entry point's
            :class:`~specdec.models.ModelStore`).
        target_adapter / draft_adapter: a PEFT LoRA adapter directory (registered as its own version with lineage
            to its base, :func:`registry.adapters.register_adapter`) or ``models:/<adapter>/<v>`` of one registered
            for the same base; the draft adapter needs a draft checkpoint (``model`` kind). None: no adapter.
    Returns:
        :class:`PairRegistration`.
    Raises:
        specdec.models.adapters.AdapterError / AdapterMismatchError: an adapter unreadable / not of this base (one
            line, before anything is registered).
        specdec.IncompatiblePairError: mismatched vocabularies / special tokens.
        registry.RegistryError subclasses; ValueError on a bad name or spec.
    """
    from registry.models import validate_name

    for n in (name, target_name, draft_name):
        if n:
            validate_name(n)
    name = name or registry.settings.pair_name
    with registration_lock(name, registry):
        return _register_pair_from_refs(target, draft, name=name, target_name=target_name, draft_name=draft_name,
                                        config=config, revision=revision, model_card=model_card,
                                        registry=registry, engine=engine, store=store,
                                        adapters=(target_adapter, draft_adapter))


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


@dataclass(frozen=True)
class RegistrationRequest:
    """One :func:`register_pair_from_refs` call, its drafter spec parsed (``kind``); what a :data:`REGISTRARS`
    entry takes. Fields as that function's arguments; ``spec``: the stripped drafter spec."""

    target: str
    spec: str
    kind: DrafterKind
    name: str | None
    target_name: str | None
    draft_name: str | None
    config: SpeculativeConfig
    revision: str | None
    model_card: str | None
    registry: Registry
    engine: str | None
    store: ModelStore
    target_adapter: str | None = None
    draft_adapter: str | None = None


@dataclass
class DraftPlan:
    """What a kind's draft side registers, decided before the target is registered (:func:`_register_with`).

    Attributes:
        label: the stored drafter kind label. compat: the compatibility result (a dict) stored with the pair.
        drafter_recipe: the pair's own recipe (a kind without a draft version), else None.
        version: an already registered draft version. checkpoint: a resolved draft checkpoint to register
            (:func:`resolve_checkpoint`). derive: a recipe to register as a derived-recipe version of the target.
    """

    label: str
    compat: dict[str, Any]
    drafter_recipe: dict | None = None
    version: ModelVersionRef | None = None
    checkpoint: dict[str, Any] | None = None
    derive: dict | None = None


def _register_pair_from_refs(target: str, draft: str, *, name: str, target_name, draft_name, config, revision,
                             model_card, registry: Registry, engine, store: ModelStore,
                             adapters: tuple[str | None, str | None] = (None, None)) -> PairRegistration:
    """:func:`register_pair_from_refs`, under its lock: the registrar of the spec's kind (:data:`REGISTRARS`)."""
    spec = draft.strip()
    kind = kind_of(spec)
    req = RegistrationRequest(target=target, spec=spec, kind=kind, name=name, target_name=target_name,
                              draft_name=draft_name, config=config, revision=revision, model_card=model_card,
                              registry=registry, engine=engine, store=store, target_adapter=adapters[0],
                              draft_adapter=adapters[1])
    if any(adapters) and kind.reads_target_features:  # the head registrar takes no adapter yet
        raise ValueError(f"a pair with a LoRA adapter takes a draft model, an n-gram, a derived or a layer-skip draft, "
                         f"not {kind.name} yet (docs/adapters.md)")
    return REGISTRARS[kind](req)


def _register_with(plan_draft: Callable[[RegistrationRequest, dict[str, Any]], DraftPlan],
                   req: RegistrationRequest) -> PairRegistration:
    """Resolve the target, plan the draft side (``plan_draft(req, resolved target)``), then register the target,
    the draft (as planned) and the pair version."""
    from registry.adapters import adapter_side
    from registry.models import register_derived_draft, register_model_version
    from registry.pairs import register_pair
    t = resolve_checkpoint(req.target, req.revision, store=req.store, registry=req.registry)
    check_budget_fits(req.config, t["config"])
    plan = plan_draft(req, t)
    _check_adapters_fit(req, t, plan.checkpoint)  # refused before anything is written
    pair = req.name
    tref = t["registered"] or register_model_version(req.target_name or default_model_name(t, pair, "target"),
                                                     t["path"], source=t["source"], model_card=req.model_card,
                                                     registry=req.registry)
    dref, d = plan.version, plan.checkpoint
    t_adapter = _adapter_version(req.target_adapter, tref, t["path"], req.registry)
    if plan.derive is not None:  # derived from the target as the pair has it: base + adapter
        dref = register_derived_draft(tref, plan.derive, name=req.draft_name, registry=req.registry,
                                      adapter=adapter_side(t_adapter))
    elif d is not None:
        dref = d["registered"] or register_model_version(req.draft_name or default_model_name(d, pair, "draft"),
                                                         d["path"], source=d["source"], registry=req.registry)
    d_adapter = _adapter_version(req.draft_adapter, dref, d and d["path"], req.registry)
    pv = register_pair(tref, dref, drafter_kind=plan.label, config=req.config, compatibility=plan.compat,
                       name=req.name, registry=req.registry, engine=req.engine,
                       drafter_recipe=plan.drafter_recipe, store=req.store, target_adapter=t_adapter,
                       draft_adapter=d_adapter)
    return PairRegistration(pair=pv, target=tref, draft=dref, drafter_kind=plan.label, target_adapter=t_adapter,
                            draft_adapter=d_adapter)


def _check_adapters_fit(req: RegistrationRequest, t: dict[str, Any], d: dict[str, Any] | None) -> None:
    """Refuse an adapter directory that does not fit its base (target ``t`` / draft checkpoint ``d``, resolved) or a
    draft adapter without a draft checkpoint, before anything is registered. Registered adapters
    (``models:/...``) are checked against their base version by :func:`_adapter_version`.

    Raises:
        specdec.models.adapters.AdapterError / AdapterMismatchError; ValueError: a draft adapter, no draft model.
    """
    from registry.adapters import check_adapter_fits
    from specdec.models.adapters import read_adapter
    from specdec.models.hashes import weights_sha256

    if req.draft_adapter and d is None:
        raise ValueError(f"--draft-adapter adapts a draft model; {req.spec} has no draft checkpoint")
    for adapter, base in ((req.target_adapter, t), (req.draft_adapter, d)):
        if adapter and not adapter.startswith("models:/"):
            info = read_adapter(adapter)
            check_adapter_fits(info, base["path"], weights_sha256(base["path"]) if info.base_hash else None)


def _adapter_version(adapter: str | None, base: ModelVersionRef | None, base_dir: Path | None,
                     registry: Registry) -> ModelVersionRef | None:
    """The adapter version of ``adapter`` (a directory, registered now; or ``models:/...``, checked to be an adapter
    of ``base``'s weights); None without an adapter."""
    from registry.adapters import checked_adapter, register_adapter

    if not adapter:
        return None
    if adapter.startswith("models:/"):
        with registry.errors():
            return checked_adapter(registry.client, adapter, base)
    return register_adapter(adapter, base, base_dir, registry=registry)


def _compat(t: dict[str, Any], d: dict[str, Any], note: str | None = None) -> dict[str, Any]:
    """The compatibility of target ``t`` and draft ``d`` (resolved checkpoints) as a dict, plus ``note``."""
    from registry.pairs import compatibility_to_dict
    from specdec.models import check_pair_compatible

    compat = compatibility_to_dict(check_pair_compatible(t["tokenizer"], d["tokenizer"], t["config"], d["config"]))
    if note:
        compat.setdefault("notes", []).append(note)
    return compat


def _model_free_draft(req: RegistrationRequest, t: dict[str, Any]) -> DraftPlan:
    """No draft version: the label and the pair's recipe (``ngram:3:1`` -> ``ngram`` + its sizes)."""
    label = req.kind.label(req.spec)
    return DraftPlan(label=label, compat={"compatible": True, "notes": req.kind.compatibility_notes(label)},
                     drafter_recipe=req.kind.pair_recipe(req.spec))


def _derived_draft(req: RegistrationRequest, t: dict[str, Any]) -> DraftPlan:
    """A derived-recipe version of the target (``derived:int8``), re-derived at load time."""
    label = DERIVED.label(req.spec)
    return DraftPlan(label=label, compat=_compat(t, t, f"{label} draft is re-derived from the target at load time"),
                     derive=DERIVED.recipe(req.spec).to_dict())


def _layerskip_draft(req: RegistrationRequest, t: dict[str, Any]) -> DraftPlan:
    """No draft version: the target's own first N layers; the pair keeps ``{"num_layers": N}`` (plain
    ``layerskip``: half the target's layers, fixed now so the pair loads and serves one N)."""
    label = LAYERSKIP.label(req.spec)
    recipe = LAYERSKIP.recipe_for(req.spec, int(t["config"].num_hidden_layers))
    compat = _compat(t, t)
    compat.setdefault("notes", []).extend(LAYERSKIP.compatibility_notes(label))
    return DraftPlan(label=label, compat=compat, drafter_recipe=recipe)


def _model_draft(req: RegistrationRequest, t: dict[str, Any]) -> DraftPlan:
    """A draft checkpoint (registered now, or already: ``models:/<name>/<v>``); a registered derived-recipe
    version (an old derived draft kept after a target-only fine-tune) is paired as the derived draft it is."""
    from registry.models import get_model_version

    if req.spec.startswith("models:/"):
        dref = get_model_version(req.spec, registry=req.registry)
        if dref.artifact == "derived-recipe":
            label = DERIVED.label_of((dref.recipe or {}).get("kind") or dref.tags.get("derived.kind", "int8"))
            base = resolve_checkpoint(str(dref.derived_from), store=req.store, registry=req.registry)
            return DraftPlan(label=label, compat=_compat(t, base, f"{label} draft derived from {dref.derived_from}"),
                             version=dref)
    d = resolve_checkpoint(MODEL.ref(req.spec), store=req.store, registry=req.registry)
    return DraftPlan(label=MODEL.label(req.spec), compat=_compat(t, d), checkpoint=d)


def _eagle3_registrar(req: RegistrationRequest) -> PairRegistration:
    """An EAGLE-3 head with its lineage tags (:func:`register_eagle3_pair`)."""
    return register_eagle3_pair(req.target, req.kind.ref(req.spec), name=req.name, head_name=req.draft_name,
                                config=req.config, registry=req.registry, engine=req.engine, store=req.store)


def register_eagle3_pair(target: str, head: str, *, name: str | None = None, head_name: str | None = None,
                         config=None, registry: Registry,
                         engine: str | None = None, store: ModelStore):
    """Register (or reuse) the target, the head and the ``eagle3`` pair version.

    Args:
        target: the target reference (as for ``specdec pair register --target``).
        head: a head directory (registered with lineage; it must have been trained on ``target``), or
            an already registered head version ``models:/<name>/<v>`` (any target: a target-only
            fine-tune leaves the old head with the new target, and its lineage says so).
        name: pair registered model (default: the registry section's ``pair_name``). head_name: registered
            model of a new head (default ``<pair>-eagle3``: the re-trained heads of a pair are versions of one
            registered model).
        registry: the job's registry service (:class:`registry.service.Registry`).
        config: ``SpeculativeConfig`` of the pair (default: its defaults).
        store: the model caches the target reference is fetched/converted into (the caller's
            :class:`~specdec.models.ModelStore`).
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

    href = None
    if head.startswith("models:/"):
        href = get_model_version(head, registry=registry)
        hkind = kind_of_label(href.tags.get("specdec.draft_kind"))
        if hkind is None or not hkind.retrainable:
            raise ValueError(f"{head} is not a registered EAGLE-3 head")
        head_dir = download_model_version(href, registry=registry)
    else:
        head_dir = Path(head)
        if not (head_dir / "config.json").is_file():
            raise FileNotFoundError(f"no EAGLE-3 head at {head_dir}: config.json not found")
    t = resolve_checkpoint(target, store=store, registry=registry)
    compat = head_compatibility(Path(head_dir), t["config"])
    if not compat["compatible"]:
        raise ValueError("head and target are incompatible: " + "; ".join(compat["problems"]))
    pair_name = name or registry.settings.pair_name
    tref = t["registered"] or register_model_version(default_model_name(t, pair_name, "target"), t["path"],
                                                     source=t["source"], registry=registry)
    href = href or register_eagle3_head(head_dir, tref, name=head_name or f"{pair_name}-eagle3", registry=registry)
    pv = register_pair(tref, href, drafter_kind="eagle3", config=config or SpeculativeConfig(),
                       compatibility=compat, name=pair_name, registry=registry, engine=engine, store=store)
    return PairRegistration(pair=pv, target=tref, draft=href, drafter_kind="eagle3")


def register_trained_head(head: str | Path, pair: str, target: str, *, gate, head_name: str | None = None,
                          alias: str | None = "challenger", config=None, registry: Registry,
                          engine: str | None = None, store: ModelStore):
    """:func:`register_eagle3_pair` under ``pair`` (the target resolved into ``store``), then point the ungated
    ``alias`` at the new version (``None`` leaves aliases alone) through :func:`registry.promotion.promote` with
    ``gate`` (a :class:`registry.gate.GateConfig`). What ``specdec draft train eagle3 --register`` and the
    re-alignment flow call. Returns the :class:`registry.pairs.PairVersion`."""
    from registry.promotion import promote

    reg = register_eagle3_pair(target, str(head), name=pair, head_name=head_name, config=config,
                               registry=registry, engine=engine, store=store)
    if alias:
        promote(pair, reg.pair.version, alias, gate=gate, registry=registry)
    return reg.pair


def head_registry_hooks(gate_of, store_of, registry_of):
    """The registry functions ``specdec draft train eagle3`` uses (:class:`specdec.training.cli.HeadRegistry`);
    ``gate_of``: ``() -> GateConfig``, the command's gate, built when a head is registered (the policy is read
    then, at the edge); ``store_of``: ``() -> ModelStore``, the command's model caches, built when a reference
    is resolved (the settings are read then, at the edge); ``registry_of``: ``() -> Registry``, the command's
    MLflow service, opened by the entry point when a hook needs it (the registration and its alias move share
    one)."""
    from registry.heads import head_directory
    from specdec.training.cli import HeadRegistry

    def register(*args, **kwargs):
        return register_trained_head(*args, gate=gate_of(), store=store_of(), registry=registry_of(), **kwargs)

    return HeadRegistry(register=register, head_directory=lambda ref: head_directory(ref, registry=registry_of()),
                        checkpoint_directory=lambda ref: resolve_checkpoint(ref, store=store_of(),
                                                                            registry=registry_of())["path"])


#: how each drafter kind's pair is registered from references (tests/registry/test_kind_tables.py fails until a
#: new kind has its entry)
REGISTRARS: KindTable[Callable[[RegistrationRequest], PairRegistration]] = KindTable(
    "the pair registrars (registry.register.REGISTRARS)", {
        NGRAM: partial(_register_with, _model_free_draft),
        DERIVED: partial(_register_with, _derived_draft),
        EAGLE3: _eagle3_registrar,
        LAYERSKIP: partial(_register_with, _layerskip_draft),
        MODEL: partial(_register_with, _model_draft),
    })
