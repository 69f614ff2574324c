"""Draft/target pairs as versions of one MLflow registered model (default ``specdec-pair``).

Each pair version's artifact is ``pair.json``: the exact target and draft model versions
(``models:/<name>/<v>``; no draft for ``ngram``), the drafter kind, the decoding config, the
compatibility-check result, and ``changed``: which side differs from the previous pair version
(``initial | target | draft | both | config | none``), decided by comparing weight/tokenizer hashes.

Registration tags, all kept in ``pair.json`` (``"tags"``): ``target``, ``draft`` (``none`` for ngram),
``drafter_kind``, ``changed``, ``config_changed``, ``previous_version``, ``target.weights_sha256``,
``target.tokenizer_sha256``, ``draft.weights_sha256``, ``draft.tokenizer_sha256``, ``config_sha256``,
``num_speculative_tokens``, ``temperature``, ``top_k``, ``top_p``, ``max_new_tokens``, ``compatible``,
``compatibility`` (JSON). The version shows a few (:mod:`registry.describe`) and a one-line description.

Registering an identical pair (same target version, draft version, drafter kind and config) returns the
existing version.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from registry.adapters import adapter_side
from registry.changes import DRAFTER_RECIPE_TAG, compute_changed, drafter_recipe_of, same_config
from registry.describe import plain_text, registration_description, select_registration_tags
from registry.errors import AliasNotFound, PairNotFound
from registry.models import (
    ModelVersionRef,
    canonical_json,
    client_download_model_version,
    client_get_model_version,
    validate_name,
)
from registry.pairfile import PAIR_FILE, full_tags, overlay_tags, read_pair_doc
from registry.service import Registry, mlflow_errors
from specdec.redact import shown_url
from specdec.core.config import SpeculativeConfig
from specdec.models.resolve import SMOLLM2_GGUF_SHA256
from specdec.models.store import ModelStore
from specdec.validation.serving import engine_config
from specdec.kinds import DERIVED, EAGLE3, LAYERSKIP, MODEL, NGRAM, KindTable, kind_of_label, stored_labels

PAIR_SCHEMA_VERSION = 1
DRAFTER_KINDS = stored_labels()  # the kinds registry's stored labels (specdec.kinds)
CHANGED_VALUES = ("initial", "target", "draft", "both", "config", "none")


@dataclass(frozen=True)
class DraftSide:
    """How a kind's pair version records its draft side (one :data:`DRAFT_SIDES` entry).

    Attributes:
        draft_version: the pair names a registered draft version (a checkpoint, a derived recipe, a head);
            else ``draft`` is ``none``.
        pair_recipe: the kind's recipe is the pair's own (tag ``drafter_recipe``, part of its identity;
            :meth:`specdec.kinds.DrafterKind.pair_recipe`); else a recipe lives on the draft version.
        lineage_prefix: the draft version's tags with this prefix are copied as ``draft.<tag>`` (a head's
            lineage, :mod:`registry.heads`), or None.
        served_from: what an engine loads as the draft (:func:`registry.runs`' serving config): ``draft``
            (the draft version's ``draft.serve_ref``), ``target`` (the target's checkpoint plus the recipe)
            or ``none`` (no model).
    """

    draft_version: bool
    pair_recipe: bool = False
    lineage_prefix: str | None = None
    served_from: str = "draft"


#: how each drafter kind's pair version is tagged (tests/registry/test_kind_tables.py fails until a new kind has
#: its entry)
DRAFT_SIDES: KindTable[DraftSide] = KindTable("the pair draft sides (registry.pairs.DRAFT_SIDES)", {
    NGRAM: DraftSide(draft_version=False, pair_recipe=True, served_from="none"),
    DERIVED: DraftSide(draft_version=True, served_from="target"),
    EAGLE3: DraftSide(draft_version=True, lineage_prefix="eagle3."),
    LAYERSKIP: DraftSide(draft_version=False, pair_recipe=True, served_from="target"),
    MODEL: DraftSide(draft_version=True),
})


@dataclass
class PairVersion:
    """One pair version, as plain data (what the Prefect flow loads and validates).

    Attributes:
        name, version: pair registered model name and version (decimal string).
        drafter_kind: ``model | ngram | derived:int8 | derived:int4 | derived:bf16 | derived:fp8``.
        target_uri / draft_uri: ``models:/<name>/<v>``; ``draft_uri`` is None for ngram.
        target_weights_sha256, target_tokenizer_sha256, draft_weights_sha256, draft_tokenizer_sha256:
            hashes recorded at registration (draft ones None for ngram).
        config: :class:`specdec.SpeculativeConfig` (k, sampling, max_new_tokens).
        compatibility: the compatibility-check result dict.
        changed: ``initial | target | draft | both | config | none`` vs ``previous_version``.
        recipe: the derived-draft recipe (``DerivedDraftRecipe.to_dict()``) for ``derived:*``; a model-free
            drafter's (``ngram``: its sizes, tag ``drafter_recipe``; :func:`registry.changes.drafter_recipe_of`
            fills the kind's ``legacy_recipe`` for a version registered before); else None.
        target_source / draft_source: the models' ``source`` dicts.
        aliases: aliases pointing at this version, read from MLflow now.
        tags: every tag: the registration tags kept in ``pair.json`` overlaid with the version's current
            MLflow tags (validation_status, acceptance_rate, promotion, ...; :mod:`registry.describe`).
        target_path / draft_path: local artifact directories (downloaded when requested), else None.
            For ``derived:*`` the draft directory holds ``recipe.json``: re-derive the draft with
            ``specdec.models.derived.derive_draft(target_model, DerivedDraftRecipe.from_dict(pv.recipe))``.
        reused: True when :func:`register_pair` found an identical existing version.
        description: the version's one-line description (:mod:`registry.describe`) as plain text
            (the stored Markdown escapes ``\\@`` before mentions; :func:`registry.describe.plain_text`).
        target_adapter / draft_adapter: the LoRA adapter version merged into the target / draft
            (:func:`registry.adapters.adapter_side`: ``uri, name, weights_sha256, base_weights_sha256, rank,
            target_modules``), None: the model as it is.
    """

    name: str
    version: str
    drafter_kind: str
    target_uri: str
    draft_uri: str | None
    target_weights_sha256: str
    target_tokenizer_sha256: str
    draft_weights_sha256: str | None
    draft_tokenizer_sha256: str | None
    config: SpeculativeConfig
    compatibility: dict[str, Any] = field(default_factory=dict)
    changed: str = "initial"
    config_changed: bool = False
    previous_version: str | None = None
    recipe: dict[str, Any] | None = None
    target_source: dict[str, Any] = field(default_factory=dict)
    draft_source: dict[str, Any] | None = None
    aliases: list[str] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)
    created_at: str | None = None
    target_path: Path | None = None
    draft_path: Path | None = None
    reused: bool = False
    description: str | None = None
    target_adapter: dict[str, Any] | None = None
    draft_adapter: dict[str, Any] | None = None

    @property
    def uri(self) -> str:
        """``models:/<pair>/<version>``."""
        return f"models:/{self.name}/{self.version}"

    @property
    def validation_status(self) -> str | None:
        """``passed`` / ``failed`` from the latest validation tag, or None if never validated."""
        return self.tags.get("validation_status")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (paths as strings)."""
        d = asdict(self)
        d["config"] = self.config.to_dict()
        d["target_path"] = str(self.target_path) if self.target_path else None
        d["draft_path"] = str(self.draft_path) if self.draft_path else None
        return d


def compatibility_to_dict(result: Any) -> dict[str, Any]:
    """Turn a ``specdec.models.CompatibilityResult`` (dataclass, pydantic model or dict) into a plain dict."""
    if result is None:
        return {}
    if isinstance(result, dict):
        return dict(result)
    if hasattr(result, "to_dict"):
        return dict(result.to_dict())
    if hasattr(result, "model_dump"):
        return dict(result.model_dump())
    from dataclasses import is_dataclass

    if is_dataclass(result):
        return asdict(result)
    return {k: v for k, v in vars(result).items() if not k.startswith("_")}


def _resolve_model(client, ref: ModelVersionRef | str) -> ModelVersionRef:
    return ref if isinstance(ref, ModelVersionRef) else client_get_model_version(client, ref)


def _optional(v: Any) -> str:
    return "none" if v is None else str(v)


def register_pair(
    target: ModelVersionRef | str,
    draft: ModelVersionRef | str | None,
    *,
    drafter_kind: str = "model",
    config: SpeculativeConfig = SpeculativeConfig(),
    compatibility: Any = None,
    name: str | None = None,
    description: str | None = None,
    registry: Registry,
    engine: str | None = None,
    drafter_recipe: dict | None = None,
    store: ModelStore | None = None,
    target_adapter: ModelVersionRef | None = None,
    draft_adapter: ModelVersionRef | None = None,
) -> PairVersion:
    """Register a pair version referencing exact target/draft model versions.

    Length: argument checks, lineage, the identical-pair lookup and the write form one transaction-like
    sequence against MLflow; each step needs the previous one's facts.

    Args:
        target: target model version (:class:`ModelVersionRef` or ``models:/<name>/<v>``).
        draft: draft model version, or None for ``drafter_kind="ngram"``.
        drafter_kind: ``model | ngram | derived:int8 | derived:int4 | derived:bf16 | derived:fp8``. For ``derived:*`` the draft must be a
            derived-recipe version of that kind whose ``derived_from`` is any target version (lineage is
            recorded; a draft derived from an older target is allowed and shows as such).
        config: decoding config (k, sampling, max_new_tokens).
        compatibility: the compatibility-check result (``CompatibilityResult`` or dict), stored verbatim.
        name: pair registered model (default: the registry section's ``pair_name``, ``SPECDEC_PAIR_NAME`` / ``specdec-pair``).
        description: optional version description.
        registry: the job's registry service (:class:`registry.service.Registry`).
        engine: the serving engine profile (``vllm``, ``sglang``, ``transformers``), recorded in
            ``pair.json`` (tag ``engine``); validations log its serving configuration, and the pair's
            proposal rule is the engine's (:func:`engine_config`). Not part of the identity:
            re-registering an identical pair with another engine reuses the version.
        drafter_recipe: a model-free drafter's settings beyond its label (``ngram``: ``{"max_ngram",
            "min_ngram"}``, :meth:`specdec.kinds.DrafterKind.pair_recipe`; None: the kind's defaults now),
            stored as tag ``drafter_recipe`` and part of the pair's identity.
        store: the caller's model caches (:class:`~specdec.models.ModelStore`), where the SmolLM2 GGUF file of a
            conversion cached before ``gguf_path`` was kept is found (:func:`serve_tags`); None: no such lookup.
        target_adapter / draft_adapter: a LoRA adapter version (:func:`registry.adapters.register_adapter`) merged
            into the target / the draft, part of the pair's identity (tags ``target_adapter``,
            ``target_adapter.weights_sha256``, ...; ``pair.json`` keeps :func:`registry.adapters.adapter_side`).
    Returns:
        :class:`PairVersion` (no artifacts downloaded). ``reused=True`` if an identical pair existed.
    Raises:
        ValueError: inconsistent drafter kind / draft; ModelNotFound: a referenced model version is missing;
        RegistryUnavailable: server unreachable.
    """
    engine, config = engine_config(engine, config)
    if not isinstance(config, SpeculativeConfig):
        raise TypeError(f"config must be a specdec.SpeculativeConfig, got {type(config).__name__}")
    kind, drafter_recipe = _checked_drafter(drafter_kind, draft, drafter_recipe)
    client, name = registry.client, validate_name(name or registry.settings.pair_name)
    uri = client.tracking_uri
    with mlflow_errors(uri):
        t = _resolve_model(client, target)
        draft_ref = _resolve_model(client, draft) if draft is not None else None
        problem = draft_ref and kind.registered_draft_problem(drafter_kind, draft_ref.uri, draft_ref.artifact, draft_ref.recipe)
        if problem:
            raise ValueError(problem)
        compat = compatibility_to_dict(compatibility)
        if compat.get("compatible") is False:
            raise ValueError("refusing to register an incompatible pair: " + "; ".join(map(str, compat.get("problems") or ["compatible=False"])))
        cfg = config.to_dict()
        tags = {
            "target": t.uri, "draft": draft_ref.uri if draft_ref else "none", "drafter_kind": drafter_kind,
            "target.weights_sha256": t.weights_sha256, "target.tokenizer_sha256": t.tokenizer_sha256,
            "draft.weights_sha256": draft_ref.weights_sha256 if draft_ref else "none",
            "draft.tokenizer_sha256": draft_ref.tokenizer_sha256 if draft_ref else "none",
            "config_sha256": config.sha256(), **config.to_tags(),
            "compatible": _optional(compat.get("compatible", True if compat else None)).lower(),
            "compatibility": canonical_json(compat)[:5000], "engine": engine,
        }
        tags.update(serve_tags("target", t.source, store))
        tags.update(_draft_side_tags(kind, draft_ref, drafter_recipe, store))
        tags.update(_adapter_pair_tags(target_adapter, draft_adapter))
        existing = _pair_versions(client, name)
        for mv in existing:
            mt = mv.tags or {}
            if all(mt.get(k) == tags[k] for k in ("target", "draft", "drafter_kind")) and \
                    _same_settings(full_tags(client, mv), tags):
                pv = _pair_from_artifact(client, mv)
                pv.reused = True
                return pv
        prev = max(existing, key=lambda mv: int(mv.version)) if existing else None
        changed, config_changed = compute_changed(full_tags(client, prev) if prev else None, tags)
        tags.update(changed=changed, config_changed=str(config_changed).lower(),
                    previous_version=str(prev.version) if prev else "none")
        doc = {
            "schema_version": PAIR_SCHEMA_VERSION, "name": name, "drafter_kind": drafter_kind,
            "target": {"uri": t.uri, "weights_sha256": t.weights_sha256, "tokenizer_sha256": t.tokenizer_sha256, "source": t.source},
            "draft": None if draft_ref is None else {"uri": draft_ref.uri, "weights_sha256": draft_ref.weights_sha256,
                                              "tokenizer_sha256": draft_ref.tokenizer_sha256, "source": draft_ref.source,
                                              "derived_from": draft_ref.derived_from},
            "recipe": draft_ref.recipe if draft_ref is not None else drafter_recipe,
            "target_adapter": adapter_side(target_adapter), "draft_adapter": adapter_side(draft_adapter),
            "config": cfg, "compatibility": compat, "changed": changed, "config_changed": config_changed,
            "previous_version": str(prev.version) if prev else None,
            "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "tags": tags, "description": description,
        }
        mv = _log_pair(registry, name, doc, tags, description)
        return _from_doc(mv, doc, aliases=[])


def _checked_drafter(drafter_kind: str, draft: Any, drafter_recipe: dict | None):
    """``(kind, recipe)`` of a pair's drafter arguments: the kind of the label, and the pair's recipe for a kind
    that keeps one (:data:`DRAFT_SIDES`; the kind's defaults when None). Raises ValueError on an unknown label or
    a draft/recipe the kind does not take."""
    if drafter_kind not in DRAFTER_KINDS:
        raise ValueError(f"unknown drafter kind {drafter_kind!r}; use one of {', '.join(DRAFTER_KINDS)}")
    kind = kind_of_label(drafter_kind)
    side = DRAFT_SIDES[kind]
    if not side.draft_version and draft is not None:
        raise ValueError(f"an {drafter_kind} pair has no draft model: pass draft=None")
    if side.draft_version and draft is None:
        raise ValueError(f"drafter kind {drafter_kind!r} needs a draft model version")
    if side.pair_recipe:
        return kind, kind.pair_recipe(drafter_kind) if drafter_recipe is None else drafter_recipe
    if drafter_recipe is not None:
        raise ValueError(f"a {drafter_kind} pair keeps its recipe on its draft version, not as drafter_recipe")
    return kind, None


def _draft_side_tags(kind, draft_ref: ModelVersionRef | None, drafter_recipe: dict | None,
                     store: ModelStore | None) -> dict[str, str]:
    """The draft side's serving (:func:`serve_tags` with ``store``), lineage and recipe tags (a pair without a
    draft version: only its recipe)."""
    if draft_ref is None:
        return {DRAFTER_RECIPE_TAG: canonical_json(drafter_recipe)} if drafter_recipe is not None else {}
    tags = serve_tags("draft", draft_ref.source, store)
    if draft_ref.derived_from:
        tags["draft.derived_from"] = draft_ref.derived_from
    prefix = DRAFT_SIDES[kind].lineage_prefix
    if prefix:  # e.g. a head's lineage (registry.heads)
        tags.update({f"draft.{k}": v for k, v in draft_ref.tags.items() if k.startswith(prefix)})
    return tags


def _same_settings(a: dict[str, str], b: dict[str, str]) -> bool:
    """Same decoding config, same model-free drafter recipe and same adapters (the rest of a pair's identity)."""
    same_adapters = all(a.get(k, "none") == b.get(k, "none") for k in ADAPTER_TAGS)
    return same_config(a, b) and drafter_recipe_of(a) == drafter_recipe_of(b) and same_adapters


#: the pair tags that name its LoRA adapters (absent: none)
ADAPTER_TAGS = ("target_adapter", "target_adapter.weights_sha256", "draft_adapter", "draft_adapter.weights_sha256")


def _adapter_pair_tags(target_adapter: ModelVersionRef | None, draft_adapter: ModelVersionRef | None) -> dict[str, str]:
    """``<side>_adapter`` (its version URI), ``<side>_adapter.weights_sha256`` and ``<side>_adapter.name`` of each
    adapter the pair has; nothing for a side without one (older versions read as ``none``)."""
    out: dict[str, str] = {}
    for side, ref in (("target_adapter", target_adapter), ("draft_adapter", draft_adapter)):
        if ref is not None:
            out.update({side: ref.uri, f"{side}.weights_sha256": ref.weights_sha256,
                        f"{side}.name": ref.tags.get("adapter.name", ref.name)})
    return out


def serve_tags(side: str, source: dict[str, Any] | None, store: ModelStore | None = None) -> dict[str, str]:
    """What a serving engine loads for one side of the pair, from the model's ``source``:
    ``<side>.serve_ref`` (a Hub id, a local checkpoint directory, or the GGUF file itself) and, for
    a GGUF, ``<side>.gguf_sha256`` (the file's hash: the lineage an engine serving the file can be
    checked against). Empty for a derived draft (it is the target's checkpoint plus its recipe). ``store``: where
    the SmolLM2 GGUF file of a conversion cached before ``gguf_path`` was kept lies (None: no serve_ref then)."""
    source = source or {}
    kind = source.get("kind")
    ref = None
    if kind == "hub":
        ref = source.get("repo_id") or source.get("ref")
    elif kind == "gguf":
        ref = source.get("gguf_path") or (source.get("ref") if str(source.get("ref", "")).endswith(".gguf") else None)
        if ref is None and store is not None and source.get("gguf_sha256") == SMOLLM2_GGUF_SHA256:
            from specdec.models.resolve import smollm2_gguf  # converted before gguf_path was kept

            ref = str(smollm2_gguf(store))
    elif kind in ("local", "cast"):  # a cast copy (specdec model cast) is served from its own directory
        ref = source.get("path") or source.get("ref")
    out = {f"{side}.serve_ref": str(ref)} if ref else {}
    if kind == "gguf" and source.get("gguf_sha256"):
        out[f"{side}.gguf_sha256"] = str(source["gguf_sha256"])
    return out


def _log_pair(registry: Registry, name: str, doc: dict[str, Any], tags: dict[str, str], description: str | None):
    """Registration run (params = decoding config) -> logged model with ``pair.json`` -> pair version."""
    from registry.models import log_and_register

    params = {**{k: _optional(v) for k, v in doc["config"].items()}, "drafter_kind": doc["drafter_kind"],
              "target": tags["target"], "draft": tags["draft"], "changed": tags["changed"]}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / PAIR_FILE).write_text(json.dumps(doc, indent=2, sort_keys=True))
        return log_and_register(
            registry, name, Path(tmp), select_registration_tags(tags), params, model_type="specdec-pair",
            description=registration_description(doc),
            run_tags={"specdec.pair": name, "specdec.kind": "pair"},
            model_description=PAIR_MODEL_DESCRIPTION)


PAIR_MODEL_DESCRIPTION = ("specdec draft/target pairs: each version is a pair.json referencing exact "
                          "target/draft model versions and the decoding config")


def check_pairs_exist(pairs: list[str], *, registry: Registry) -> None:
    """Nothing when every name in ``pairs`` is a registered pair.

    Raises:
        PairNotFound: one line naming the first unknown pair, with the closest registered name ("did you mean")
            and how to list them. RegistryUnavailable: the tracking server does not answer.
    """
    import difflib

    known = pair_names(registry=registry)
    for name in pairs:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise PairNotFound(f"pair {name!r} is not registered: {hint}(`specdec pair list` lists the "
                               f"{len(known)} registered)")


def pair_names(*, registry: Registry) -> list[str]:
    """The registered models that hold pairs (their description is :data:`PAIR_MODEL_DESCRIPTION`), sorted."""
    client = registry.client
    with mlflow_errors(client.tracking_uri):
        names, token = [], None
        while True:
            page = client.search_registered_models(max_results=100, page_token=token)
            names += [m.name for m in page if (m.description or "") == PAIR_MODEL_DESCRIPTION]
            token = page.token
            if not token:
                return sorted(names)


def newest_pair_version(pair: str, *, registry: Registry) -> str:
    """The newest version number of ``pair`` (one search, no ``pair.json`` read).

    Raises:
        PairNotFound: no registered model ``pair``, or it has no version.
    """
    client = registry.client
    with mlflow_errors(client.tracking_uri):
        versions = [int(m.version) for m in _pair_versions(client, pair)]
    if not versions:
        raise PairNotFound(f"pair {pair!r} is not registered (no registered model of that name) or has no version")
    return str(max(versions))


def _pair_versions(client, name: str) -> list:
    return list(client.search_model_versions(f"name='{name}'"))


def _aliases(client, name: str) -> dict[str, str]:
    return {a: str(v) for a, v in (client.get_registered_model(name).aliases or {}).items()}


def _from_doc(mv, doc: dict[str, Any], aliases: list[str], reused: bool = False) -> PairVersion:
    target_doc, draft_doc = doc["target"], doc.get("draft")
    return PairVersion(
        name=mv.name, version=str(mv.version), drafter_kind=doc["drafter_kind"],
        target_uri=target_doc["uri"], draft_uri=draft_doc["uri"] if draft_doc else None,
        target_weights_sha256=target_doc["weights_sha256"], target_tokenizer_sha256=target_doc["tokenizer_sha256"],
        draft_weights_sha256=draft_doc["weights_sha256"] if draft_doc else None,
        draft_tokenizer_sha256=draft_doc["tokenizer_sha256"] if draft_doc else None,
        config=SpeculativeConfig.from_dict(doc["config"]), compatibility=doc.get("compatibility") or {},
        changed=doc.get("changed", "initial"), config_changed=bool(doc.get("config_changed", False)),
        previous_version=doc.get("previous_version"),
        recipe=doc.get("recipe") or drafter_recipe_of({"drafter_kind": doc["drafter_kind"], **(doc.get("tags") or {})}),
        target_source=target_doc.get("source") or {}, draft_source=draft_doc.get("source") if draft_doc else None,
        aliases=aliases, tags=overlay_tags(doc.get("tags"), mv.tags), created_at=doc.get("created_at"),
        reused=reused, description=plain_text(mv.description), target_adapter=doc.get("target_adapter"),
        draft_adapter=doc.get("draft_adapter"),
    )


def _adapter_of(tags: dict[str, str], side: str) -> dict[str, Any] | None:
    """A listing's short record of one adapter from the pair's tags (``uri, name, weights_sha256``), else None."""
    uri = tags.get(side)
    if uri in (None, "none"):
        return None
    return {"uri": uri, "name": tags.get(f"{side}.name"), "weights_sha256": tags.get(f"{side}.weights_sha256")}


def _from_mv(client, mv, reused: bool = False, aliases: list[str] | None = None) -> PairVersion:
    """Build a PairVersion from its registration tags (``pair.json``) and current tags: used for listings."""
    tg = full_tags(client, mv)
    none = lambda v: None if v in (None, "none") else v  # noqa: E731
    try:
        compat = json.loads(tg.get("compatibility", "{}"))
    except json.JSONDecodeError:
        compat = {}
    if aliases is None:
        aliases = sorted(a for a, v in _aliases(client, mv.name).items() if v == str(mv.version))
    return PairVersion(
        name=mv.name, version=str(mv.version), drafter_kind=tg.get("drafter_kind", ""),
        target_uri=tg.get("target", ""), draft_uri=none(tg.get("draft")),
        target_weights_sha256=tg.get("target.weights_sha256", ""), target_tokenizer_sha256=tg.get("target.tokenizer_sha256", ""),
        draft_weights_sha256=none(tg.get("draft.weights_sha256")), draft_tokenizer_sha256=none(tg.get("draft.tokenizer_sha256")),
        config=SpeculativeConfig.from_tags(tg), compatibility=compat, changed=tg.get("changed", ""),
        config_changed=tg.get("config_changed") == "true", previous_version=none(tg.get("previous_version")),
        recipe=drafter_recipe_of(tg), aliases=aliases, tags=tg, reused=reused, description=plain_text(mv.description),
        target_adapter=_adapter_of(tg, "target_adapter"), draft_adapter=_adapter_of(tg, "draft_adapter"),
        created_at=datetime.fromtimestamp(mv.creation_timestamp / 1000, timezone.utc).isoformat(timespec="seconds"),
    )


def pair_aliases(client, pair: str) -> dict[str, str]:
    """Alias -> version of the pair registered model.

    Raises:
        PairNotFound: no registered model ``pair``.
    """
    from mlflow.exceptions import MlflowException

    try:
        return _aliases(client, pair)
    except MlflowException as e:
        if e.error_code == "RESOURCE_DOES_NOT_EXIST":
            raise PairNotFound(f"pair {pair!r} is not registered (no registered model of that name)") from e
        raise


def get_pair_model_version(client, pair: str, version: str):
    """The MLflow ModelVersion of a pair version, or PairNotFound naming what is missing."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version(pair, str(version))
    except MlflowException as e:
        if e.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise
        pair_aliases(client, pair)  # raises "pair ... is not registered" when the whole pair is missing
        have = sorted(int(mv.version) for mv in _pair_versions(client, pair))
        latest = f"versions 1..{have[-1]}" if have else "no versions"
        raise PairNotFound(f"pair version models:/{pair}/{version} not found ({pair} has {latest})") from e


def _pair_from_artifact(client, mv) -> PairVersion:
    """PairVersion from the version's ``pair.json`` (authoritative) plus its current tags and aliases."""
    doc = read_pair_doc(client, mv)
    aliases = sorted(a for a, av in _aliases(client, mv.name).items() if av == str(mv.version))
    return _from_doc(mv, doc, aliases=aliases)


def client_resolve_alias(client, pair: str, alias: str) -> str:
    """The version an alias points at, read from MLflow on every call (so UI promotions are seen),
    as a decimal string. Raises PairNotFound (no registered model ``pair``), AliasNotFound."""
    aliases = pair_aliases(client, pair)
    if alias not in aliases:
        have = ", ".join(f"@{a} -> v{v}" for a, v in sorted(aliases.items())) or "none"
        raise AliasNotFound(f"pair {pair!r} has no alias @{alias} (aliases: {have})")
    return aliases[alias]


MAX_VERSION = 2**31 - 1  # the largest version number MLflow's stores hold


def client_get_pair_version(client, pair: str, version: str | int, *, cache_dir: Path,
                            download: bool = True) -> PairVersion:
    """Load one pair version from MLflow: ``pair.json`` (authoritative), current tags and aliases, and
    (if ``download``) the target and draft artifacts into the local cache.

    Args:
        pair: pair registered model name.
        version: a version number (``3`` / ``"3"``), or an alias (``"champion"``, ``"@champion"``).
        cache_dir: where downloads go (the registry section's ``cache_dir``).
        download: also download target/draft artifacts (cached per version and hash).
    Returns:
        :class:`PairVersion` with ``target_path`` / ``draft_path`` set when ``download``.
    Raises:
        PairNotFound: pair or version missing; AliasNotFound: alias missing; RegistryUnavailable.
    """
    v = str(version).lstrip("@")
    if v.isdigit() and not 0 < int(v) <= MAX_VERSION:  # MLflow stores versions as 32-bit integers
        raise PairNotFound(f"no version {v[:24]} of {pair}: a version is a number from 1 to {MAX_VERSION} or an alias")
    if not v.isdigit():
        v = client_resolve_alias(client, pair, v)
    pv = _pair_from_artifact(client, get_pair_model_version(client, pair, v))
    if download:
        pv.target_path = client_download_model_version(client, client_get_model_version(client, pv.target_uri),
                                                       cache_dir=cache_dir)
        if pv.draft_uri:
            pv.draft_path = client_download_model_version(client, client_get_model_version(client, pv.draft_uri),
                                                          cache_dir=cache_dir)
    return pv


def list_pair_versions(pair: str | None = None, *, registry: Registry) -> list[PairVersion]:
    """All versions of ``pair`` (default: the registry section's ``pair_name``), newest first, from their tags and ``pair.json``
    (one small download per version; model artifacts are not downloaded).

    Raises:
        PairNotFound: no registered model ``pair``.
    """
    client, pair = registry.client, pair or registry.settings.pair_name
    with mlflow_errors(client.tracking_uri):
        aliases = pair_aliases(client, pair)
        out = []
        for mv in sorted(_pair_versions(client, pair), key=lambda m: -int(m.version)):
            out.append(_from_mv(client, mv, aliases=sorted(a for a, v in aliases.items() if v == str(mv.version))))
    return out


def resolve_alias(pair: str, alias: str, *, registry: Registry) -> str:
    """The version ``alias`` points at now (read on every call, so UI promotions are seen).
    Raises PairNotFound, AliasNotFound."""
    with registry.errors():
        return client_resolve_alias(registry.client, pair, alias)


def get_pair_version(pair: str, version: str | int, *, download: bool = True, registry: Registry) -> PairVersion:
    """One pair version (``pair.json``, tags, aliases; with ``download`` its models in the local cache).
    ``version``: a number or an alias. Raises PairNotFound, AliasNotFound."""
    with registry.errors():
        return client_get_pair_version(registry.client, pair, version, cache_dir=registry.settings.cache_dir,
                                       download=download)


def engine_tags(url: str, flags: list[str] | None, concurrency: int = 1, *,
                engine: str | None = None) -> tuple[dict[str, str], list[str]]:
    """The pair-version tags naming an engine endpoint (``engine``: the profile serving at ``url``, None: the
    default engine; ``engine_url``, ``engine_flags`` as a JSON list, ``engine_concurrency``) and a note for each credential left out: the URL's user info and the value of
    every credential option in ``flags`` (:func:`specdec.redact.redact_argv`) are never stored.

    Raises:
        ValueError: ``url`` is empty, does not parse (e.g. an unclosed IPv6 host) or is not http(s)://HOST;
        ``concurrency`` < 1; ``flags`` is an empty command line; an engine the engine check cannot ask.
    """
    from specdec.engines.profiles import checkable_names, engine_profile
    from specdec.redact import redact_argv, strip_userinfo

    profile = engine_profile(engine)
    if not profile.checkable:
        raise ValueError(f"the engine check cannot ask {profile.name}: use {' or '.join(checkable_names())}")

    text = (url or "").strip()
    try:
        clean, had_userinfo = strip_userinfo(text)
        host = urlsplit(clean).hostname
    except ValueError as e:
        raise ValueError(f"--url {shown_url(text)!r} does not parse ({e})") from None
    if not text or urlsplit(clean).scheme not in ("http", "https") or not host:
        raise ValueError(f"--url must be the engine's http(s)://HOST[:PORT] base URL, got {shown_url(text)!r}")
    if int(concurrency) < 1:
        raise ValueError(f"--concurrency must be at least 1, got {concurrency}")
    dropped = ["the user info in --url is not stored (the engine check authenticates with SPECDEC_ENGINE_API_KEY)"
               ] if had_userinfo else []
    parts = urlsplit(clean)
    if parts.query or parts.fragment:  # where tokens go; the engine check asks the base URL's own paths
        clean = parts._replace(query="", fragment="").geturl()
        dropped.append("the query of --url is not stored (the engine check asks the engine's base URL; it "
                       "authenticates with SPECDEC_ENGINE_API_KEY)")
    tags = {"engine": profile.name, "engine_url": clean, "engine_concurrency": str(int(concurrency))}
    if flags is not None:
        if not flags:
            raise ValueError("--flags is empty: give the engine's command line, or leave --flags out")
        safe = redact_argv(flags)
        if safe != list(flags):
            dropped.append("credentials in --flags (e.g. --api-key VALUE) are stored as ***")
        tags["engine_flags"] = json.dumps(safe)
    return tags, dropped


def set_engine(pair: str, version: str | int, *, tags: dict[str, str], registry: Registry) -> None:
    """Set the engine tags of a pair version (:func:`engine_tags`): the nightly's engine step checks the
    endpoint they name (:mod:`flows.engine_check`). Raises PairNotFound for an unknown version."""
    with registry.errors():
        # an unknown version: a clear error
        client_get_pair_version(registry.client, pair, version, cache_dir=registry.settings.cache_dir, download=False)
        for k, v in tags.items():
            registry.client.set_model_version_tag(pair, str(version), k, v)
