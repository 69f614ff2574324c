"""specdec: exact speculative decoding and the tools to keep draft/target pairs healthy.

Public API::

    from specdec import (SamplingConfig, autoregressive_generate, speculative_generate,
                         NgramDrafter, DecodingStats, GenerationResult,
                         check_pair_compatible, IncompatiblePairError, load_causal_lm)

This package imports nothing from mlflow, prefect, evidently or sqlalchemy.
"""

from __future__ import annotations

__all__ = [
    "SamplingConfig",
    "autoregressive_generate",
    "speculative_generate",
    "NgramDrafter",
    "ModelDrafter",
    "DecodingStats",
    "GenerationResult",
    "BatchGenerationResult",
    "speculative_generate_batch",
    "autoregressive_generate_batch",
    "check_pair_compatible",
    "IncompatiblePairError",
    "load_causal_lm",
    "LoadedModel",
]

_LAZY = {
    "SamplingConfig": "specdec.sampling",
    "autoregressive_generate": "specdec.decoding",
    "speculative_generate": "specdec.decoding",
    "GenerationResult": "specdec.decoding",
    "BatchGenerationResult": "specdec.batch",
    "speculative_generate_batch": "specdec.batch",
    "autoregressive_generate_batch": "specdec.batch",
    "NgramDrafter": "specdec.drafters",
    "ModelDrafter": "specdec.drafters",
    "DecodingStats": "specdec.stats",
    "check_pair_compatible": "specdec.models",
    "IncompatiblePairError": "specdec.models",
    "load_causal_lm": "specdec.models",
    "LoadedModel": "specdec.models",
}


def __getattr__(name: str):
    # torch/transformers load on first use, so `import specdec.report` stays light (no torch)
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'specdec' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
