"""The nightly section: defaults of the nightly validation deployment (env prefix ``SPECDEC_NIGHTLY_``)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class NightlySettings(BaseSettings):
    """Defaults of the nightly validation deployment.

    Env examples: ``SPECDEC_NIGHTLY_CRON="30 1 * * *"``, ``SPECDEC_NIGHTLY_PAIRS='["specdec-pair"]'``,
    ``SPECDEC_NIGHTLY_LIMIT=192``, ``SPECDEC_NIGHTLY_METHOD=decode``, ``SPECDEC_NIGHTLY_WORK_POOL=gpu-pool``, ``SPECDEC_NIGHTLY_BATCH_SIZE=8``.

    ``batch_size``: prompts decoded together by the validation (>= 1, default 1; see
    :class:`specdec.validation.ValidationConfig`). Larger batches raise throughput on a GPU worker;
    on a small CPU batch > 1 mostly adds padding cost. Speed metrics are measured at this batch size.
    """

    model_config = SettingsConfigDict(env_prefix="SPECDEC_NIGHTLY_", env_file=".env", extra="ignore")

    cron: str = "0 2 * * *"
    timezone: str = "UTC"
    pairs: list[str] = Field(default_factory=lambda: ["specdec-pair"])
    aliases: list[str] = Field(default_factory=lambda: ["champion", "challenger"])
    heldout: str = "spec_bench"
    limit: int | None = 192
    method: str = "both"
    decode_fraction: float = Field(default=0.25, gt=0, le=1)
    device: str = "auto"
    dtype: str = "auto"
    batch_size: int = Field(default=1, ge=1)
    work_pool: str = "cpu-pool"
    deployment_name: str = "nightly-validation"
    parallel: bool = False
    dask_workers: int = 2

