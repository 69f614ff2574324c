"""LoRA adapters as registered model versions of their own, with lineage to their base (docs/adapters.md).

An adapter version's artifact is the PEFT adapter directory (``adapter_config.json`` +
``adapter_model.safetensors``); its tags:

- ``weights_sha256``: the adapter's own weights hash (:func:`specdec.models.hashes.weights_sha256`);
  ``tokenizer_sha256``: the base's (an adapter uses its base's tokenizer);
- ``specdec.artifact``: ``lora-adapter``; ``source_kind``: ``lora``; ``source``: ``{"kind": "lora", "path", "base"}``;
- lineage: ``adapter.base`` (``models:/<base>/<v>``), ``adapter.base_weights_sha256``, ``adapter.rank``,
  ``adapter.lora_alpha``, ``adapter.target_modules`` (comma-separated).

Registering the same adapter weights for the same base again returns the existing version. An adapter that does
not fit the base (:func:`specdec.models.adapters.check_adapter_base`, on the base's architecture built on the meta
device: no weights read) is refused before anything is written.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from registry.models import (ModelVersionRef, canonical_json, client_get_model_version, log_and_register, ref_from_mv,
                             sanitize_name, validate_name)
from registry.service import Registry, mlflow_errors

ADAPTER_ARTIFACT = "lora-adapter"
ADAPTER_SOURCE_KIND = "lora"


def adapter_tags(info: Any, base: ModelVersionRef) -> dict[str, str]:
    """The version tags of adapter ``info`` (:class:`specdec.models.adapters.AdapterInfo`) on ``base`` (module doc)."""
    source = {"kind": ADAPTER_SOURCE_KIND, "path": info.ref, "base": base.uri, "name": info.name}
    return {"weights_sha256": info.weights_hash, "tokenizer_sha256": base.tokenizer_sha256,
            "source": canonical_json(source), "source_kind": ADAPTER_SOURCE_KIND, "specdec.artifact": ADAPTER_ARTIFACT,
            "adapter.name": info.name, "adapter.base": base.uri, "adapter.base_weights_sha256": base.weights_sha256,
            "adapter.rank": str(info.rank), "adapter.lora_alpha": f"{info.lora_alpha:g}",
            "adapter.target_modules": ",".join(info.target_modules)}


def check_adapter_fits(info: Any, base_dir: str | Path, base_hash: str | None) -> None:
    """Refuse an adapter that does not fit the base checkpoint in ``base_dir`` (architecture and module shapes from
    its ``config.json``, built on the meta device; ``base_hash`` against the hash the adapter records).

    Raises:
        specdec.models.adapters.AdapterMismatchError: one line naming the first mismatch.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from specdec.models.adapters import check_adapter_base

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(base_dir))
    check_adapter_base(info, skeleton, base_hash)


def register_adapter(adapter_dir: str | Path, base: ModelVersionRef, base_dir: str | Path, *, registry: Registry,
                     name: str | None = None) -> ModelVersionRef:
    """Register the PEFT LoRA adapter in ``adapter_dir`` as a version of its own, with lineage to ``base``.

    Args:
        adapter_dir: the adapter directory. base: the registered base (target or draft) version.
        base_dir: the base checkpoint's local directory (its config is read to check the adapter fits).
        registry: the job's MLflow service. name: registered model name (default: the adapter's name).
    Returns:
        the adapter's :class:`~registry.models.ModelVersionRef` (``artifact == "lora-adapter"``; ``reused`` when the
        same adapter weights were registered for the same base weights before).
    Raises:
        specdec.models.adapters.AdapterError / AdapterMismatchError: unreadable / does not fit the base.
        ValueError: invalid name. RegistryUnavailable: the server cannot be reached.
    """
    from specdec.models.adapters import read_adapter

    info = read_adapter(adapter_dir)
    check_adapter_fits(info, base_dir, base.weights_sha256)
    name = validate_name(name or sanitize_name(info.name))
    tags = adapter_tags(info, base)
    client = registry.client
    with mlflow_errors(client.tracking_uri):
        existing = _existing(client, name, tags)
        if existing is not None:
            return ref_from_mv(existing, reused=True)
        params = {k: v for k, v in tags.items() if k.startswith("adapter.") or k == "weights_sha256"}
        with tempfile.TemporaryDirectory() as tmp:  # the adapter's two files, nothing else beside them
            for f in ("adapter_config.json", "adapter_model.safetensors"):
                (Path(tmp) / f).write_bytes((Path(info.ref) / f).read_bytes())
            mv = log_and_register(registry, name, Path(tmp), tags, params, model_type=ADAPTER_ARTIFACT,
                                  description=describe_adapter(info, base.uri),
                                  model_description=f"LoRA adapter {info.name} (specdec): versions name their base")
        return ref_from_mv(mv)


def describe_adapter(info: Any, base_uri: str) -> str:
    """One line: ``LoRA adapter support-v3 (r=8, q_proj,v_proj) of models:/base/1``."""
    return f"LoRA adapter {info.name} (r={info.rank}, {','.join(info.target_modules)}) of {base_uri}"


def _existing(client, name: str, tags: dict[str, str]):
    """The oldest version of ``name`` with the same adapter weights on the same base weights, else None."""
    from mlflow.exceptions import MlflowException

    try:
        found = client.search_model_versions(f"name='{name}' and tags.weights_sha256='{tags['weights_sha256']}'")
    except MlflowException:
        return None
    key = ("source_kind", "adapter.base_weights_sha256")
    found = [mv for mv in found if all((mv.tags or {}).get(k) == tags[k] for k in key)]
    return min(found, key=lambda mv: int(mv.version)) if found else None


def adapter_side(ref: ModelVersionRef | None) -> dict[str, Any] | None:
    """A pair's record of one adapter version (``pair.json``'s ``target_adapter`` / ``draft_adapter``): ``uri, name,
    weights_sha256, base_weights_sha256, rank, target_modules``; None without an adapter."""
    if ref is None:
        return None
    t = ref.tags
    return {"uri": ref.uri, "name": t.get("adapter.name", ref.name), "weights_sha256": ref.weights_sha256,
            "base_weights_sha256": t.get("adapter.base_weights_sha256"), "base": t.get("adapter.base"),
            "rank": int(t.get("adapter.rank", 0) or 0),
            "target_modules": [m for m in t.get("adapter.target_modules", "").split(",") if m]}


def checked_adapter(client, uri: str, base: ModelVersionRef) -> ModelVersionRef:
    """The adapter version ``uri``, refused unless it is a ``lora-adapter`` registered for ``base``'s weights.

    Raises:
        ValueError: not an adapter version, or one of another base (one line naming both hashes).
        registry.ModelNotFound: no such version.
    """
    ref = client_get_model_version(client, uri)
    if ref.artifact != ADAPTER_ARTIFACT:
        raise ValueError(f"{uri} is a {ref.artifact}, not a LoRA adapter version")
    recorded = ref.tags.get("adapter.base_weights_sha256")
    if recorded and recorded != base.weights_sha256:
        raise ValueError(f"adapter {uri} was registered for base weights {recorded[:16]}, {base.uri} is "
                         f"{base.weights_sha256[:16]}")
    return ref
