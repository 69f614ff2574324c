"""Where and with what the numbers were measured: environment, code version, EOS ids, estimator."""

from __future__ import annotations

import os
import platform
from typing import Any

import torch

__all__ = ["ALPHA_HAT_ESTIMATOR", "eos_token_ids", "environment", "code_version"]


ALPHA_HAT_ESTIMATOR = (
    "i.i.d. maximum likelihood: num_accepted_tokens / (num_accepted_tokens + num_rejected_steps) "
    "(every verified position counts; fully accepted steps are censored); Leviathan's alpha"
)


def eos_token_ids(tokenizer: Any, model: torch.nn.Module) -> Any:
    """The EOS id(s) that end generation: the model's generation config, else the tokenizer's."""
    gc = getattr(model, "generation_config", None)
    eos = getattr(gc, "eos_token_id", None) if gc is not None else None
    if eos is None:
        eos = getattr(tokenizer, "eos_token_id", None)
    return eos


def environment() -> dict[str, Any]:
    """Where the numbers were measured: torch version, CPU model, cores, threads, GPU name."""
    from specdec.validation.machine import cpu_model

    cpu = cpu_model()
    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": cpu,
        "nproc": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


def code_version() -> str:
    """Installed ``specdec`` version plus the git commit when run from a checkout."""
    import subprocess
    from importlib.metadata import PackageNotFoundError, version
    from pathlib import Path

    try:
        v = version("specdec")
    except PackageNotFoundError:  # pragma: no cover
        v = "0+unknown"
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except Exception:
        sha = ""
    return f"{v}+g{sha}" if sha else v
