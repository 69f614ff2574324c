"""The settings tree of the whole product, composed where the packages meet, and the nightly's section.

``flows -> registry, monitoring -> specdec``: each package keeps its own section (:mod:`specdec.settings`:
``core``, ``policy`` and ``SPECDEC_HOME``; :mod:`registry.settings`; :mod:`monitoring.settings`;
:mod:`monitoring.production.settings`), and this module, which imports them all, composes them into one
:class:`Settings` with :func:`load_settings`. An entry point (each CLI command, each Prefect flow, the
demo) builds the tree once and hands each function the section it needs; nothing below an entry point
reads the environment.

A flow called in-process gets the caller's tree through :func:`using` (the CLI's ``nightly run``, the
demo); a flow started by a deployment reads its own (:func:`for_this_run`). The tree is not a flow
parameter: Prefect stores parameters in its database, and the tree holds secrets (alert channel URLs,
the history store's password).

Environment variable names, per section: ``SPECDEC_HOME``, ``SPECDEC_MODELS_DIR``, ``SPECDEC_DEVICE``,
``SPECDEC_DTYPE`` (core); ``SPECDEC_POLICY__*`` (policy); ``SPECDEC_TRACKING_URI`` / ``MLFLOW_TRACKING_URI``,
``SPECDEC_ARTIFACTS_DIR``, ``SPECDEC_PAIR_NAME``, ... (registry); ``SPECDEC_DB_URL``,
``SPECDEC_ALERT_CHANNELS``, ``SPECDEC_RULES__*``, ``SPECDEC_DELIVERY__*``, ... (monitoring);
``SPECDEC_PRODUCTION_*`` (production); ``SPECDEC_NIGHTLY_*`` (nightly); ``PREFECT_API_URL`` (read
here for the CLI's choice of a private Prefect API). Older names
(:data:`specdec.settings.aliases.OLD_NAMES`) still work, with one warning.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from monitoring.production.settings import ProductionSettings
from monitoring.settings import MonitoringSettings
from registry.settings import RegistrySettings
from specdec.policy import AcceptancePolicy
from specdec.settings import CoreSettings, PolicySettings, home_dir

class NightlySettings(BaseSettings):
    """Defaults of the nightly validation deployment.

    Env examples: ``SPECDEC_NIGHTLY_CRON="30 1 * * *"``, ``SPECDEC_NIGHTLY_PAIRS='["specdec-pair"]'``,
    ``SPECDEC_NIGHTLY_LIMIT=192``, ``SPECDEC_NIGHTLY_METHOD=decode``, ``SPECDEC_NIGHTLY_WORK_POOL=gpu-pool``, ``SPECDEC_NIGHTLY_BATCH_SIZE=8``.

    Attributes:
        cron / timezone: the deployment's schedule (``prefect deploy --all``, ``specdec nightly serve``).
        pairs: the pair registered models validated every night (JSON list).
        aliases: the aliases validated in each pair (JSON list).
        heldout: a packaged held-out set (``spec_bench``, ``humaneval``) or a JSONL path.
        limit: prompts drawn from the held-out set (stratified by category); unset: all of them.
        method: ``replay``, ``decode`` or ``both`` (replay every prompt, decode a fraction to check it).
        decode_fraction: with ``both``, the share of prompts also decoded (at least 2 per category).
        device / dtype: where and in which dtype the models run (``auto``: CUDA in bf16 if present, else CPU fp32).
        batch_size: prompts decoded together by the validation (>= 1, default 1; see
            :class:`specdec.validation.ValidationConfig`). Larger batches raise throughput on a GPU worker;
            on a small CPU batch > 1 mostly adds padding cost. Speed metrics are measured at this batch size.
        work_pool / deployment_name: the Prefect work pool and deployment name of ``prefect deploy``.
        parallel: validate several pair versions at once through ``prefect-dask``'s ``DaskTaskRunner``.
        dask_workers: local Dask workers when ``parallel`` (and local Ray CPUs with ``ray_address="local"``).
        ray_address: run the flow's tasks on Ray (``prefect-ray``, ``pip install 'specdec[ray]'``) instead of
            Dask: ``local`` (a Ray started for the flow), ``auto`` (this machine's cluster) or ``ray://host:port``.
        shards: each pair's replay split over this many tasks (``SPECDEC_NIGHTLY_SHARDS=8`` with ``parallel``:
            one per Dask worker).
        continuations: ``core`` or ``engine`` (the target's greedy continuations from the engine the pair
            version names, ``SPECDEC_NIGHTLY_METHOD=replay``): docs/scale.md.
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
    ray_address: str | None = None
    shards: int = Field(default=1, ge=1)
    continuations: Literal["core", "engine"] = "core"


class PrefectSettings(BaseSettings):
    """What the CLI reads of Prefect's own environment (Prefect reads the rest itself).

    Attributes:
        api_url: ``PREFECT_API_URL``: a Prefect server to report to; unset, ``specdec nightly run`` starts
            a private one (:mod:`flows.prefect_api`).
        home: ``PREFECT_HOME`` (Prefect's default ``~/.prefect`` when unset).
    """

    model_config = SettingsConfigDict(env_prefix="PREFECT_", extra="ignore")

    api_url: str | None = None
    home: Path | None = None


class WatchSettings(BaseSettings):
    """``specdec pair watch``'s secret.

    Attributes:
        secret: the HMAC secret of the MLflow webhooks the watcher subscribes (16+ characters; never a flag,
            never logged).
    """

    model_config = SettingsConfigDict(env_prefix="SPECDEC_WATCH_", env_file=".env", extra="ignore",
                                      hide_input_in_errors=True)

    secret: SecretStr | None = None


class DemoSettings(BaseSettings):
    """``make demo``'s overrides (env prefix ``SPECDEC_DEMO_``; all optional).

    Attributes:
        dir: the demo's state directory (``SPECDEC_DEMO_DIR``, default ``<repo>/.specdec/demo``).
        draft / k: skip the measurement and use this drafter spec and k (``derived:bf16``; ``eagle3``
            tells the story with an EAGLE-3 head).
        head: the EAGLE-3 head directory to start from.
        per_category / max_new_tokens: the held-out size (default: chosen from the measured one-token pass).
    """

    model_config = SettingsConfigDict(env_prefix="SPECDEC_DEMO_", extra="ignore", env_ignore_empty=True)

    dir: Path | None = None
    draft: str | None = None
    k: int | None = None
    head: str | None = None
    per_category: int | None = None
    max_new_tokens: int | None = None


class Settings(BaseModel):
    """The whole tree, read once by :func:`load_settings`.

    Attributes:
        home: absolute data directory (``SPECDEC_HOME``).
        core / registry / monitoring / production / nightly: the sections (module docstring).
        policy: the one acceptance policy of the tree (``SPECDEC_POLICY__*``, read once): the drift rules hold
            it (``monitoring.rules.policy``), and the gate, plots and Evidently report are built from it.
        prefect: what the CLI reads of Prefect's environment. watch: ``specdec pair watch``'s secret.
    """

    model_config = ConfigDict(frozen=True)

    home: Path
    core: CoreSettings
    policy: AcceptancePolicy
    registry: RegistrySettings
    monitoring: MonitoringSettings
    production: ProductionSettings
    nightly: NightlySettings
    prefect: PrefectSettings = Field(default_factory=PrefectSettings)
    watch: WatchSettings = Field(default_factory=WatchSettings)


def load_settings(home: Path | None = None) -> Settings:
    """Read every section from the environment once; ``SPECDEC_HOME`` (or ``home``) is read once and
    handed to the sections that keep files under it.

    Raises:
        pydantic.ValidationError: a malformed value (the error names the field; secrets are not echoed).
    """
    home = Path(home).expanduser().resolve() if home is not None else home_dir()
    policy = PolicySettings().policy()  # the one policy: the rules hold it, the gate is built from it
    return Settings(home=home, core=CoreSettings(home=home), policy=policy, registry=RegistrySettings(home=home),
                    monitoring=MonitoringSettings(home=home, rules={"policy": policy}),
                    production=ProductionSettings(), nightly=NightlySettings(), prefect=PrefectSettings(),
                    watch=WatchSettings())


_given: ContextVar[Settings | None] = ContextVar("specdec_settings", default=None)


@contextmanager
def using(settings: Settings) -> Iterator[Settings]:
    """Flows called inside this block (same thread) run with ``settings`` instead of reading their own."""
    token = _given.set(settings)
    try:
        yield settings
    finally:
        _given.reset(token)


def for_this_run() -> Settings:
    """The tree a flow run works with: its in-process caller's (:func:`using`), else read now (a
    deployment's run is its own entry point)."""
    return _given.get() or load_settings()


def get_settings() -> NightlySettings:
    """The nightly section read from the environment (the deployment's defaults)."""
    return NightlySettings()
