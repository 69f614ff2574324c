"""Runtime settings for ``specdec`` (pydantic-settings, environment prefix ``SPECDEC_``).

Environment variables (all optional):

- ``SPECDEC_HOME``: data directory (default ``./.specdec``, resolved against the current
  working directory when the settings are read).
- ``SPECDEC_MODELS_DIR``: where converted checkpoints are cached (default ``$SPECDEC_HOME/models``).
- ``SPECDEC_DEVICE``: default device for commands, ``auto`` | ``cpu`` | ``cuda`` | ``cuda:N``
  (default ``auto``: CUDA when available, else CPU).
- ``SPECDEC_DTYPE``: default dtype name, ``auto`` | ``float32`` | ``bfloat16`` | ``float16``
  (default ``auto``: bf16 on CUDA, fp32 on CPU).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
           "float16": "float16", "fp16": "float16", "half": "float16"}


class SpecdecSettings(BaseSettings):
    """Settings read from ``SPECDEC_*`` environment variables (and a ``.env`` file if present).

    Attributes:
        home: absolute data directory.
        models_dir: absolute directory for converted model checkpoints (GGUF -> safetensors cache).
        device: ``auto`` or a torch device string.
        dtype: ``auto`` or a dtype name (``float32``, ``bfloat16``, ``float16``).
    """

    model_config = SettingsConfigDict(env_prefix="SPECDEC_", env_file=".env", extra="ignore")

    home: Path = Path(".specdec")
    models_dir: Path | None = None
    device: str = "auto"
    dtype: str = "auto"

    @model_validator(mode="after")
    def _resolve(self) -> "SpecdecSettings":
        self.home = Path(self.home).expanduser().resolve()
        self.models_dir = (
            Path(self.models_dir).expanduser().resolve() if self.models_dir else self.home / "models"
        )
        return self

    def resolved_device(self) -> str:
        """The concrete torch device string: ``auto`` becomes ``cuda`` if available, else ``cpu``."""
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def resolved_dtype(self, device: str | None = None):
        """The concrete ``torch.dtype``: ``auto`` is bf16 on CUDA and fp32 elsewhere.

        Raises:
            ValueError: unknown dtype name.
        """
        import torch

        name = self.dtype.lower()
        if name == "auto":
            dev = device or self.resolved_device()
            return torch.bfloat16 if str(dev).startswith("cuda") else torch.float32
        if name not in _DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; use one of auto, {', '.join(sorted(set(_DTYPES.values())))}")
        return getattr(torch, _DTYPES[name])


def get_settings() -> SpecdecSettings:
    """Read the settings afresh from the environment (cheap; not cached, so tests can monkeypatch env)."""
    return SpecdecSettings()
