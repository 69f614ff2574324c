"""EAGLE-3 heads in the registry: a head version with its lineage (the pair: :func:`registry.register.register_eagle3_pair`).

A head is registered like any checkpoint (its ``speculators``-format directory, with the target's
tokenizer files that ``specdec draft train eagle3`` writes next to it) plus lineage tags:

- ``eagle3.target``: the target version the head was trained on (``models:/<name>/<v>``);
- ``eagle3.target_weights_sha256``: that target's weights hash;
- ``eagle3.training_data_sha256``: hash of the training sequences (``training.json``);
- ``eagle3.parent``: the head it was warm-started from (``models:/<name>/<v>``, ``unregistered:<sha>``
  or ``none``) and ``eagle3.parent_weights_sha256``;
- ``eagle3.draft_vocab_size``, ``eagle3.aux_layer_ids``, ``eagle3.trained_by`` (``specdec`` or
  ``external`` for heads trained with ``speculators``/SpecForge, which register as they are).

The pair version copies them as ``draft.eagle3.*``, so the root-cause hint can say which head
version to re-train from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from registry.models import ModelVersionRef
from registry.service import Registry

LINEAGE_PREFIX = "eagle3."


def _training_doc(head_dir: Path) -> dict[str, Any]:
    p = head_dir / "training.json"
    return json.loads(p.read_text()) if p.is_file() else {}


def _find_by_weights(client, weights_sha256: str | None) -> str | None:
    """``models:/<name>/<v>`` of the oldest checkpoint version with these weights, if any."""
    if not weights_sha256:
        return None
    found = client.search_model_versions(f"tags.weights_sha256='{weights_sha256}'")
    found = [mv for mv in found if (mv.tags or {}).get("specdec.artifact") == "checkpoint"]
    if not found:
        return None
    mv = min(found, key=lambda m: (m.name, int(m.version)))
    return f"models:/{mv.name}/{mv.version}"


def head_lineage_tags(head_dir: str | Path, target: ModelVersionRef, client) -> dict[str, str]:
    """The ``eagle3.*`` lineage tags of the head in ``head_dir`` trained for ``target`` (module docstring).

    Raises:
        ValueError: ``training.json`` says the head was trained on a target with other weights.
    """
    head_dir = Path(head_dir)
    doc = _training_doc(head_dir)
    lin = doc.get("lineage") or {}
    trained_on = lin.get("target_weights_sha256")
    if trained_on and trained_on != target.weights_sha256:
        raise ValueError(f"the head in {head_dir} was trained on a target with weights {trained_on[:12]}, not "
                         f"{target.uri} ({target.weights_sha256[:12]}): register it with the target it was trained on")
    cfg = json.loads((head_dir / "config.json").read_text())
    parent_sha = lin.get("parent_weights_sha256")
    parent = _find_by_weights(client, parent_sha) or (f"unregistered:{parent_sha}" if parent_sha else "none")
    return {
        "eagle3.target": target.uri,
        "eagle3.target_weights_sha256": trained_on or "unknown",
        "eagle3.training_data_sha256": lin.get("training_data_sha256") or "unknown",
        "eagle3.parent": parent,
        "eagle3.parent_weights_sha256": parent_sha or "none",
        "eagle3.draft_vocab_size": str(cfg.get("draft_vocab_size")),
        "eagle3.aux_layer_ids": json.dumps(cfg.get("eagle_aux_hidden_state_layer_ids")),
        "eagle3.trained_by": "specdec" if doc else "external",
        "specdec.draft_kind": "eagle3",
    }


def register_eagle3_head(head_dir: str | Path, target: ModelVersionRef, *, name: str | None = None,
                         registry: Registry) -> ModelVersionRef:
    """Register the head in ``head_dir`` as a version of ``name`` (default ``<target name>-eagle3``) with lineage.

    Returns:
        :class:`ModelVersionRef` (``reused=True`` when these weights were registered already).
    Raises:
        FileNotFoundError: not a head directory; ValueError: trained on another target;
        RegistryUnavailable: the MLflow server cannot be reached.
    """
    from registry.models import register_model_version, validate_name

    head_dir = Path(head_dir)
    if not (head_dir / "config.json").is_file():
        raise FileNotFoundError(f"no EAGLE-3 head at {head_dir}: config.json not found")
    name = validate_name(name or f"{target.name}-eagle3")
    tags = head_lineage_tags(head_dir, target, registry.client)
    return register_model_version(name, head_dir, source={"kind": "eagle3-head", "path": str(head_dir.resolve())},
                                  registry=registry, extra_tags=tags)


def head_compatibility(head_dir: Path, target_config: Any) -> dict[str, Any]:
    """Head/target checks on the head's config alone (no weights, no target model): vocabulary, hidden size,
    aux layer ids. ``{"compatible", "problems", "notes"}`` as stored with the pair."""
    cfg = json.loads((head_dir / "config.json").read_text())
    layer = cfg.get("transformer_layer_config") or {}
    problems = []
    if layer.get("vocab_size") not in (None, target_config.vocab_size):
        problems.append(f"head vocabulary {layer.get('vocab_size')} != target vocabulary {target_config.vocab_size}")
    hidden = cfg.get("target_hidden_size") or layer.get("hidden_size")
    if hidden not in (None, target_config.hidden_size):
        problems.append(f"head expects target hidden size {hidden}, target has {target_config.hidden_size}")
    n = target_config.num_hidden_layers
    bad = [i for i in cfg.get("eagle_aux_hidden_state_layer_ids") or [] if not 0 <= i <= n]
    if bad:
        problems.append(f"aux hidden state layer ids {bad} outside the target's 0..{n}")
    return {"compatible": not problems, "problems": problems,
            "notes": [f"EAGLE-3 head, draft vocabulary {cfg.get('draft_vocab_size')}"]}


def head_directory(ref: str, *, registry: Registry) -> Path:
    """A local directory of the head ``ref``: ``models:/<name>/<v>`` (downloaded to the cache), the draft of
    a pair version (``models:/<pair>@<alias>`` or ``models:/<pair>/<v>`` of an ``eagle3`` pair), or a path.

    Raises:
        ValueError: the reference is a pair whose drafter is not an EAGLE-3 head; registry errors.
    """
    from specdec.kinds import kind_of

    if not ref.startswith("models:/"):
        return Path(ref)
    from registry.models import download_model_version, get_model_version, parse_model_uri
    from registry.pairs import get_pair_version

    name, version, alias = parse_model_uri(ref)
    mref = get_model_version(ref, registry=registry)
    if mref.artifact == "pair" or mref.tags.get("drafter_kind"):
        pv = get_pair_version(name, alias or version, download=False, registry=registry)
        if not kind_of(pv.drafter_kind).retrainable:
            raise ValueError(f"{ref} is a {pv.drafter_kind} pair, not an EAGLE-3 head")
        mref = get_model_version(pv.draft_uri, registry=registry)
    return download_model_version(mref, registry=registry)
