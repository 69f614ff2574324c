"""specdec: exact speculative decoding and the tools to keep draft/target pairs healthy.

Public API::

    from specdec import (SamplingConfig, SpeculativeConfig, autoregressive_generate,
                         speculative_generate, NgramDrafter, DecodingStats, GenerationResult,
                         check_pair_compatible, IncompatiblePairError, load_causal_lm, ModelStore)

Subpackages: :mod:`specdec.core` (the decoding core), :mod:`specdec.models` (loading, hashes,
compatibility, derived drafts), :mod:`specdec.validation` (held-out sets, validation, reports).
This package imports nothing from mlflow, prefect, evidently or sqlalchemy; torch and
transformers load on first use, so ``import specdec.validation.report`` stays light.
"""

from __future__ import annotations

from specdec.lazy import lazy_exports

_EXPORTS = {
    "SamplingConfig": "specdec.core.config",
    "SpeculativeConfig": "specdec.core.config",
    "autoregressive_generate": "specdec.core.decoding",
    "speculative_generate": "specdec.core.decoding",
    "GenerationResult": "specdec.core.results",
    "BatchGenerationResult": "specdec.core.results",
    "speculative_generate_batch": "specdec.core.batch",
    "autoregressive_generate_batch": "specdec.core.batch",
    "NgramDrafter": "specdec.core.drafters",
    "ModelDrafter": "specdec.core.drafters",
    "DecodingStats": "specdec.core.stats",
    "check_pair_compatible": "specdec.models.compat",
    "IncompatiblePairError": "specdec.models.compat",
    "load_causal_lm": "specdec.models.load",
    "LoadedModel": "specdec.models.load",
    "ModelStore": "specdec.models.store",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
