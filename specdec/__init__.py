"""specdec: exact speculative decoding and the tools to keep draft/target pairs healthy.

Public API::

    from specdec import (SamplingConfig, autoregressive_generate, speculative_generate,
                         NgramDrafter, DecodingStats, GenerationResult,
                         check_pair_compatible, IncompatiblePairError, load_causal_lm)

This package imports nothing from mlflow, prefect, evidently or sqlalchemy.
"""

from __future__ import annotations

from specdec.decoding import GenerationResult, autoregressive_generate, speculative_generate
from specdec.drafters import ModelDrafter, NgramDrafter
from specdec.sampling import SamplingConfig
from specdec.stats import DecodingStats

__all__ = [
    "SamplingConfig",
    "autoregressive_generate",
    "speculative_generate",
    "NgramDrafter",
    "ModelDrafter",
    "DecodingStats",
    "GenerationResult",
    "check_pair_compatible",
    "IncompatiblePairError",
    "load_causal_lm",
    "LoadedModel",
]

_LAZY = {
    "check_pair_compatible": "specdec.models",
    "IncompatiblePairError": "specdec.models",
    "load_causal_lm": "specdec.models",
    "LoadedModel": "specdec.models",
}


def __getattr__(name: str):
    # model loading pulls in transformers' auto classes; import it on first use only
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'specdec' has no attribute {name!r}")
