"""The registry of drafter kinds: one class per kind behind one interface (vLLM's ``v1/spec_decode`` proposers).

A drafter kind is what a drafter *is* (a draft model, prompt lookup, a lower-precision copy of the
target, an EAGLE-3 head); everything the product does differently per kind is a method or a fact of
its :class:`~specdec.kinds.base.DrafterKind` object, and nothing outside this package compares a
kind string (``tests/test_drafter_kinds.py`` fails if anything does).

Kinds (registration order; the first whose :meth:`~DrafterKind.owns` matches a text wins, ``model`` is
the default for a spec no other kind owns):

========== ================================= ========================= =====================================
kind       specs                             stored labels             module
========== ================================= ========================= =====================================
ngram      ``ngram``, ``ngram:N``, ``ngram:N:M`` ``ngram``              :mod:`specdec.kinds.ngram`
derived    ``derived:<int8|int4|bf16|fp8>``  ``derived:<precision>``   :mod:`specdec.kinds.derived`
eagle3     ``eagle3:<dir or hub id>``        ``eagle3``                :mod:`specdec.kinds.eagle3`
layerskip  ``layerskip``, ``layerskip:N``    ``layerskip``             :mod:`specdec.kinds.layerskip`
model      ``model:<ref>`` or ``<ref>``      ``model``                 :mod:`specdec.kinds.model`
========== ================================= ========================= =====================================

The stored labels are those in MLflow tags (``drafter_kind``) and history databases; they never change.

The interface (:class:`~specdec.kinds.base.DrafterKind`; defaults are a draft model's):

- facts: ``name``; ``needs_draft_weights`` (a checkpoint/head of its own), ``model_free`` (no model
  pass, no draft version in a pair), ``derives_from_target`` (the target + a recipe),
  ``reads_target_features`` (target hidden states), ``retrainable`` (warm-start re-training,
  :mod:`flows.realign`), ``beside_served_target`` (validated without the target's weights on a served night); the names engines give it, ``vllm_method`` and ``sglang_algorithm`` (what the
  engines' serving tables write).
- specs and labels: ``owns(text)``, ``check(spec)`` (syntax only; :class:`DrafterSpecError`, one
  line), ``label(spec)`` (the stored label), ``labels()`` (all it stores), ``ref(spec)``,
  ``slug(spec)``, ``reuse_spec(spec, version_uri)``.
- loading: ``resolve(spec, target, dtype=, device=)`` -> :class:`ResolvedDrafter` (from a spec);
  ``load(registered, target, loader, dtype=, device=)`` (from a registered pair version, artifacts
  through a :class:`~specdec.kinds.base.DraftLoader` the registry side implements);
  ``cache_key(registered, loader)`` (the worker-cache key: content hashes, device, dtype);
  ``identity(label, weights, tokenizer)`` (the draft side of a pair, :mod:`registry.changes`);
  ``registered_draft_problem(...)``, ``same_as_target(label, dtype)``.
- serving: ``serving_note(label)`` only; the settings themselves are each engine profile's serving table
  (:mod:`specdec.engines.profiles`, :func:`specdec.validation.serving.serving_config`), given a
  :class:`ServingRequest`.
- description: ``describe(label, ref)`` (one line), ``finding(group)`` (a note on a validated group).
- decoding objects: ``claims(obj)`` (is this drafter object of the kind), ``draft_model(obj)``.

Lookup: :func:`kind_of` (a spec, a stored label or a :class:`ResolvedDrafter`; a plain reference is
a ``model``), :func:`kind_of_label` (a stored label or None), :func:`stored_labels`,
:func:`claiming_kind` (the kind of a decoding object), :func:`drafter_parts` (what validation needs of a
drafter object); :func:`check_drafter_spec` and :func:`resolve_drafter` (a ``--draft`` spec).

Per-layer behaviour (how replay traces a kind's drafter, how the registry registers and tags its pair,
what each serving engine is told) is not here: each layer keeps a :class:`KindTable` keyed by the kind objects, whose exhaustiveness test
fails until a new kind has its entry (``docs/drafters.md`` lists the tables).

Adding a kind (MTP, DFlash, an engine's own n-gram): one class in a new module here, subclassing
:class:`DrafterKind` and overriding what differs, one :func:`register` line below, and an entry in every
layer's :class:`KindTable`; see ``docs/drafters.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, TypeVar

from specdec.kinds.base import (
    DraftLoader,
    DrafterKind,
    DrafterSpecError,
    RegisteredDrafter,
    ResolvedDrafter,
    ServingRequest,
)
from specdec.kinds.derived import DerivedKind
from specdec.kinds.eagle3 import Eagle3Kind
from specdec.kinds.layerskip import LayerSkipKind
from specdec.kinds.model import ModelKind
from specdec.kinds.ngram import NgramKind
from specdec.models.store import ModelStore

__all__ = ["DrafterKind", "DrafterSpecError", "ResolvedDrafter", "RegisteredDrafter", "DraftLoader", "ServingRequest",
           "register", "kinds", "kind_of", "kind_of_label", "stored_labels", "drafter_parts", "draft_identity",
           "claiming_kind", "KindTable", "MissingKindEntry", "check_drafter_spec", "resolve_drafter",
           "MODEL", "NGRAM", "DERIVED", "EAGLE3", "LAYERSKIP", "SPEC_FORMS"]

_KINDS: list[DrafterKind] = []
_DEFAULT: list[DrafterKind] = []  # the kind of a spec no other kind owns (one)
#: the spec forms, for error messages and help texts
SPEC_FORMS = ("ngram, derived:int8, derived:int4, derived:bf16, derived:fp8, eagle3:<dir>, layerskip[:N] "
              "or model:<ref>")


def register(kind: DrafterKind, *, default: bool = False) -> DrafterKind:
    """Add ``kind`` to the registry and return it (``default``: it owns every spec no other kind owns).

    Raises:
        ValueError: a kind of that name is registered already, or a second default.
    """
    if any(k.name == kind.name for k in kinds()):
        raise ValueError(f"drafter kind {kind.name!r} is registered already")
    if default and _DEFAULT:
        raise ValueError(f"drafter kind {_DEFAULT[0].name!r} is the default already")
    (_DEFAULT if default else _KINDS).append(kind)
    return kind


def kinds() -> tuple[DrafterKind, ...]:
    """Every registered kind, in lookup order (the default last)."""
    return (*_KINDS, *_DEFAULT)


def kind_of(label_or_spec: str | ResolvedDrafter) -> DrafterKind:
    """The kind of a spec (``ngram:4``, ``derived:int8``, ``eagle3:./head``, ``./draft``), a stored label
    (``derived:bf16``) or a :class:`ResolvedDrafter` (its ``kind``).

    Raises:
        DrafterSpecError: empty spec.
    """
    text = (label_or_spec.kind if isinstance(label_or_spec, ResolvedDrafter) else label_or_spec or "").strip()
    if not text:
        raise DrafterSpecError(f"empty drafter spec: use {SPEC_FORMS}")
    return next((k for k in _KINDS if k.owns(text)), None) or _DEFAULT[0]


def kind_of_label(label: str | None) -> DrafterKind | None:
    """The kind of a stored label (``derived:int8``; a tag value, maybe missing), None when it is none of them."""
    return next((k for k in kinds() if label in k.labels()), None)


def stored_labels() -> tuple[str, ...]:
    """Every stored label of every kind (what a pair version's ``drafter_kind`` may be)."""
    return tuple(lab for k in kinds() for lab in k.labels())


def draft_identity(label: str | None, weights_sha256: str | None, tokenizer_sha256: str | None) -> tuple[str, str, str]:
    """What identifies the draft side of a pair version's tags (:meth:`DrafterKind.identity`; an unknown or
    missing label counts as a drafter with weights)."""
    return (kind_of_label(label) or MODEL).identity(label or "", weights_sha256, tokenizer_sha256)


def drafter_parts(drafter: Any) -> tuple[Any, Any, str, str | None, dict | None]:
    """``(object for speculative_generate, draft model or None, label, ref, recipe)`` of a drafter: a
    :class:`ResolvedDrafter` (its label, ref and recipe) or a bare drafter object / causal LM (the label
    of the kind that :meth:`~DrafterKind.claims` it, and the recipe that kind reads off it:
    :meth:`~DrafterKind.recipe_of`).

    Raises:
        TypeError: no kind claims the object.
    """
    if isinstance(drafter, ResolvedDrafter):
        obj, label, ref, recipe = drafter.drafter, drafter.kind, drafter.ref, drafter.recipe
    else:
        obj, label, ref, recipe = drafter, None, None, None
    kind = claiming_kind(obj)
    return obj, kind.draft_model(obj), label or kind.name, ref, kind.recipe_of(obj) if recipe is None else recipe


def claiming_kind(obj: Any) -> DrafterKind:
    """The first registered kind that :meth:`~DrafterKind.claims` the decoding object ``obj`` (a draft causal
    LM, ``ModelDrafter``, ``NgramDrafter``, ``Eagle3Drafter``, ...).

    Raises:
        TypeError: no kind claims it.
    """
    kind = next((k for k in kinds() if k.claims(obj)), None)
    if kind is None:
        raise TypeError(f"drafter must be a causal LM, an NgramDrafter, an Eagle3Drafter or a ResolvedDrafter, "
                        f"got {type(obj).__name__}")
    return kind


def check_drafter_spec(spec: str) -> str:
    """Check a drafter spec's syntax without loading anything (so a CLI refuses ``derived:int3`` before the
    target loads). Returns the stripped spec; ``auto`` passes (a ``model`` reference here).

    Raises:
        DrafterSpecError: empty or malformed spec (one line naming the accepted forms).
    """
    spec = (spec or "").strip()
    kind = kind_of(spec)
    if kind is _DEFAULT[0]:
        _check_unknown_prefix(spec)
    return kind.check(spec)


def _check_unknown_prefix(spec: str) -> None:
    """Raises DrafterSpecError when ``spec`` reads as ``word:...`` with a ``word`` no kind owns and no such path
    exists (``bogus:3``, ``ngarm:3``): a kind typo, not a model reference (Hub ids and paths have no such prefix)."""
    import difflib
    import re
    from pathlib import Path

    m = re.match(r"([A-Za-z][A-Za-z0-9_-]*):", spec)
    if m is None or Path(spec).expanduser().exists():
        return
    names = [k.name for k in kinds()]
    if m.group(1) in names:  # model:<ref>
        return
    close = difflib.get_close_matches(m.group(1), names, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise DrafterSpecError(f"unknown drafter kind {m.group(1)!r}: {hint}use {SPEC_FORMS}")


def resolve_drafter(spec: str, target: Any, *, store: ModelStore, dtype: Any = None,
                    device: Any = None, adapter: Any = None) -> ResolvedDrafter:
    """Build the drafter a spec names (``ngram:4``, ``derived:int8``, ``eagle3:<dir>``, ``layerskip:N``,
    ``model:<ref>`` or a plain reference) for ``target`` (a :class:`~specdec.models.LoadedModel`, with its LoRA
    adapter merged if it has one: a derived draft derives from the adapted weights, a head reads its hidden
    states), by its kind (:meth:`DrafterKind.resolve`); ``store``: the model caches a draft reference is fetched
    into (built at the edge); ``dtype``/``device`` for a draft model or a head (default: the target model's);
    ``adapter``: a LoRA adapter directory (or :class:`~specdec.models.adapters.AdapterInfo`) merged into a draft
    model (:func:`~specdec.models.adapters.attach_adapter`); None: the draft as it is (a shared draft stays unadapted).

    Raises:
        DrafterSpecError: empty or malformed spec (e.g. ``derived:int3``, ``ngram:x``); an adapter for a drafter
            that has no checkpoint of its own.
        specdec.models.ModelNotFoundError: the draft model reference cannot be found.
        specdec.IncompatiblePairError: the draft's tokenizer/vocabulary does not match the target's.
        specdec.models.adapters.AdapterError / AdapterMismatchError: the adapter is unreadable / does not fit.
    """
    spec = (spec or "").strip()
    kind = kind_of(spec)
    resolved = kind.resolve(spec, target, store=store, dtype=dtype, device=device)
    if adapter is None:
        return resolved
    if resolved.loaded is None:
        raise DrafterSpecError(f"a draft adapter adapts a draft model (model:REF); {kind.describe(kind.label(spec))} "
                               "has no checkpoint of its own")
    from dataclasses import replace

    from specdec.models.adapters import attach_adapter

    loaded = attach_adapter(resolved.loaded, adapter)
    return replace(resolved, drafter=loaded.model, loaded=loaded)


V = TypeVar("V")


class MissingKindEntry(LookupError):
    """A registered drafter kind has no entry in a layer's :class:`KindTable` (the message names both)."""


class KindTable(Generic[V]):
    """``{kind: entry}`` for one layer (``layer``: where the table is, for messages). What a layer does
    differently per kind lives in its own table, not in the kind class nor in branches on kind facts;
    :meth:`missing` is checked against the registry as it is at the call (a kind registered later counts),
    and each table's exhaustiveness test asserts it is empty (``docs/drafters.md``, "Adding a fifth kind")."""

    def __init__(self, layer: str, entries: Mapping[DrafterKind, V]) -> None:
        self.layer = layer
        self._entries = dict(entries)

    def __getitem__(self, kind: DrafterKind) -> V:
        """The entry of ``kind``. Raises MissingKindEntry: none (a kind added without filling this table)."""
        try:
            return self._entries[kind]
        except KeyError:
            raise MissingKindEntry(f"drafter kind {kind.name!r} has no entry in {self.layer}: add one "
                                   "(docs/drafters.md, 'Adding a fifth kind')") from None

    def missing(self) -> list[str]:
        """The names of registered kinds with no entry (empty when the table is complete)."""
        return [k.name for k in kinds() if k not in self._entries]

    def check(self) -> None:
        """Raise MissingKindEntry listing every registered kind without an entry (nothing when complete)."""
        if missing := self.missing():
            raise MissingKindEntry(f"{self.layer} has no entry for drafter kind(s) {', '.join(missing)}: add one "
                                   "per kind (docs/drafters.md, 'Adding a fifth kind')")


NGRAM = register(NgramKind())
DERIVED = register(DerivedKind())
EAGLE3 = register(Eagle3Kind())
LAYERSKIP = register(LayerSkipKind())
MODEL = register(ModelKind(), default=True)
