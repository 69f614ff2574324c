"""The interface every drafter kind implements (:class:`DrafterKind`) and the plain data it trades in.

See :mod:`specdec.kinds` for the registry and the list of methods; this module holds only the base
class with its defaults, the spec error, :class:`ResolvedDrafter` (a drafter ready for decoding),
:class:`RegisteredDrafter` (a drafter as a registered pair version names it) and the
:class:`DraftLoader` protocol a registry-side loader implements. It imports nothing of a kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from specdec.models.store import ModelStore

__all__ = ["DrafterKind", "DrafterSpecError", "ResolvedDrafter", "RegisteredDrafter", "DraftLoader", "ServingRequest"]


class DrafterSpecError(ValueError):
    """The drafter spec string cannot be parsed (the message is one line naming the accepted forms)."""


@dataclass
class ResolvedDrafter:
    """A drafter ready for :func:`specdec.speculative_generate` / :func:`specdec.validation.validate`.

    Attributes:
        drafter: a transformers causal LM (``model``, ``derived:*``), an ``NgramDrafter`` or an
            ``Eagle3Drafter``: what the decoding loops take.
        kind: the stored label (``"model"``, ``"ngram"``, ``"derived:<int8|int4|bf16|fp8>"``,
            ``"eagle3"``); :func:`specdec.kinds.kind_of` turns it into the kind object.
        ref: the draft model reference (``model``), the n-gram sizes (``ngram``), the head directory
            or version (``eagle3``), the derivation base (``derived`` loaded from a pair), or ``None``.
        recipe: the :class:`~specdec.models.derived.DerivedDraftRecipe` as a dict (derived drafts only).
        loaded: the :class:`~specdec.models.LoadedModel` of a ``model`` drafter.
        compatibility: the compatibility result as a dict (``model``, ``eagle3``).
    """

    drafter: Any
    kind: str
    ref: str | None = None
    recipe: dict | None = None
    loaded: Any = None
    compatibility: dict | None = None


@dataclass(frozen=True)
class RegisteredDrafter:
    """A drafter as a registered pair version names it (plain data; :mod:`flows.loading` fills it).

    Attributes:
        label: the stored drafter kind label (tag ``drafter_kind``).
        uri: the draft version (``models:/<name>/<v>``: a checkpoint or a head), None for a model-free kind.
        weights_sha256: the draft version's weights hash as registered (None when none).
        base_uri: the target version a derived draft is derived from (its lineage; else the pair's target).
        recipe: the derivation recipe dict (derived drafts), the pair's :meth:`DrafterKind.pair_recipe`
            (``ngram``: its sizes; the registry fills a kind's ``legacy_recipe`` for older pairs), else None.
        target_key: the worker-cache key of the pair's loaded target (a head is loaded against it).
        device, dtype: where and in what precision the models load (strings).
        base_adapter: the LoRA adapter merged into the base a derived draft derives from (the derived-recipe version's
            ``derived_from_adapter`` record: ``uri, name, weights_sha256, base_weights_sha256``), None: none.
    """

    label: str
    uri: str | None = None
    weights_sha256: str | None = None
    base_uri: str | None = None
    recipe: dict | None = None
    target_key: tuple = ()
    device: str = "cpu"
    dtype: str = "torch.float32"
    base_adapter: dict | None = None


class DraftLoader(Protocol):
    """What a registered drafter is loaded through (the registry side implements it; specdec imports no registry).

    ``weights_sha256(uri)``: a registered version's weights hash. ``checkpoint(uri, shared=False, adapter=None)``:
    the :class:`~specdec.models.LoadedModel` of a registered checkpoint (``shared``: from the worker
    cache the target is in, so a draft derived from the target shares its load; ``adapter``: a pair's adapter
    record, merged into it). ``directory(uri)``:
    a registered artifact downloaded (a head directory).
    """

    def weights_sha256(self, uri: str) -> str: ...

    def checkpoint(self, uri: str, *, shared: bool = False, adapter: dict | None = None) -> Any: ...

    def directory(self, uri: str) -> Path: ...


@dataclass(frozen=True)
class ServingRequest:
    """What an engine profile's serving table is given for a validated pair
    (:meth:`specdec.engines.profile.EngineProfile.serving_config`, :func:`specdec.validation.serving.serving_config`).

    Attributes:
        engine: ``vllm``, ``sglang``, ``transformers`` or ``llamacpp``.
        label: the stored drafter kind label.
        k: the validated number of speculative tokens (>= 1).
        draft: what the engine loads as the draft (path, Hub id, GGUF file), None for a model-free kind.
        target: what the engine loads as the target (llama.cpp needs it).
        recipe: what a model-free drafter was validated with beyond its label (the ``ngram`` sizes,
            :meth:`DrafterKind.pair_recipe`), None for the kind's defaults.
        tau: the validated assistant confidence threshold, or None.
        target_adapter: the target's LoRA adapter as the engine loads it (llama.cpp: a GGUF LoRA file that
            ``convert_lora_to_gguf.py`` wrote), None for the target as it is.
    """

    engine: str
    label: str
    k: int
    draft: str | None = None
    target: str | None = None
    recipe: dict | None = None
    tau: float | None = None
    target_adapter: str | None = None


class DrafterKind:
    """One drafter kind: its facts (class attributes) and what it does (methods); see :mod:`specdec.kinds`.

    The defaults here are those of a kind with a draft model the engines load as ``draft_model`` /
    ``STANDALONE`` / ``assistant_model`` (the ``model`` kind uses them as they are); a kind overrides
    what differs.
    """

    #: the family name: the stored label (or the label prefix, ``derived:<precision>``) and the spec prefix
    name: ClassVar[str] = ""
    #: the kind has weights of its own (a checkpoint or head that is registered, downloaded and hashed)
    needs_draft_weights: ClassVar[bool] = False
    #: it proposes without any model pass (draft cost 0, one-hot q, no KL, no draft version in a pair)
    model_free: ClassVar[bool] = False
    #: the draft is the target plus a recipe, re-derived from each target version it is paired with
    derives_from_target: ClassVar[bool] = False
    #: it reads the target's hidden states (``Drafter.target_layer_ids``)
    reads_target_features: ClassVar[bool] = False
    #: it can be re-trained (warm-started) when its target changes (:mod:`flows.realign`)
    retrainable: ClassVar[bool] = False
    #: it is validated without the target's weights when an engine serves the target (a served night: the target
    #: is :func:`specdec.validation.served_target.served_target`; the drafter reads no target weights or features)
    beside_served_target: ClassVar[bool] = False
    #: vLLM ``speculative_config.method`` / SGLang ``--speculative-algorithm`` for this kind: names the engines
    #: give it (what the engines' serving tables write, and Model Optimizer's method name); "" where they have none
    vllm_method: ClassVar[str] = "draft_model"
    sglang_algorithm: ClassVar[str] = "STANDALONE"
    #: the :meth:`pair_recipe` a pair version registered before the kind stored one means (None: no recipe)
    legacy_recipe: ClassVar[dict | None] = None

    # ---- labels and specs -------------------------------------------------------------------
    def owns(self, text: str) -> bool:
        """Whether the spec or stored label ``text`` is of this kind (``<name>`` or ``<name>:...``)."""
        return text == self.name or text.startswith(self.name + ":")

    def labels(self) -> tuple[str, ...]:
        """Every label this kind stores (tags ``drafter_kind``, history rows)."""
        return (self.name,)

    def label(self, spec: str) -> str:
        """The stored label of a spec of this kind (checked: :meth:`check`)."""
        self.check(spec)
        return self.name

    def ref(self, spec: str) -> str:
        """The reference part of a spec (``<name>:<ref>`` -> ``<ref>``)."""
        return spec.removeprefix(self.name + ":")

    def check(self, spec: str) -> str:
        """Check a spec's syntax without loading anything; returns it stripped.

        Raises:
            DrafterSpecError: malformed (one line naming the accepted form).
        """
        return spec.strip()

    def slug(self, spec: str) -> str:
        """A name fragment for a spec (registered-model names): ``:`` becomes ``-``."""
        return spec.replace(":", "-")

    def pair_recipe(self, spec: str) -> dict | None:
        """What a registered pair of a model-free kind stores, besides its label, to load ``spec`` again
        (tag ``drafter_recipe``, ``pair.json`` ``recipe``); None when the label says all. A kind with a
        draft version keeps its recipe on that version instead."""
        return None

    def recipe_of(self, obj: Any) -> dict | None:
        """The :meth:`pair_recipe` of a bare drafter object of this kind (None: the label says all)."""
        return None

    def reuse_spec(self, spec: str, version_uri: str) -> str:
        """The spec that registers the drafter ``spec`` registered as ``version_uri`` once more
        (with a new target): the spec itself for a kind that re-resolves it."""
        return spec

    # ---- loading ---------------------------------------------------------------------------
    def resolve(self, spec: str, target: Any, *, store: ModelStore, dtype=None,
                device=None) -> ResolvedDrafter:
        """Build the drafter ``spec`` names for ``target`` (a :class:`~specdec.models.LoadedModel`); a draft
        model reference is fetched/converted into ``store`` (the model caches, built at the edge)."""
        raise NotImplementedError(f"{type(self).__name__}.resolve")

    def load(self, reg: RegisteredDrafter, target: Any, loader: DraftLoader, *, dtype=None,
             device=None) -> ResolvedDrafter:
        """Build the drafter a registered pair version names (artifacts through ``loader``)."""
        raise NotImplementedError(f"{type(self).__name__}.load")

    def cache_key(self, reg: RegisteredDrafter, loader: DraftLoader) -> tuple:
        """The worker-cache key of a registered drafter: everything its loaded weights depend on
        (content hashes, not names; device and dtype)."""
        return (self.name, reg.uri, reg.weights_sha256, reg.device, reg.dtype)

    def identity(self, label: str, weights_sha256: str | None, tokenizer_sha256: str | None) -> tuple[str, str, str]:
        """What identifies the draft side of a pair version (:func:`registry.changes.compute_changed`):
        a model-free kind by its label, any other by its weights (a derived draft's weights hash is
        its derivation identity)."""
        return (label if self.model_free else "model-or-derived", weights_sha256 or "", tokenizer_sha256 or "")

    def registered_draft_problem(self, label: str, uri: str, artifact: str, recipe: dict | None) -> str | None:
        """Why the registered draft version ``uri`` (its ``artifact`` and ``recipe``) cannot be this kind's
        draft, or None. A derived-recipe version belongs to the derived kind (:meth:`registered_draft_problem`
        of :class:`specdec.kinds.derived.DerivedKind` names the label it needs)."""
        if artifact == "derived-recipe":
            return f"{uri} is a derived-recipe draft: use drafter kind derived:{(recipe or {}).get('kind')}"
        return None

    def compatibility_notes(self, label: str) -> list[str]:
        """Notes recorded in a pair's compatibility result for a kind that has no draft model to check."""
        return []

    def same_as_target(self, label: str, target_dtype: Any) -> str | None:
        """Why this drafter would be the target itself for a target of ``target_dtype`` (None: it is not)."""
        return None

    # ---- serving (the settings themselves are the engine profiles' serving tables) -------------
    def serving_note(self, label: str) -> str | None:
        """How an engine serves this drafter beyond the settings (None: nothing to add)."""
        return None

    # ---- description -----------------------------------------------------------------------
    def describe(self, label: str, ref: str | None = None) -> str:
        """One line naming the drafter (CLI, findings)."""
        return f"{label} drafter" + (f" {ref}" if ref else "")

    def finding(self, group: Any) -> str | None:
        """A kind-specific note on a validated group (:func:`specdec.validation.findings.findings`), or None."""
        return None

    # ---- decoding objects ------------------------------------------------------------------
    def claims(self, obj: Any) -> bool:
        """Whether ``obj`` (what decoding takes) is a drafter of this kind."""
        return False

    def draft_model(self, obj: Any) -> Any:
        """The draft causal LM inside ``obj`` (None: the kind has none, or it is not a causal LM)."""
        return None

