"""Where the model caches live: :class:`ModelStore` (``<models_dir>``, ``CoreSettings.models_dir``, read at the
edge and handed down; issue 42).

The caches under it: ``gguf/<gguf sha256>/`` (a GGUF converted to safetensors), ``gguf-files/<sha256>/`` (a GGUF
file itself), ``cast/<weights sha256[:16]>-<dtype>/`` (a checkpoint cast to bf16/fp16), ``converted/<bin
sha256>/`` (a ``pytorch_model.bin`` checkpoint converted to safetensors).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelStore:
    """The models directory and the path of each cache in it (see the module docstring).

    Attributes:
        models_dir: ``SPECDEC_MODELS_DIR`` (default ``<home>/models``) as the entry point read it.
    """

    models_dir: Path

    def cast_dir(self, weights_sha256: str, dtype: str) -> Path:
        """The cast copy of the checkpoint whose weights hash ``weights_sha256``, in ``dtype`` (may not exist yet)."""
        return Path(self.models_dir) / "cast" / f"{weights_sha256[:16]}-{dtype}"

    def gguf_dir(self, gguf_sha256: str) -> Path:
        """The safetensors conversion of the GGUF file whose sha256 is ``gguf_sha256`` (may not exist yet)."""
        return Path(self.models_dir) / "gguf" / gguf_sha256

    def gguf_file_dir(self, gguf_sha256: str) -> Path:
        """The directory holding the GGUF file itself whose sha256 is ``gguf_sha256`` (may not exist yet)."""
        return Path(self.models_dir) / "gguf-files" / gguf_sha256

    def converted_dir(self, bin_sha256: str) -> Path:
        """The safetensors conversion of the ``*.bin`` checkpoint whose weights hash ``bin_sha256`` (may not
        exist yet)."""
        return Path(self.models_dir) / "converted" / bin_sha256
