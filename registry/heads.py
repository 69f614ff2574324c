"""EAGLE-3 heads in the registry: a head version with its lineage, and its pair (drafter kind ``eagle3``).

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
                         tracking_uri: str | None = None) -> ModelVersionRef:
    """Register the head in ``head_dir`` as a version of ``name`` (default ``<target name>-eagle3``) with lineage.

    Returns:
        :class:`ModelVersionRef` (``reused=True`` when these weights were registered already).
    Raises:
        FileNotFoundError: not a head directory; ValueError: trained on another target;
        RegistryUnavailable: the MLflow server cannot be reached.
    """
    from registry.models import register_model_version, validate_name
    from registry.settings import get_client

    head_dir = Path(head_dir)
    if not (head_dir / "config.json").is_file():
        raise FileNotFoundError(f"no EAGLE-3 head at {head_dir}: config.json not found")
    name = validate_name(name or f"{target.name}-eagle3")
    tags = head_lineage_tags(head_dir, target, get_client(tracking_uri))
    return register_model_version(name, head_dir, source={"kind": "eagle3-head", "path": str(head_dir.resolve())},
                                  tracking_uri=tracking_uri, extra_tags=tags)


def _compatibility(head_dir: Path, target_config: Any) -> dict[str, Any]:
    """Head/target checks on the config alone: vocabulary, hidden size, aux layer ids."""
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


def register_eagle3_pair(target: str, head: str, *, name: str | None = None, head_name: str | None = None,
                         config=None, tracking_uri: str | None = None):
    """Register (or reuse) the target, the head and the ``eagle3`` pair version.

    Args:
        target: the target reference (as for ``specdec pair register --target``).
        head: a head directory (registered with lineage; it must have been trained on ``target``), or
            an already registered head version ``models:/<name>/<v>`` (any target: a target-only
            fine-tune leaves the old head with the new target, and its lineage says so).
        name: pair registered model. head_name: registered model of a new head (default ``<target>-eagle3``).
        config: ``SpeculativeConfig`` of the pair (default: its defaults).
    Returns:
        :class:`registry.register.PairRegistration` (drafter kind ``eagle3``).
    Raises:
        ValueError: incompatible head/target, a directory trained on another target, or a registered
        version that is not an EAGLE-3 head; registry errors.
    """
    from registry.models import download_model_version, get_model_version, register_model_version
    from registry.pairs import register_pair
    from registry.register import PairRegistration, default_model_name, resolve_checkpoint
    from specdec.core.config import SpeculativeConfig

    href = None
    if head.startswith("models:/"):
        href = get_model_version(head, tracking_uri=tracking_uri)
        if href.tags.get("specdec.draft_kind") != "eagle3":
            raise ValueError(f"{head} is not a registered EAGLE-3 head")
        head_dir = download_model_version(href, tracking_uri=tracking_uri)
    else:
        head_dir = Path(head)
        if not (head_dir / "config.json").is_file():
            raise FileNotFoundError(f"no EAGLE-3 head at {head_dir}: config.json not found")
    t = resolve_checkpoint(target, None, tracking_uri)
    compat = _compatibility(Path(head_dir), t["config"])
    if not compat["compatible"]:
        raise ValueError("head and target are incompatible: " + "; ".join(compat["problems"]))
    tref = t["registered"] or register_model_version(default_model_name(t), t["path"], source=t["source"],
                                                     tracking_uri=tracking_uri)
    href = href or register_eagle3_head(head_dir, tref, name=head_name, tracking_uri=tracking_uri)
    pv = register_pair(tref, href, drafter_kind="eagle3", config=config or SpeculativeConfig(),
                       compatibility=compat, name=name, tracking_uri=tracking_uri)
    return PairRegistration(pair=pv, target=tref, draft=href, drafter_kind="eagle3")


def register_trained_head(head: str | Path, pair: str, target: str, *, head_name: str | None = None,
                          alias: str | None = "challenger", config=None, tracking_uri: str | None = None):
    """:func:`register_eagle3_pair` under ``pair``, then point the ungated ``alias`` at the new version
    (``None`` leaves aliases alone). What ``specdec draft train eagle3 --register`` and the
    re-alignment flow call. Returns the :class:`registry.pairs.PairVersion`."""
    from registry.promotion import promote

    reg = register_eagle3_pair(target, str(head), name=pair, head_name=head_name, config=config,
                               tracking_uri=tracking_uri)
    if alias:
        promote(pair, reg.pair.version, alias, tracking_uri=tracking_uri)
    return reg.pair


def head_directory(ref: str, *, tracking_uri: str | None = None) -> Path:
    """A local directory of the head ``ref``: ``models:/<name>/<v>`` (downloaded to the cache), the draft of
    a pair version (``models:/<pair>@<alias>`` or ``models:/<pair>/<v>`` of an ``eagle3`` pair), or a path.

    Raises:
        ValueError: the reference is a pair whose drafter is not an EAGLE-3 head; registry errors.
    """
    if not ref.startswith("models:/"):
        return Path(ref)
    from registry.models import download_model_version, get_model_version, parse_model_uri
    from registry.pairs import get_pair_version

    name, version, alias = parse_model_uri(ref)
    mref = get_model_version(ref, tracking_uri=tracking_uri)
    if mref.artifact == "pair" or mref.tags.get("drafter_kind"):
        pv = get_pair_version(name, alias or version, download=False, tracking_uri=tracking_uri)
        if pv.drafter_kind != "eagle3":
            raise ValueError(f"{ref} is a {pv.drafter_kind} pair, not an EAGLE-3 head")
        mref = get_model_version(pv.draft_uri, tracking_uri=tracking_uri)
    return download_model_version(mref, tracking_uri=tracking_uri)


def head_registry_hooks():
    """The registry functions ``specdec draft train eagle3`` uses (:class:`specdec.training.cli.HeadRegistry`)."""
    from registry.register import resolve_checkpoint
    from specdec.training.cli import HeadRegistry

    return HeadRegistry(register=register_trained_head, head_directory=head_directory,
                        checkpoint_directory=lambda ref: resolve_checkpoint(ref)["path"])
