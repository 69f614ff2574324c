"""Production ingestion's section of the settings tree: where production acceptance counters are ingested
from (pydantic-settings, env prefix ``SPECDEC_PRODUCTION_``; composed into the tree by
:func:`flows.settings.load_settings`).

Example (JSON in env, or the same keys in ``.env``)::

    SPECDEC_PRODUCTION_SOURCES='[{"name": "vllm-prod", "kind": "prometheus",
                                  "url": "http://prometheus:9090", "engine": "vllm",
                                  "selector": "job=\\"vllm\\""}]'
    SPECDEC_PRODUCTION_MAPPINGS='[{"source": "vllm-prod", "model": "meta-llama/Llama-3.1-8B-Instruct",
                                   "pair": "specdec-pair", "alias": "champion"}]'
    SPECDEC_PRODUCTION_WINDOW_MINUTES=15
    SPECDEC_PRODUCTION_CRON="*/15 * * * *"

A mapping says which registered pair (and alias) serves a model label of a source: rows are written
for that pair with ``source = production``. ``source`` / ``model`` may be ``"*"``; the most specific
mapping wins. Series of models without a mapping are skipped (logged).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from specdec.engines.profiles import DEFAULT_ENGINE, engines_help, metric_engine_names

#: the serving engines whose metrics production ingest reads (the profiles with ``metrics``)
ENGINE_NAMES = metric_engine_names()


class ProductionSource(BaseModel):
    """One place production counters come from.

    Attributes:
        name: short id (letters, digits, ``._-``), part of the history rows and incident scope.
        kind: ``prometheus`` (a Prometheus server's HTTP query API) or ``metrics`` (scrape the
            engine's ``/metrics`` directly; the previous scrape is kept in the history store).
        url: Prometheus base URL or the ``/metrics`` URL.
        engine: ``vllm`` | ``sglang`` | ``llamacpp``, the engine profiles with metrics (which metric names to
            read); default: the default engine, llama.cpp (:data:`specdec.engines.profiles.DEFAULT_ENGINE`).
        selector: extra PromQL label matchers for ``prometheus`` sources (``job="vllm"``).
    """

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,40}$")
    kind: Literal["prometheus", "metrics"] = "prometheus"
    url: str
    engine: str = DEFAULT_ENGINE
    selector: str = ""

    @field_validator("url")
    @classmethod
    def _http(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("source URL must be http(s)")
        return v

    @field_validator("engine")
    @classmethod
    def _engine(cls, v: str) -> str:
        if v not in ENGINE_NAMES:
            raise ValueError(f"unknown engine {v!r}; known: {engines_help(ENGINE_NAMES)}")
        return v


class ProductionMapping(BaseModel):
    """(source, model label) -> registered pair and alias.

    Attributes:
        source / model: source name and model label value (``"*"`` matches any).
        pair: the pair's registered-model name.
        alias: the alias production serves (``champion``).
        version: pin the pair version instead of resolving ``alias`` at ingestion time.
        num_speculative_tokens: k, when the engine does not reveal it (SGLang; vLLM and llama.cpp
            export one per-position counter per draft position).
    """

    source: str = "*"
    model: str = "*"
    pair: str
    alias: str = "champion"
    version: str | None = None
    num_speculative_tokens: int | None = Field(None, ge=1)


class ProductionSettings(BaseSettings):
    """Sources, mappings, window length and the flow's schedule. Read afresh (never cached).

    Attributes:
        sources: where the counters are read (JSON list of :class:`ProductionSource`; names unique).
        mappings: which pair and alias serve a source's model label (JSON list of :class:`ProductionMapping`).
        window_minutes: window length in minutes (15): the flow ingests ``(end - window, end]``.
        lookback_minutes: how far before the window Prometheus is asked for the last sample of each
            series (5; a ``prometheus`` source's counter value at the window's start).
        timeout_s: one overall deadline in seconds for reading a source (30; the last read may take as long
            again), after which nothing is stored and the command exits 1.
        cron / timezone: the ``production-acceptance`` deployment's schedule.
        deployment_name / work_pool: that deployment's name and Prefect work pool.
    """

    model_config = SettingsConfigDict(env_prefix="SPECDEC_PRODUCTION_", env_file=".env", extra="ignore",
                                      hide_input_in_errors=True)

    sources: list[ProductionSource] = Field(default_factory=list)
    mappings: list[ProductionMapping] = Field(default_factory=list)
    window_minutes: float = Field(15.0, gt=0)
    lookback_minutes: float = Field(5.0, ge=0)
    timeout_s: float = Field(30.0, gt=0)
    cron: str = "*/15 * * * *"
    timezone: str = "UTC"
    deployment_name: str = "production-acceptance"
    work_pool: str = "cpu-pool"

    @model_validator(mode="after")
    def _unique_names(self) -> "ProductionSettings":
        names = [s.name for s in self.sources]
        if len(names) != len(set(names)):
            raise ValueError("production sources must have distinct names")
        return self

    def mapping_for(self, source: str, model: str) -> ProductionMapping | None:
        """The most specific mapping of ``(source, model)``: exact both, exact source, exact model,
        then ``("*", "*")``; ``None`` when nothing matches."""
        return find_mapping(self.mappings, source, model)


def find_mapping(mappings: list[ProductionMapping], source: str, model: str) -> ProductionMapping | None:
    """See :meth:`ProductionSettings.mapping_for`."""
    for want_s, want_m in ((source, model), (source, "*"), ("*", model), ("*", "*")):
        for m in mappings:
            if m.source == want_s and m.model == want_m:
                return m
    return None



def get_production_settings(**overrides) -> ProductionSettings:
    """The production section read from the environment; keyword ``overrides`` win."""
    return ProductionSettings(**overrides)
