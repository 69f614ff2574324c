"""The history store: SQLAlchemy 2 models, the engine, and Alembic upgrades run from code.

Six tables:

- ``validation_runs``: one row per (pair name, pair version, held-out name, held-out version,
  config hash, scheduled date, alias) -- the idempotency key, a unique index. Pooled metrics with
  their 95% CIs, lineage hashes, config, device, timings, status, MLflow run id and the
  ``mlflow_logged`` flag, rule results and the Evidently verdict. ``source`` says where the
  numbers come from: ``nightly`` (a held-out validation), ``production`` (a window of a serving
  engine's counters, :mod:`monitoring.production`; ``production_source``, ``engine``,
  ``window_start``/``window_end`` set) or ``engine`` (an engine check, :mod:`monitoring.engine_checks`;
  ``engine`` set). Identity lives in these columns, never in prefixes of other strings (migration
  ``0009_source_columns``).
- ``prompt_results``: one row per held-out prompt of a run (:class:`specdec.validation.report.PromptResult`).
- ``incidents``: alert incidents per (pair name, scope); at most one ``firing`` per key.
- ``alert_deliveries``: the outbox, one row per (incident transition, channel), unique
  ``idempotency_key``.
- ``production_scrapes``: the last direct ``/metrics`` scrape per production source (the counter
  values the next window's deltas start from).
- ``webhook_deliveries``: registry webhook deliveries, unique delivery id and trigger key.

SQLite (default, ``sqlite:///<home>/history.db``) runs in WAL mode with ``BEGIN IMMEDIATE``
transactions, so two processes writing the same file serialise instead of failing on lock upgrades.
Postgres works through ``postgresql+psycopg://`` (psycopg 3).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from sqlalchemy import (JSON, Boolean, Date, DateTime, Float, ForeignKey, Index, Integer, String, Text,
                        UniqueConstraint, create_engine, event, text)
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship, sessionmaker
from sqlalchemy.types import TypeDecorator

from monitoring.redact import redact_db_url

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

# run statuses
RUNNING, COMPLETED, PASSED, FAILED, INCONCLUSIVE, ERROR = (
    "running", "completed", "passed", "failed", "inconclusive", "error",
)
# a run whose process died while it held the row (killed, SIGTERM, the host lost): its ``error`` says why
CRASHED = "crashed"
TERMINAL_STATUSES = (COMPLETED, PASSED, FAILED, INCONCLUSIVE, ERROR, CRASHED)
# incident statuses
FIRING, RESOLVED = "firing", "resolved"
# delivery statuses
PENDING, SENDING, DELIVERED = "pending", "sending", "delivered"
# where a validation_runs row comes from (its ``source`` column)
NIGHTLY, PRODUCTION, ENGINE = "nightly", "production", "engine"


def utcnow() -> dt.datetime:
    """The current time, timezone-aware UTC."""
    return dt.datetime.now(dt.timezone.utc)


class UTCDateTime(TypeDecorator):
    """Timezone-aware UTC datetimes on every backend (SQLite stores naive UTC text)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column; pass an aware datetime")
        value = value.astimezone(dt.timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: dt.datetime | None, dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.timezone.utc)
        return value.astimezone(dt.timezone.utc)


class Base(DeclarativeBase):
    """Declarative base of the history models."""


class ValidationRun(Base):
    """One validation of a pair version on a held-out set for one scheduled date."""

    __tablename__ = "validation_runs"
    __table_args__ = (
        # one row per run: the alias is part of the key (migration 0011_alias_in_run_key), NULL as ''
        Index("uq_validation_runs_key", "pair_name", "pair_version", "heldout_name", "heldout_version", "config_hash",
              "scheduled_date", text("coalesce(alias, '')"), unique=True),
        Index("ix_validation_runs_pair_status", "pair_name", "status"),
        Index("ix_validation_runs_alias", "alias"),
        Index("ix_validation_runs_source_pair", "source", "pair_name"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    # idempotency key
    pair_name: Mapped[str] = mapped_column(String(200))
    pair_version: Mapped[str] = mapped_column(String(64))
    heldout_name: Mapped[str] = mapped_column(String(200))
    heldout_version: Mapped[str] = mapped_column(String(64))
    config_hash: Mapped[str] = mapped_column(String(64))
    scheduled_date: Mapped[dt.date] = mapped_column(Date)
    # claim / lifecycle
    alias: Mapped[str | None] = mapped_column(String(64), nullable=True)
    source: Mapped[str] = mapped_column(String(20), default=NIGHTLY, server_default=NIGHTLY)  # NIGHTLY | PRODUCTION | ENGINE
    # the serving engine (an engine check's, a production window's; NULL for a nightly run) and the
    # production source name (a production window's): migration 0009_source_columns
    engine: Mapped[str | None] = mapped_column(String(32), nullable=True)
    production_source: Mapped[str | None] = mapped_column(String(200), nullable=True)
    window_start: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    window_end: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    status: Mapped[str] = mapped_column(String(20), default=RUNNING)
    claim_token: Mapped[str | None] = mapped_column(String(36), nullable=True)
    claimed_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    heartbeat_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    updated_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # lineage
    target_ref: Mapped[str | None] = mapped_column(String(500), nullable=True)
    drafter_kind: Mapped[str | None] = mapped_column(String(32), nullable=True)
    drafter_ref: Mapped[str | None] = mapped_column(String(500), nullable=True)
    target_hash: Mapped[str | None] = mapped_column(String(128), nullable=True)
    draft_hash: Mapped[str | None] = mapped_column(String(128), nullable=True)
    code_version: Mapped[str | None] = mapped_column(String(100), nullable=True)
    # config and environment
    config: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    num_speculative_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    device: Mapped[str | None] = mapped_column(String(64), nullable=True)
    dtype: Mapped[str | None] = mapped_column(String(32), nullable=True)
    report_created_at: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # timings (seconds)
    wall_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    target_only_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    speculative_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    # pooled metrics (probabilities in [0, 1]; lengths in tokens)
    num_prompts: Mapped[int | None] = mapped_column(Integer, nullable=True)
    num_drafts: Mapped[int | None] = mapped_column(Integer, nullable=True)
    num_draft_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    num_accepted_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    acceptance_rate: Mapped[float | None] = mapped_column(Float, nullable=True)
    acceptance_rate_ci_low: Mapped[float | None] = mapped_column(Float, nullable=True)
    acceptance_rate_ci_high: Mapped[float | None] = mapped_column(Float, nullable=True)
    mean_accepted_length: Mapped[float | None] = mapped_column(Float, nullable=True)
    draft_tokens_per_step: Mapped[float | None] = mapped_column(Float, nullable=True)
    alpha_hat: Mapped[float | None] = mapped_column(Float, nullable=True)
    alpha_hat_ci_low: Mapped[float | None] = mapped_column(Float, nullable=True)
    alpha_hat_ci_high: Mapped[float | None] = mapped_column(Float, nullable=True)
    # the floor's per-token acceptance (migration 0007_per_token_acceptance; filled for older rows)
    per_token_acceptance: Mapped[float | None] = mapped_column(Float, nullable=True)
    per_token_acceptance_ci_low: Mapped[float | None] = mapped_column(Float, nullable=True)
    per_token_acceptance_ci_high: Mapped[float | None] = mapped_column(Float, nullable=True)
    alpha_tf: Mapped[float | None] = mapped_column(Float, nullable=True)
    alpha_tf_ci_low: Mapped[float | None] = mapped_column(Float, nullable=True)
    alpha_tf_ci_high: Mapped[float | None] = mapped_column(Float, nullable=True)
    top1_agreement: Mapped[float | None] = mapped_column(Float, nullable=True)
    total_variation: Mapped[float | None] = mapped_column(Float, nullable=True)
    kl_divergence: Mapped[float | None] = mapped_column(Float, nullable=True)
    speedup: Mapped[float | None] = mapped_column(Float, nullable=True)
    predicted_speedup: Mapped[float | None] = mapped_column(Float, nullable=True)
    # speed evidence (migration 0004_speed): paired bootstrap CI of speedup, machine load during timings
    speedup_ci_low: Mapped[float | None] = mapped_column(Float, nullable=True)
    speedup_ci_high: Mapped[float | None] = mapped_column(Float, nullable=True)
    load_avg_1m: Mapped[float | None] = mapped_column(Float, nullable=True)
    num_cpus: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # replay (migration 0005_replay): how acceptance was measured, replay/decode agreement, unexplained flips
    method: Mapped[str | None] = mapped_column(String(16), nullable=True)
    replay_decode_agreement: Mapped[float | None] = mapped_column(Float, nullable=True)
    replay_beyond_numerics: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # LoRA adapters and both acceptance rules (migration 0010_adapters_and_rules): the target's and the draft's
    # adapter (registered name; NULL: the base as it is), the rule the floor judges and both rules' overall rates
    target_adapter: Mapped[str | None] = mapped_column(String(200), nullable=True)
    target_adapter_hash: Mapped[str | None] = mapped_column(String(128), nullable=True)
    draft_adapter: Mapped[str | None] = mapped_column(String(200), nullable=True)
    acceptance_rule: Mapped[str | None] = mapped_column(String(16), nullable=True)
    exact_rule_acceptance: Mapped[float | None] = mapped_column(Float, nullable=True)
    argmax_rule_acceptance: Mapped[float | None] = mapped_column(Float, nullable=True)
    overall: Mapped[dict | None] = mapped_column(JSON, nullable=True)  # GroupMetrics as dict
    categories: Mapped[dict | None] = mapped_column(JSON, nullable=True)  # name -> GroupMetrics dict
    # evaluation
    baseline_run_id: Mapped[int | None] = mapped_column(
        ForeignKey("validation_runs.id", ondelete="SET NULL"), nullable=True
    )
    rule_results: Mapped[list | None] = mapped_column(JSON, nullable=True)
    root_cause_hint: Mapped[str | None] = mapped_column(Text, nullable=True)
    evidently_html: Mapped[str | None] = mapped_column(String(1000), nullable=True)
    evidently_json: Mapped[str | None] = mapped_column(String(1000), nullable=True)
    evidently_verdict: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    # MLflow (logged after the history row; retried by the flow when mlflow_logged is False)
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    mlflow_logged: Mapped[bool] = mapped_column(Boolean, default=False)

    prompts: Mapped[list["PromptRow"]] = relationship(
        back_populates="run", cascade="all, delete-orphan", passive_deletes=True,
        order_by="PromptRow.id",
    )


class PromptRow(Base):
    """One held-out prompt's result inside a run (mirrors :class:`specdec.validation.report.PromptResult`).

    The main metrics are columns (for SQL); ``data`` holds the complete dataclass as JSON.
    """

    __tablename__ = "prompt_results"
    __table_args__ = (UniqueConstraint("run_id", "prompt_id", name="uq_prompt_results_run_prompt"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("validation_runs.id", ondelete="CASCADE"), index=True)
    prompt_id: Mapped[str] = mapped_column(String(200))
    category: Mapped[str] = mapped_column(String(100))
    status: Mapped[str] = mapped_column(String(20), default="ok")
    skip_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    new_tokens: Mapped[int] = mapped_column(Integer, default=0)
    num_drafts: Mapped[int] = mapped_column(Integer, default=0)
    num_draft_tokens: Mapped[int] = mapped_column(Integer, default=0)
    num_accepted_tokens: Mapped[int] = mapped_column(Integer, default=0)
    acceptance_rate: Mapped[float | None] = mapped_column(Float, nullable=True)
    num_tf_positions: Mapped[int] = mapped_column(Integer, default=0)
    alpha_tf: Mapped[float | None] = mapped_column(Float, nullable=True)
    top1_agreement: Mapped[float | None] = mapped_column(Float, nullable=True)
    total_variation: Mapped[float | None] = mapped_column(Float, nullable=True)
    kl_divergence: Mapped[float | None] = mapped_column(Float, nullable=True)
    target_only_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    speculative_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    exact_match: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    first_divergence: Mapped[int | None] = mapped_column(Integer, nullable=True)
    divergence_logit_margin: Mapped[float | None] = mapped_column(Float, nullable=True)
    alpha_hat: Mapped[float | None] = mapped_column(Float, nullable=True)
    mean_accepted_length: Mapped[float | None] = mapped_column(Float, nullable=True)
    # the full PromptResult as a dict (fields added to specdec.validation.report later survive here)
    data: Mapped[dict | None] = mapped_column(JSON, nullable=True)

    run: Mapped[ValidationRun] = relationship(back_populates="prompts")


class Incident(Base):
    """An alert incident of one pair (and scope, e.g. the alias it was validated under)."""

    __tablename__ = "incidents"
    __table_args__ = (
        # at most one open incident per (pair, scope); partial index on both backends
        Index(
            "uq_incidents_open", "pair_name", "scope", unique=True,
            sqlite_where=text("status = 'firing'"), postgresql_where=text("status = 'firing'"),
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    pair_name: Mapped[str] = mapped_column(String(200))
    scope: Mapped[str] = mapped_column(String(64), default="")
    status: Mapped[str] = mapped_column(String(20), default=FIRING)
    opened_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    last_notified_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    resolved_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    reminder_count: Mapped[int] = mapped_column(Integer, default=0)
    opened_run_id: Mapped[int | None] = mapped_column(
        ForeignKey("validation_runs.id", ondelete="SET NULL"), nullable=True
    )
    last_run_id: Mapped[int | None] = mapped_column(
        ForeignKey("validation_runs.id", ondelete="SET NULL"), nullable=True
    )
    resolved_run_id: Mapped[int | None] = mapped_column(
        ForeignKey("validation_runs.id", ondelete="SET NULL"), nullable=True
    )
    summary: Mapped[dict | None] = mapped_column(JSON, nullable=True)


class AlertDelivery(Base):
    """Outbox row: one message for one (incident transition, channel). Never holds the URL."""

    __tablename__ = "alert_deliveries"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    incident_id: Mapped[int | None] = mapped_column(
        ForeignKey("incidents.id", ondelete="CASCADE"), nullable=True, index=True
    )
    transition: Mapped[str] = mapped_column(String(32))  # fire | remind-<n> | resolve
    channel_id: Mapped[str] = mapped_column(String(100))
    channel_type: Mapped[str] = mapped_column(String(20))
    idempotency_key: Mapped[str] = mapped_column(String(255), unique=True)
    payload: Mapped[dict] = mapped_column(JSON)  # the message (channel-neutral), no secrets
    status: Mapped[str] = mapped_column(String(20), default=PENDING, index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    response_status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    delivered_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)


class ProductionScrape(Base):
    """The last direct ``/metrics`` scrape of one production source (one row per source name).

    ``series`` holds every speculative-decoding series of the scrape as JSON
    (``[{"name", "labels", "value", "created"}]``); the next scrape's window deltas start from it.
    """

    __tablename__ = "production_scrapes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    source: Mapped[str] = mapped_column(String(200), unique=True)
    engine: Mapped[str] = mapped_column(String(32))
    scraped_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    process_start_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    series: Mapped[list] = mapped_column(JSON)


class WebhookDelivery(Base):
    """An MLflow webhook delivery the watcher accepted (:mod:`monitoring.deliveries`); never the secret."""

    __tablename__ = "webhook_deliveries"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    delivery_id: Mapped[str] = mapped_column(String(64), unique=True)
    received_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    event: Mapped[str] = mapped_column(String(64))
    model_name: Mapped[str] = mapped_column(String(200))
    version: Mapped[str | None] = mapped_column(String(32), nullable=True)
    action: Mapped[str] = mapped_column(String(200))  # validate | gate-champion | ignored: ... | failed: ...
    trigger_key: Mapped[str | None] = mapped_column(String(300), unique=True, nullable=True)
    flow_run_id: Mapped[str | None] = mapped_column(String(64), nullable=True)


def none_to_nan(x: float | None) -> float:
    """``None`` -> ``nan``; numbers pass through as float."""
    return math.nan if x is None else float(x)


def _make_engine(url: str) -> Engine:
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        if u.database and u.database != ":memory:":
            Path(u.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_conn, _record) -> None:
            dbapi_conn.isolation_level = None  # let SQLAlchemy emit BEGIN itself (below)
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            if u.database and u.database != ":memory:":
                cur.execute("PRAGMA journal_mode=WAL")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn) -> None:
            # take the write lock up front: read-then-write transactions (claims, incident
            # transitions) serialise instead of failing with SQLITE_BUSY on lock upgrade
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    return create_engine(url, pool_pre_ping=True)


class Database:
    """An engine plus a session factory for one history store.

    Args:
        url: SQLAlchemy URL (``sqlite:///path/history.db`` or ``postgresql+psycopg://...``).

    The URL may hold a password: ``repr`` and log lines show it masked.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = _make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    def __repr__(self) -> str:
        return f"Database({redact_db_url(self.url)!r})"

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session inside one transaction: committed on success, rolled back on error."""
        with self._sessions() as s, s.begin():
            yield s

    def upgrade(self, revision: str = "head") -> None:
        """Apply Alembic migrations up to ``revision`` (idempotent). Creates tables on an empty DB.

        Concurrent upgrades serialise (SQLite: ``BEGIN IMMEDIATE``; Postgres: an advisory lock).
        """
        from alembic import command

        from alembic.runtime.migration import MigrationContext
        from alembic.script import ScriptDirectory

        cfg = alembic_config(self.url)
        with self.engine.begin() as conn:
            if conn.dialect.name == "postgresql":  # two workers upgrading at once: one waits
                conn.execute(text("SELECT pg_advisory_xact_lock(5483041)"))
            at = MigrationContext.configure(conn).get_current_revision()
            script = ScriptDirectory.from_config(cfg)
            if at is not None and at not in {r.revision for r in script.walk_revisions()}:
                raise SchemaTooNew(f"history store {redact_db_url(self.url)} is at schema revision {at!r}, which "
                                   f"this specdec does not know (newest here: {script.get_current_head()!r}); it was "
                                   "written by a newer specdec: upgrade specdec, or point SPECDEC_DB_URL elsewhere")
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
        log.debug("history store %s at revision %s", redact_db_url(self.url), self.current_revision())

    def current_revision(self) -> str | None:
        """The Alembic revision the database is at (``None`` for an empty database)."""
        from alembic.runtime.migration import MigrationContext

        with self.engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()

    def dispose(self) -> None:
        """Close pooled connections."""
        self.engine.dispose()


class SchemaTooNew(SQLAlchemyError):
    """The history store was migrated by a newer specdec (unknown Alembic revision); reported as one line."""


def alembic_config(url: str | None = None):
    """An Alembic :class:`~alembic.config.Config` pointing at the migrations shipped in this package."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def head_revision() -> str:
    """The newest Alembic revision shipped in this package (what :meth:`Database.upgrade` reaches)."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def connect(settings=None, *, url: str | None = None, upgrade: bool = True) -> Database:
    """Open the history store named by ``url`` or ``settings.db_url`` and bring it to ``head``.

    Args:
        settings: :class:`monitoring.settings.MonitoringSettings`, the caller's section (the CLI or
            the flow builds it at the edge). url: overrides ``settings.db_url``.
        upgrade: run Alembic migrations first (default True; cheap when already at head).
    Raises:
        ValueError: neither ``settings`` nor ``url``.
        sqlalchemy.exc.OperationalError: the database cannot be reached.
    """
    if url is None:
        if settings is None:
            raise ValueError("connect() needs the monitoring settings or a url")
        url = settings.db_url
    db = Database(url)
    if upgrade:
        db.upgrade()
    return db
