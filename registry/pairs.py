"""Draft/target pairs as versions of one MLflow registered model (default ``specdec-pair``).

Each pair version's artifact is ``pair.json``: the exact target and draft model versions
(``models:/<name>/<v>``; no draft for ``ngram``), the drafter kind, the decoding config, the
compatibility-check result, and ``changed``: which side differs from the previous pair version
(``initial | target | draft | both | config | none``), decided by comparing weight/tokenizer hashes.

Pair version tags (strings; visible in the MLflow UI's version list): ``target``, ``draft``
(``none`` for ngram), ``drafter_kind``, ``changed``, ``config_changed``, ``previous_version``,
``target.weights_sha256``, ``target.tokenizer_sha256``, ``draft.weights_sha256``,
``draft.tokenizer_sha256``, ``config_sha256``, ``num_speculative_tokens``, ``temperature``, ``top_k``,
``top_p``, ``max_new_tokens``, ``compatible``, ``compatibility`` (JSON). Validation adds
``validation_status`` and ``validation.*`` (see :mod:`registry.runs`); promotion adds ``promotion.*``.

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

from registry.errors import AliasNotFound, PairNotFound
from specdec.core.config import SpeculativeConfig
from registry.models import (
    ModelVersionRef, client_download_model_version, ensure_registered_model, client_get_model_version, canonical_json,
    download_version_artifacts,
    sha256_text, validate_name,
)
from registry.settings import REGISTRY_EXPERIMENT, get_client, get_or_create_experiment, get_settings, mlflow_errors

PAIR_FILE = "pair.json"
PAIR_SCHEMA_VERSION = 1
DRAFTER_KINDS = ("model", "ngram", "derived:int8", "derived:int4", "derived:bf16", "derived:fp8")
CHANGED_VALUES = ("initial", "target", "draft", "both", "config", "none")


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
        recipe: the derived-draft recipe (``DerivedDraftRecipe.to_dict()``) for ``derived:*``, else None.
        target_source / draft_source: the models' ``source`` dicts.
        aliases: aliases pointing at this version, read from MLflow now.
        tags: all current version tags (validation_status, promotion.*, ...).
        target_path / draft_path: local artifact directories (downloaded when requested), else None.
            For ``derived:*`` the draft directory holds ``recipe.json``: re-derive the draft with
            ``specdec.models.derived.derive_draft(target_model, DerivedDraftRecipe.from_dict(pv.recipe))``.
        reused: True when :func:`register_pair` found an identical existing version.
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


def _draft_identity(kind: str, weights: str | None, tok: str | None) -> tuple[str, str, str]:
    return (kind if kind == "ngram" else "model-or-derived", weights or "", tok or "")


def compute_changed(prev_tags: dict[str, str] | None, new_tags: dict[str, str]) -> tuple[str, bool]:
    """Which side of the pair changed between two pair versions' tags.

    Compares ``target.weights_sha256`` + ``target.tokenizer_sha256`` (target side), the drafter kind's
    family (ngram vs model) + ``draft.weights_sha256`` + ``draft.tokenizer_sha256`` (draft side; for a
    derived draft the weights hash is the derivation identity, so re-deriving from a new target changes
    it) and the decoding config (decoded from the tags, so versions tagged before k was renamed compare
    equal when their values are).

    Returns:
        ``(changed, config_changed)`` with ``changed`` in ``initial | target | draft | both | config | none``.
    """
    if not prev_tags:
        return "initial", False
    t = (prev_tags.get("target.weights_sha256"), prev_tags.get("target.tokenizer_sha256")) != (
        new_tags.get("target.weights_sha256"), new_tags.get("target.tokenizer_sha256"))
    pd = _draft_identity(prev_tags.get("drafter_kind", ""), prev_tags.get("draft.weights_sha256"), prev_tags.get("draft.tokenizer_sha256"))
    nd = _draft_identity(new_tags.get("drafter_kind", ""), new_tags.get("draft.weights_sha256"), new_tags.get("draft.tokenizer_sha256"))
    d = pd != nd
    c = not same_config(prev_tags, new_tags)
    if t and d:
        return "both", c
    if t:
        return "target", c
    if d:
        return "draft", c
    return ("config" if c else "none"), c


def config_of(tags: dict[str, str]) -> SpeculativeConfig | None:
    """The decoding config recorded in a pair version's tags, or None when they hold none."""
    try:
        return SpeculativeConfig.from_tags(tags)
    except (KeyError, TypeError, ValueError):
        return None


def same_config(a: dict[str, str], b: dict[str, str]) -> bool:
    """Whether two pair versions' tags record the same decoding config.

    Compares the decoded configs when both tag sets hold one (so a version tagged before k was
    renamed equals one tagged after), else the ``config_sha256`` tags.
    """
    ca, cb = config_of(a), config_of(b)
    if ca is not None and cb is not None:
        return ca == cb
    return a.get("config_sha256") == b.get("config_sha256")


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
    tracking_uri: str | None = None,
) -> PairVersion:
    """Register a pair version referencing exact target/draft model versions.

    Args:
        target: target model version (:class:`ModelVersionRef` or ``models:/<name>/<v>``).
        draft: draft model version, or None for ``drafter_kind="ngram"``.
        drafter_kind: ``model | ngram | derived:int8 | derived:int4 | derived:bf16 | derived:fp8``. For ``derived:*`` the draft must be a
            derived-recipe version of that kind whose ``derived_from`` is any target version (lineage is
            recorded; a draft derived from an older target is allowed and shows as such).
        config: decoding config (k, sampling, max_new_tokens).
        compatibility: the compatibility-check result (``CompatibilityResult`` or dict), stored verbatim.
        name: pair registered model (default ``SPECDEC_PAIR_NAME`` / ``specdec-pair``).
        description: optional version description.
        tracking_uri: MLflow URI (default: :mod:`registry.settings`).
    Returns:
        :class:`PairVersion` (no artifacts downloaded). ``reused=True`` if an identical pair existed.
    Raises:
        ValueError: inconsistent drafter kind / draft; ModelNotFound: a referenced model version is missing;
        RegistryUnavailable: server unreachable.
    """
    if drafter_kind not in DRAFTER_KINDS:
        raise ValueError(f"unknown drafter kind {drafter_kind!r}; use one of {', '.join(DRAFTER_KINDS)}")
    if not isinstance(config, SpeculativeConfig):
        raise TypeError(f"config must be a specdec.SpeculativeConfig, got {type(config).__name__}")
    if drafter_kind == "ngram" and draft is not None:
        raise ValueError("an ngram pair has no draft model: pass draft=None")
    if drafter_kind != "ngram" and draft is None:
        raise ValueError(f"drafter kind {drafter_kind!r} needs a draft model version")
    name = validate_name(name or get_settings().pair_name)
    client = get_client(tracking_uri)
    uri = client.tracking_uri
    with mlflow_errors(uri):
        t = _resolve_model(client, target)
        dr = _resolve_model(client, draft) if draft is not None else None
        if dr is not None:
            is_derived = dr.artifact == "derived-recipe"
            if drafter_kind.startswith("derived:"):
                want = drafter_kind.split(":", 1)[1]
                if not is_derived or (dr.recipe or {}).get("kind") != want:
                    raise ValueError(f"drafter kind {drafter_kind} needs a draft registered with register_derived_draft(kind={want!r}); "
                                     f"{dr.uri} is a {dr.artifact} ({(dr.recipe or {}).get('kind', 'no recipe')})")
            elif is_derived:
                raise ValueError(f"{dr.uri} is a derived-recipe draft: use drafter kind derived:{(dr.recipe or {}).get('kind')}")
        compat = compatibility_to_dict(compatibility)
        if compat.get("compatible") is False:
            raise ValueError("refusing to register an incompatible pair: " + "; ".join(map(str, compat.get("problems") or ["compatible=False"])))
        cfg = config.to_dict()
        tags = {
            "target": t.uri, "draft": dr.uri if dr else "none", "drafter_kind": drafter_kind,
            "target.weights_sha256": t.weights_sha256, "target.tokenizer_sha256": t.tokenizer_sha256,
            "draft.weights_sha256": dr.weights_sha256 if dr else "none",
            "draft.tokenizer_sha256": dr.tokenizer_sha256 if dr else "none",
            "config_sha256": config.sha256(), **config.to_tags(),
            "compatible": _optional(compat.get("compatible", True if compat else None)).lower(),
            "compatibility": canonical_json(compat)[:5000],
        }
        if dr is not None and dr.derived_from:
            tags["draft.derived_from"] = dr.derived_from
        existing = _pair_versions(client, name)
        for mv in existing:
            mt = mv.tags or {}
            if all(mt.get(k) == tags[k] for k in ("target", "draft", "drafter_kind")) and same_config(mt, tags):
                pv = _pair_from_artifact(client, mv)
                pv.reused = True
                return pv
        prev = max(existing, key=lambda mv: int(mv.version)) if existing else None
        changed, config_changed = compute_changed(dict(prev.tags or {}) if prev else None, tags)
        tags.update(changed=changed, config_changed=str(config_changed).lower(),
                    previous_version=str(prev.version) if prev else "none")
        doc = {
            "schema_version": PAIR_SCHEMA_VERSION, "name": name, "drafter_kind": drafter_kind,
            "target": {"uri": t.uri, "weights_sha256": t.weights_sha256, "tokenizer_sha256": t.tokenizer_sha256, "source": t.source},
            "draft": None if dr is None else {"uri": dr.uri, "weights_sha256": dr.weights_sha256,
                                              "tokenizer_sha256": dr.tokenizer_sha256, "source": dr.source,
                                              "derived_from": dr.derived_from},
            "recipe": dr.recipe if dr is not None else None,
            "config": cfg, "compatibility": compat, "changed": changed, "config_changed": config_changed,
            "previous_version": str(prev.version) if prev else None,
            "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        mv = _log_pair(client, name, doc, tags, description)
        return _from_doc(mv, doc, aliases=[])


def _log_pair(client, name: str, doc: dict[str, Any], tags: dict[str, str], description: str | None):
    """Registration run (params = decoding config) -> logged model with ``pair.json`` -> pair version."""
    from registry.models import log_and_register

    params = {**{k: _optional(v) for k, v in doc["config"].items()}, "drafter_kind": doc["drafter_kind"],
              "target": tags["target"], "draft": tags["draft"], "changed": tags["changed"]}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / PAIR_FILE).write_text(json.dumps(doc, indent=2, sort_keys=True))
        return log_and_register(
            client, name, Path(tmp), tags, params, "specdec-pair", description,
            run_tags={"specdec.pair": name, "specdec.kind": "pair"},
            model_description="specdec draft/target pairs: each version is a pair.json referencing exact "
                              "target/draft model versions and the decoding config")


def _pair_versions(client, name: str) -> list:
    return list(client.search_model_versions(f"name='{name}'"))


def _aliases(client, name: str) -> dict[str, str]:
    return {a: str(v) for a, v in (client.get_registered_model(name).aliases or {}).items()}


def _from_doc(mv, doc: dict[str, Any], aliases: list[str], reused: bool = False) -> PairVersion:
    t, dr = doc["target"], doc.get("draft")
    return PairVersion(
        name=mv.name, version=str(mv.version), drafter_kind=doc["drafter_kind"],
        target_uri=t["uri"], draft_uri=dr["uri"] if dr else None,
        target_weights_sha256=t["weights_sha256"], target_tokenizer_sha256=t["tokenizer_sha256"],
        draft_weights_sha256=dr["weights_sha256"] if dr else None,
        draft_tokenizer_sha256=dr["tokenizer_sha256"] if dr else None,
        config=SpeculativeConfig.from_dict(doc["config"]), compatibility=doc.get("compatibility") or {},
        changed=doc.get("changed", "initial"), config_changed=bool(doc.get("config_changed", False)),
        previous_version=doc.get("previous_version"), recipe=doc.get("recipe"),
        target_source=t.get("source") or {}, draft_source=dr.get("source") if dr else None,
        aliases=aliases, tags=dict(mv.tags or {}), created_at=doc.get("created_at"), reused=reused,
    )


def _from_mv(client, mv, reused: bool = False, aliases: list[str] | None = None) -> PairVersion:
    """Build a PairVersion from tags only (no artifact download): used for listings."""
    tg = dict(mv.tags or {})
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
        aliases=aliases, tags=tg, reused=reused,
        created_at=datetime.fromtimestamp(mv.creation_timestamp / 1000, timezone.utc).isoformat(timespec="seconds"),
    )


def resolve_alias(pair: str, alias: str, *, tracking_uri: str | None = None) -> str:
    """The version an alias points at, read from MLflow on every call (so UI promotions are seen).

    Returns:
        the version as a decimal string.
    Raises:
        PairNotFound: no registered model ``pair``; AliasNotFound: the pair has no alias ``alias``.
    """
    client = get_client(tracking_uri)
    with mlflow_errors(client.tracking_uri):
        return _resolve_alias(client, pair, alias)


def pair_aliases(client, pair: str) -> dict[str, str]:
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
    with tempfile.TemporaryDirectory() as tmp:
        doc = json.loads(download_version_artifacts(client, mv.name, str(mv.version), tmp, PAIR_FILE).read_text())
    aliases = sorted(a for a, av in _aliases(client, mv.name).items() if av == str(mv.version))
    return _from_doc(mv, doc, aliases=aliases)


def _resolve_alias(client, pair: str, alias: str) -> str:
    aliases = pair_aliases(client, pair)
    if alias not in aliases:
        have = ", ".join(f"@{a} -> v{v}" for a, v in sorted(aliases.items())) or "none"
        raise AliasNotFound(f"pair {pair!r} has no alias @{alias} (aliases: {have})")
    return aliases[alias]


def get_pair_version(
    pair: str,
    version: str | int,
    *,
    download: bool = True,
    tracking_uri: str | None = None,
) -> PairVersion:
    """Load one pair version from MLflow: ``pair.json`` (authoritative), current tags and aliases, and
    (if ``download``) the target and draft artifacts into the local cache.

    Args:
        pair: pair registered model name.
        version: a version number (``3`` / ``"3"``), or an alias (``"champion"``, ``"@champion"``).
        download: also download target/draft artifacts (cached per version and hash).
    Returns:
        :class:`PairVersion` with ``target_path`` / ``draft_path`` set when ``download``.
    Raises:
        PairNotFound: pair or version missing; AliasNotFound: alias missing; RegistryUnavailable.
    """
    client = get_client(tracking_uri)
    uri = client.tracking_uri
    v = str(version).lstrip("@")
    with mlflow_errors(uri):
        if not v.isdigit():
            v = _resolve_alias(client, pair, v)
        pv = _pair_from_artifact(client, get_pair_model_version(client, pair, v))
        if download:
            pv.target_path = client_download_model_version(client, client_get_model_version(client, pv.target_uri))
            if pv.draft_uri:
                pv.draft_path = client_download_model_version(client, client_get_model_version(client, pv.draft_uri))
    return pv


def list_pair_versions(pair: str | None = None, *, tracking_uri: str | None = None) -> list[PairVersion]:
    """All versions of ``pair`` (default pair name), newest first, built from tags (no downloads).

    Raises:
        PairNotFound: no registered model ``pair``.
    """
    pair = pair or get_settings().pair_name
    client = get_client(tracking_uri)
    with mlflow_errors(client.tracking_uri):
        aliases = pair_aliases(client, pair)
        out = []
        for mv in sorted(_pair_versions(client, pair), key=lambda m: -int(m.version)):
            out.append(_from_mv(client, mv, aliases=sorted(a for a, v in aliases.items() if v == str(mv.version))))
    return out
