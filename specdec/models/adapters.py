"""LoRA adapters on a shared base: read a PEFT adapter, check it fits its base, and run the adapted model exactly.

An adapter is a PEFT LoRA directory: ``adapter_config.json`` + ``adapter_model.safetensors`` (what
``peft.PeftModel.save_pretrained`` writes). The adapted target is the base with the adapter **merged**
(``peft.PeftModel.from_pretrained(base, dir).merge_and_unload()``), so it is bit for bit the model a merged
checkpoint loads: greedy output is token-identical to decoding the merged checkpoint, sampling draws from the same
distributions, the KV caches, derived drafts (``derived:bf16`` of the adapted target) and EAGLE-3 heads (its hidden
states) see a plain causal LM.

The base is never modified: :func:`attach_adapter` builds a copy that **shares** every tensor of the base but the
weights of the modules the adapter touches (for a LoRA on ``q/k/v/o_proj`` of SmolLM2-135M: 120 matrices, 101 of
513 MiB), merges the adapter into those copies and leaves the base as it was. N adapters of one base cost one base
load plus N merges (docs/adapters.md has the numbers, and why rows of different adapters are not batched through
PEFT's unmerged ``adapter_names`` path: that path is not bit-identical to the merged model and runs slower per pass).

A mismatched base (another architecture, a module the adapter names missing or of another shape, or a base weights
hash other than the one the adapter records) is refused with :class:`AdapterMismatchError`, one line.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdec.models.hashes import weights_sha256

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: specdec's own key in ``adapter_config.json``: the weights sha256 of the base the adapter was trained on
#: (:func:`specdec.models.hashes.weights_sha256`); PEFT ignores it (we build the ``LoraConfig`` from known fields).
BASE_HASH_KEY = "base_weights_sha256"
_LORA_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.(?P<part>lora_A|lora_B|lora_embedding_A|"
                       r"lora_embedding_B|lora_magnitude_vector)(?:\.default)?(?:\.weight)?$")


class AdapterError(ValueError):
    """An adapter directory that cannot be used: missing files, not LoRA, unreadable (one line)."""


class AdapterMismatchError(AdapterError):
    """The adapter does not fit this base: architecture, a module's presence or shape, or the recorded base hash."""


@dataclass(frozen=True)
class AdapterInfo:
    """What identifies a LoRA adapter (read from its directory, no weights loaded).

    Attributes:
        name: the adapter's name (default: its directory's name).
        ref: the adapter directory (resolved path).
        weights_hash: :func:`~specdec.models.hashes.weights_sha256` of the directory (its safetensors).
        base_hash: the base weights sha256 the adapter records (``adapter_config.json`` key
            :data:`BASE_HASH_KEY`, or the registry's lineage), None when it records none.
        rank: LoRA rank ``r``; lora_alpha: the scaling numerator (scale ``lora_alpha / r``, rsLoRA: ``/ sqrt(r)``).
        target_modules: the module names it adapts, as its config lists them (sorted).
        base_model_class: the base's class the adapter was saved from (PEFT's ``auto_mapping``), None if unrecorded.
        modules: ``{module path: (lora_A shape, lora_B shape)}`` from the safetensors header (shapes as tuples).
        config: the ``adapter_config.json`` dict as read.
    """

    name: str
    ref: str
    weights_hash: str
    base_hash: str | None
    rank: int
    lora_alpha: float
    target_modules: tuple[str, ...]
    base_model_class: str | None = None
    modules: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)
    config: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The report's / history's form: ``name, ref, weights_hash, base_hash, rank, target_modules`` (JSON-safe)."""
        return {"name": self.name, "ref": self.ref, "weights_hash": self.weights_hash, "base_hash": self.base_hash,
                "rank": self.rank, "target_modules": list(self.target_modules)}


def read_adapter(path: str | Path, *, name: str | None = None) -> AdapterInfo:
    """Read a PEFT LoRA adapter directory (config + safetensors header; no tensor is loaded).

    Raises:
        AdapterError: no directory, no ``adapter_config.json`` / ``adapter_model.safetensors``, a config that is
            not JSON, or an adapter that is not LoRA (``peft_type`` other than ``LORA``).
    """
    d = Path(path).expanduser()
    if not d.is_dir():
        raise AdapterError(f"adapter {path}: not a directory (expected {ADAPTER_CONFIG} + {ADAPTER_WEIGHTS})")
    d = d.resolve()
    for f in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        if not (d / f).is_file():
            raise AdapterError(f"adapter {d}: no {f} (a PEFT adapter directory holds {ADAPTER_CONFIG} + {ADAPTER_WEIGHTS})")
    try:
        cfg = json.loads((d / ADAPTER_CONFIG).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise AdapterError(f"adapter {d}: {ADAPTER_CONFIG} does not parse ({e})") from None
    if str(cfg.get("peft_type", "")).upper() != "LORA":
        raise AdapterError(f"adapter {d}: peft_type {cfg.get('peft_type')!r}; only LoRA adapters are supported")
    targets = cfg.get("target_modules") or []
    targets = (targets,) if isinstance(targets, str) else tuple(sorted(targets))
    return AdapterInfo(name=name or d.name, ref=str(d), weights_hash=weights_sha256(d / ADAPTER_WEIGHTS),
                       base_hash=cfg.get(BASE_HASH_KEY), rank=int(cfg.get("r", 8)),
                       lora_alpha=float(cfg.get("lora_alpha", 8)), target_modules=targets,
                       base_model_class=(cfg.get("auto_mapping") or {}).get("base_model_class"),
                       modules=_module_shapes(d / ADAPTER_WEIGHTS), config=cfg)


def _module_shapes(weights: Path) -> dict[str, dict[str, tuple[int, ...]]]:
    """``{module path: {part: shape}}`` of the LoRA tensors in a safetensors header (``part``: ``lora_A``, ...);
    other tensors (``modules_to_save``) under ``{param path: {"full": shape}}``."""
    from safetensors import safe_open

    out: dict[str, dict[str, tuple[int, ...]]] = {}
    with safe_open(str(weights), "pt") as f:
        for key in f.keys():
            shape = tuple(f.get_slice(key).get_shape())
            m = _LORA_KEY.match(key)
            if m:
                out.setdefault(m["module"], {})[m["part"]] = shape
            else:
                out.setdefault(key.removeprefix("base_model.model."), {})["full"] = shape
    return out


def check_adapter_base(info: AdapterInfo, model: Any, base_hash: str | None = None) -> None:
    """Refuse an adapter whose base is not ``model``.

    Args:
        info: the adapter (:func:`read_adapter`).
        model: the base causal LM (``torch.nn.Module``).
        base_hash: the base's weights sha256, compared when the adapter records one (None: not compared).
    Raises:
        AdapterMismatchError: one line naming the first mismatch: the base class the adapter was saved from, a
            module it adapts that the base lacks, a LoRA A/B shape that does not fit the module
            (Linear ``A: [r, in_features]``, ``B: [out_features, r]``; Embedding ``A: [r, num_embeddings]``,
            ``B: [embedding_dim, r]``), a full tensor of another shape, or a base weights hash other than recorded.
    """
    where = f"adapter {info.name} does not fit base {type(model).__name__}"
    if info.base_model_class and info.base_model_class != type(model).__name__:
        raise AdapterMismatchError(f"{where}: it was saved from a {info.base_model_class}")
    modules = dict(model.named_modules())
    params = dict(model.named_parameters())
    for path, parts in sorted(info.modules.items()):
        if "full" in parts:
            have = params.get(path)
            if have is None or tuple(have.shape) != parts["full"]:
                got = "missing" if have is None else list(have.shape)
                raise AdapterMismatchError(f"{where}: {path} is {got} in the base, {list(parts['full'])} in the adapter")
            continue
        if path not in modules:
            raise AdapterMismatchError(f"{where}: the base has no module {path}")
        problem = _shape_problem(modules[path], parts)
        if problem:
            raise AdapterMismatchError(f"{where}: {path} {problem}")
    if info.base_hash and base_hash and info.base_hash != base_hash:
        raise AdapterMismatchError(f"{where}: it was trained on base weights {info.base_hash[:16]}, "
                                   f"this base is {base_hash[:16]}")


def _shape_problem(module: Any, parts: dict[str, tuple[int, ...]]) -> str | None:
    """Why LoRA ``parts`` (``{"lora_A": shape, "lora_B": shape}`` or the embedding pair) do not fit ``module``."""
    import torch

    if isinstance(module, torch.nn.Embedding):
        n_in, n_out, a, b = module.num_embeddings, module.embedding_dim, "lora_embedding_A", "lora_embedding_B"
    elif isinstance(module, torch.nn.Linear):
        n_in, n_out, a, b = module.in_features, module.out_features, "lora_A", "lora_B"
    else:
        return f"is a {type(module).__name__}, which a LoRA adapter here cannot adapt"
    shape_a, shape_b = parts.get(a), parts.get(b)
    if shape_a is None or shape_b is None:
        return f"has no {a}/{b} pair in the adapter"
    if shape_a[1] != n_in or shape_b[0] != n_out or shape_a[0] != shape_b[1]:
        return (f"is {n_out}x{n_in} (out x in) in the base; the adapter's {a} is {list(shape_a)} and "
                f"{b} {list(shape_b)}")
    return None


def lora_config(info: AdapterInfo) -> Any:
    """The ``peft.LoraConfig`` of ``info`` built from the fields PEFT knows (specdec's keys left out), inference mode."""
    from peft import LoraConfig

    known = {f.name for f in dataclasses.fields(LoraConfig)}
    return LoraConfig(**{k: v for k, v in info.config.items() if k in known and k != "inference_mode"},
                      inference_mode=True)


def merged_copy(model: Any, info: AdapterInfo) -> Any:
    """``model`` with the adapter merged, as PEFT merges it, without touching ``model``.

    A deep copy of the module tree that shares every parameter and buffer with ``model`` except those of the
    modules the LoRA merges into (copied; a ``modules_to_save`` module PEFT copies itself); PEFT injects the LoRA layers into the copy, loads the adapter weights and
    ``merge_and_unload()`` adds ``scale * B @ A`` to the copied weights. ``model``'s tensors and ``requires_grad``
    flags are as before.

    Returns:
        the merged causal LM (same class, device and dtype as ``model``, eval mode).
    Raises:
        AdapterError: PEFT could not load the adapter into the copy (one line).
    """
    from peft import PeftModel

    lora_modules = {path for path, parts in info.modules.items() if "full" not in parts}
    owned = {id(t) for name, mod in model.named_modules() if name in lora_modules
             for t in list(mod.parameters()) + list(mod.buffers())}  # merged into: copied
    shared = {id(t): t for t in list(model.parameters()) + list(model.buffers()) if id(t) not in owned}
    flags = {id(p): p.requires_grad for p in model.parameters()}
    clone = copy.deepcopy(model, dict(shared))
    try:
        peft_model = PeftModel.from_pretrained(clone, info.ref, config=lora_config(info))
        merged = peft_model.merge_and_unload()
    except (RuntimeError, ValueError, KeyError) as e:
        raise AdapterError(f"adapter {info.name}: PEFT could not load it: {str(e).splitlines()[0]}") from None
    finally:
        for p in model.parameters():
            p.requires_grad_(flags[id(p)])
    return merged.eval()


def attach_adapter(base: Any, adapter: "AdapterInfo | str | Path", *, base_hash: str | None = None) -> Any:
    """The base :class:`~specdec.models.LoadedModel` with a LoRA adapter merged (a new LoadedModel; the base as it was).

    Args:
        base: the loaded base (not itself adapted).
        adapter: an :class:`AdapterInfo` or an adapter directory.
        base_hash: the base's weights sha256 if known; when the adapter records one and this is None, the base
            checkpoint (``base.path``) is hashed to compare.
    Returns:
        a LoadedModel whose ``model`` is :func:`merged_copy`, ``tokenizer``/``path``/``source`` the base's and
        ``adapter`` the :class:`AdapterInfo`.
    Raises:
        AdapterError: unreadable adapter, or the base is already adapted. AdapterMismatchError: another base.
    """
    info = adapter if isinstance(adapter, AdapterInfo) else read_adapter(adapter)
    if getattr(base, "adapter", None) is not None:
        raise AdapterError(f"adapter {info.name}: the model already has adapter {base.adapter.name} merged")
    if info.base_hash and base_hash is None and base.path is not None:
        base_hash = weights_sha256(base.path)
    check_adapter_base(info, base.model, base_hash)
    return dataclasses.replace(base, model=merged_copy(base.model, info), source=dict(base.source), adapter=info)
