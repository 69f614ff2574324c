"""The target as a nightly sees it when an engine serves it: tokenizer and architecture, no weights.

A replay along engine continuations (:mod:`specdec.validation.engine_continuations`) needs of the target
only what a tokenizer and a ``config.json`` say: the chat template and prompt ids, the EOS ids, the
vocabulary size (to fit the draft's logits), the context length and the declared dtype. :func:`served_target`
builds exactly that: the tokenizer, and the model's modules on PyTorch's ``meta`` device (shapes and dtypes,
no storage), so nothing reads the target's weight files and any forward pass of the target fails loudly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

__all__ = ["served_target", "is_served", "WEIGHT_SUFFIXES"]

#: files that hold weights (never opened by :func:`served_target`)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt")


def served_target(path: str | Path, *, dtype: torch.dtype | None = None) -> Any:
    """A :class:`specdec.models.LoadedModel` of the checkpoint directory ``path`` with the model on the
    ``meta`` device: only ``config.json``, ``generation_config.json`` and the tokenizer files are read.

    Args:
        path: a directory with the target's config and tokenizer (its weight files may be absent).
        dtype: the dtype recorded for the target (None: the config's ``dtype``, else float32).
    Raises:
        specdec.models.ModelNotFoundError: no config or tokenizer there.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from specdec.models import LoadedModel
    from specdec.models.errors import ModelNotFoundError

    p = Path(path)
    try:
        config = AutoConfig.from_pretrained(p)
        tokenizer = AutoTokenizer.from_pretrained(p)
    except (OSError, ValueError) as e:
        raise ModelNotFoundError(f"no target config/tokenizer in {p}: {e}") from None
    dt = dtype or getattr(config, "dtype", None) or torch.float32
    dt = getattr(torch, dt) if isinstance(dt, str) else dt
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dt)
    if (p / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(p)
    return LoadedModel(model.eval(), tokenizer, p, {"kind": "served", "ref": str(p)})


def is_served(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a :func:`served_target` (its parameters live on the meta device)."""
    p = next(model.parameters(), None)
    return p is not None and p.device.type == "meta"
