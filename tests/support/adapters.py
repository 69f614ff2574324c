"""PEFT LoRA adapters for tests: saved with ``peft`` itself on a tiny checkpoint, B matrices non-zero (a fresh LoRA's B
is zero, an adapter that changes nothing), and the merged checkpoint PEFT's ``merge_and_unload`` makes of it."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def save_lora_adapter(base_dir: str | Path, out: str | Path, *, seed: int = 0, rank: int = 4, b_std: float = 0.3,
                      target_modules: tuple[str, ...] = ("q_proj", "v_proj"), base_hash: str | None = None) -> Path:
    """A LoRA adapter of the checkpoint ``base_dir`` saved by ``PeftModel.save_pretrained`` to ``out``.

    Args:
        seed: seeds the A and B matrices (``b_std`` > 0: B ~ N(0, b_std), so the adapter moves the output).
        base_hash: written as ``base_weights_sha256`` into ``adapter_config.json`` (the base the adapter records).
    Returns:
        ``out`` (``adapter_config.json`` + ``adapter_model.safetensors``).
    """
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(target_modules),
                                                  lora_dropout=0.0))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * b_std)
    peft_model.save_pretrained(out)
    if base_hash is not None:
        cfg_path = Path(out) / "adapter_config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg_path.write_text(json.dumps({**cfg, "base_weights_sha256": base_hash}, indent=2))
    return Path(out)


def save_merged(base_dir: str | Path, adapter_dir: str | Path, out: str | Path) -> Path:
    """The merged checkpoint of ``base_dir`` + ``adapter_dir`` (``PeftModel.from_pretrained(...).merge_and_unload()``,
    saved with the base's tokenizer) in ``out``."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(base_dir).save_pretrained(out)
    return Path(out)
