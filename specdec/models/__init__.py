"""Models: resolve and fetch references, load them, hash them, check pair compatibility, derive drafts.

Modules: :mod:`~specdec.models.resolve` (reference -> local safetensors checkpoint),
:mod:`~specdec.models.load` (:func:`load_causal_lm`), :mod:`~specdec.models.hashes`,
:mod:`~specdec.models.compat` (:func:`check_pair_compatible`), :mod:`~specdec.models.derived`
(quantized drafts derived from the target), :mod:`~specdec.models.adapters` (LoRA adapters merged into a base). ``--draft`` specs are the drafter kinds' (:mod:`specdec.kinds`).
"""

from __future__ import annotations

from specdec.lazy import lazy_exports

_EXPORTS = {
    "ModelNotFoundError": "specdec.models.errors",
    "LoadedModel": "specdec.models.load",
    "ModelStore": "specdec.models.store",
    "load_causal_lm": "specdec.models.load",
    "resolve_model_ref": "specdec.models.resolve",
    "fetch_smollm2": "specdec.models.resolve",
    "convert_gguf": "specdec.models.resolve",
    "gguf_cache_dir": "specdec.models.resolve",
    "SMOLLM2_GGUF_SHA256": "specdec.models.resolve",
    "SOURCE_FILE": "specdec.models.resolve",
    "file_sha256": "specdec.models.hashes",
    "weights_sha256": "specdec.models.hashes",
    "tokenizer_sha256": "specdec.models.hashes",
    "TOKENIZER_FILES": "specdec.models.hashes",
    "check_pair_compatible": "specdec.models.compat",
    "check_loaded_pair": "specdec.models.compat",
    "CompatibilityResult": "specdec.models.compat",
    "IncompatiblePairError": "specdec.models.compat",
    "AdapterInfo": "specdec.models.adapters",
    "AdapterError": "specdec.models.adapters",
    "AdapterMismatchError": "specdec.models.adapters",
    "read_adapter": "specdec.models.adapters",
    "attach_adapter": "specdec.models.adapters",
    "adapted_weights_sha256": "specdec.models.hashes",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
