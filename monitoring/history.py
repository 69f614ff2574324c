"""Validation history: claim a nightly run, record its report, find the baseline, list past runs.

Idempotency key: (pair name, pair version, held-out name, held-out version, config hash, scheduled
date, alias), a unique index on ``validation_runs`` (the alias since migration 0011: re-validating a version the
same day under another alias is another run, in its own row). The flow:

1. :func:`claim_run` inserts the row in state ``running`` (or re-claims a finished or stale one).
   A second run with the same key while the first is alive gets :class:`RunAlreadyClaimed`.
2. :func:`record_run` writes the report into that same row and replaces its per-prompt rows; a
   retried nightly run therefore updates its row and never duplicates it. It goes through
   :func:`upsert`, the one writer of ``validation_runs`` rows, which every source (nightly run,
   production window, engine check) calls with its own :class:`RunRecord`.
3. :func:`mark_mlflow_logged` once the MLflow run exists; :func:`runs_pending_mlflow` lists rows
   whose MLflow logging must be retried.

The key (:class:`RunKey`, with :func:`config_hash`), the claim on it (:class:`Claim`) and the lineage
recorded with a run (:class:`Lineage`) are defined here, with the rows they identify.

All timestamps are timezone-aware UTC. ``now`` parameters exist so tests can inject the clock.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import uuid
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Callable, Mapping

from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError

from monitoring.db import (
    COMPLETED,
    CRASHED,
    ENGINE,
    ERROR,
    FAILED,
    INCONCLUSIVE,
    NIGHTLY,
    PASSED,
    PRODUCTION,
    RUNNING,
    Database,
    PromptRow,
    ValidationRun,
    none_to_nan,
    utcnow,
)
from monitoring.rules import speed_only_inconclusive
from specdec.validation.report import GroupMetrics, PromptResult, ValidationReport, group_metrics_from_dict, nan_to_none

__all__ = ["RunAlreadyClaimed", "config_hash", "RunKey", "Lineage", "Claim", "DEFAULT_STALE_AFTER_S",
           "RunSnapshot", "RunRecord", "source_label", "parse_source_label", "same_origin", "record_of", "upsert",
           "claim_run", "heartbeat", "record_run", "mark_error", "mark_crashed", "crash_stale_runs", "set_evaluation", "attach_evidently",
           "mark_mlflow_logged", "runs_pending_mlflow", "get_run", "find_run", "list_runs", "newer_evaluated_run",
           "find_baseline", "snapshot", "snapshot_of", "prompt_results"]

DEFAULT_STALE_AFTER_S = 6 * 3600.0


class RunAlreadyClaimed(Exception):
    """Another live run holds this idempotency key (or took it over from us).

    The flow catches it and exits cleanly: the other run is doing the work.

    Attributes:
        key: the :class:`RunKey`. run_id: the row id. claimed_at: when the holder claimed it.
    """

    def __init__(self, key: "RunKey", run_id: int, claimed_at: dt.datetime | None, reason: str) -> None:
        self.key, self.run_id, self.claimed_at = key, run_id, claimed_at
        super().__init__(f"validation run {key.describe()} (row {run_id}): {reason}")


def config_hash(config: Mapping[str, Any]) -> str:
    """SHA-256 (64 hex chars) of ``config`` as canonical JSON (sorted keys, NaN as null).

    Use the same dict for :func:`claim_run` and :func:`record_run`, e.g. the validation config's
    ``to_dict()`` (num_draft_tokens, max_new_tokens, temperature, top_k, top_p, seed, limit).
    """
    blob = json.dumps(nan_to_none(dict(config)), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True)
class RunKey:
    """The idempotency key of one validation run. ``alias``: the alias the version was validated under (``""``:
    none given; such a key matches the row of its other fields whatever its alias, as before migration 0011)."""

    pair_name: str
    pair_version: str
    heldout_name: str
    heldout_version: str
    config_hash: str
    scheduled_date: dt.date
    alias: str = ""

    @classmethod
    def build(
        cls, pair_name: str, pair_version: str | int, heldout_name: str, heldout_version: str,
        config: Mapping[str, Any], scheduled_date: dt.date | str, *, alias: str | None = None,
    ) -> "RunKey":
        """Key from plain values; ``config`` is hashed with :func:`config_hash`.

        ``scheduled_date`` is the date the run was scheduled for (a ``date`` or ISO ``YYYY-MM-DD``),
        not when it happened to start, so a retry the next morning keeps the same key.
        """
        if isinstance(scheduled_date, str):
            scheduled_date = dt.date.fromisoformat(scheduled_date)
        elif isinstance(scheduled_date, dt.datetime):
            scheduled_date = scheduled_date.date()
        return cls(pair_name, str(pair_version), heldout_name, str(heldout_version),
                   config_hash(config), scheduled_date, alias or "")

    def with_alias(self, alias: str | None) -> "RunKey":
        """This key under ``alias`` when it has none yet (a key's own alias is kept)."""
        return self if self.alias or not alias else replace(self, alias=alias)

    def key_id(self) -> str:
        """32 hex chars identifying this key (e.g. the MLflow run tag ``specdec.run_key``); the alias counts when
        there is one."""
        blob = "|".join([self.pair_name, self.pair_version, self.heldout_name, self.heldout_version,
                         self.config_hash, self.scheduled_date.isoformat(), *([self.alias] if self.alias else [])])
        return hashlib.sha256(blob.encode()).hexdigest()[:32]

    def describe(self) -> str:
        """Human-readable key (config hash shortened)."""
        alias = f"@{self.alias} " if self.alias else ""
        return (f"{self.pair_name} v{self.pair_version} {alias}on {self.heldout_name}@{self.heldout_version} "
                f"config {self.config_hash[:10]} for {self.scheduled_date.isoformat()}")

    def _where(self):
        r = ValidationRun
        same_alias = (func.coalesce(r.alias, "") == self.alias,) if self.alias else ()
        return (r.pair_name == self.pair_name, r.pair_version == self.pair_version,
                r.heldout_name == self.heldout_name, r.heldout_version == self.heldout_version,
                r.config_hash == self.config_hash, r.scheduled_date == self.scheduled_date, *same_alias)


@dataclass(frozen=True)
class Lineage:
    """What the pair was made of, for root-cause hints. Plain data from the registry.

    Attributes:
        target_hash / draft_hash: weight hashes (e.g. sha256 of safetensors); ``None`` for a
            weightless drafter (n-gram). heldout_version: held-out set version. code_version:
            ``specdec`` version + git commit.
        target_adapter / target_adapter_hash: the LoRA adapter merged into the target (its name and weights
            hash; ``target_hash`` stays the base's), ``None`` without one.
    """

    target_hash: str | None = None
    draft_hash: str | None = None
    heldout_version: str | None = None
    code_version: str | None = None
    target_adapter: str | None = None
    target_adapter_hash: str | None = None

    @classmethod
    def from_report(cls, report: ValidationReport, *, target_hash: str | None,
                    draft_hash: str | None) -> "Lineage":
        """Lineage with held-out and code versions, and the target's adapter, taken from ``report``."""
        adapter = report.target_adapter or {}
        return cls(target_hash, draft_hash, report.heldout_version, report.code_version, adapter.get("name"),
                   adapter.get("weights_hash"))


@dataclass(frozen=True)
class Claim:
    """Proof that this process owns a run row. ``previous_status`` is ``None`` for a new row."""

    run_id: int
    token: str
    key: RunKey
    previous_status: str | None
    attempts: int


@dataclass
class RunSnapshot:
    """A run's metrics and lineage as plain data (what :func:`monitoring.rules.evaluate` reads)."""

    overall: GroupMetrics
    categories: dict[str, GroupMetrics] = field(default_factory=dict)
    lineage: Lineage = field(default_factory=Lineage)
    run_id: int | None = None
    pair_name: str | None = None
    pair_version: str | None = None
    scheduled_date: dt.date | None = None
    #: the acceptance rule the pair is served under (``exact`` | ``argmax``; None: not recorded)
    acceptance_rule: str | None = None

    @classmethod
    def from_report(cls, report: ValidationReport, lineage: Lineage, **kw) -> "RunSnapshot":
        """Snapshot of an in-memory report (no database needed)."""
        kw.setdefault("acceptance_rule", report.acceptance_rule)
        return cls(report.overall, dict(report.categories), lineage, **kw)

    def describe(self) -> str:
        """``"pair v3 (run 12, 2026-11-28)"``-style label."""
        bits = [f"run {self.run_id}"] if self.run_id is not None else []
        if self.scheduled_date:
            bits.append(self.scheduled_date.isoformat())
        name = f"{self.pair_name or 'pair'} v{self.pair_version}" if self.pair_version else (self.pair_name or "run")
        return f"{name} ({', '.join(bits)})" if bits else name


def _ci(g: GroupMetrics, name: str) -> tuple[float | None, float | None]:
    ci = list(getattr(g, name) or [])
    ci = (ci + [math.nan, math.nan])[:2]
    return nan_to_none(float(ci[0])), nan_to_none(float(ci[1]))


@dataclass(frozen=True)
class RunRecord:
    """One ``validation_runs`` row as a source writes it (nightly run, production window, engine check).

    Each source builds its record from its own report type (:func:`record_of` for a
    :class:`ValidationReport`, :func:`monitoring.production.store.window_record`,
    :func:`monitoring.engine_checks.engine_record`) and hands it to :func:`upsert`, the one writer.

    Attributes:
        source: ``nightly`` | ``production`` | ``engine`` (:data:`monitoring.db.NIGHTLY` ...).
        engine: the serving engine (an engine check's, a production window's; ``None`` for a nightly run).
        production_source: a production window's source name (``None`` otherwise).
        key: the row's identity with ``source``, ``engine`` and ``production_source``, a :class:`RunKey`
            (a production window, ``window_end`` set, is matched without ``pair_version`` and
            ``scheduled_date``: re-ingesting it updates the version its alias pointed at).
        overall / categories: the measured metrics (the flat metric columns are derived from ``overall``).
        config: the config JSON stored with the row. prompts: per-prompt rows (replace the row's).
        Everything else: the column of the same name.
    """

    source: str
    key: RunKey
    overall: GroupMetrics
    engine: str | None = None
    production_source: str | None = None
    categories: dict[str, GroupMetrics] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    alias: str | None = None
    prompts: list[PromptResult] = field(default_factory=list)
    window_start: dt.datetime | None = None
    window_end: dt.datetime | None = None
    target_ref: str | None = None
    drafter_kind: str | None = None
    drafter_ref: str | None = None
    target_hash: str | None = None
    draft_hash: str | None = None
    code_version: str | None = None
    device: str | None = None
    dtype: str | None = None
    method: str | None = None
    wall_seconds: float | None = None
    report_created_at: str | None = None
    # LoRA adapters (names as registered; None: the base as it is) and the served acceptance rule with both rules'
    # overall rates (migration 0010_adapters_and_rules)
    target_adapter: str | None = None
    target_adapter_hash: str | None = None
    draft_adapter: str | None = None
    acceptance_rule: str | None = None


def source_label(source: str, engine: str | None) -> str:
    """A row's source as every surface shows it (history table, ``--source``, trend plot, MLflow tag, incident
    scope): ``nightly`` | ``production`` | ``engine:<engine>`` (from the ``source`` and ``engine`` columns)."""
    return f"{ENGINE}:{engine}" if source == ENGINE else source


def parse_source_label(label: str) -> tuple[str, str | None]:
    """``(source, engine)`` of a :func:`source_label` (``engine:llamacpp`` -> ``("engine", "llamacpp")``), for
    input that names a source the way it is shown (``specdec history --source``) or as it is stored (the
    ``source`` column: ``engine`` alone is every engine's checks, ``(ENGINE, None)``).

    Raises:
        ValueError: not ``nightly``, ``production``, ``engine`` or ``engine:<engine>``.
    """
    if label in (NIGHTLY, PRODUCTION, ENGINE):
        return label, None
    source, _, engine = label.partition(":")
    if source == ENGINE and engine:
        return ENGINE, engine
    raise ValueError(f"source must be 'nightly', 'production', 'engine' or 'engine:<engine>', got {label!r}")


def record_of(report: ValidationReport, key: RunKey, lineage: Lineage, *, alias: str | None = None) -> RunRecord:
    """The nightly :class:`RunRecord` of ``report`` under ``key`` (``report.config`` stored as the config JSON; the
    served ``acceptance_rule`` with both rules' rates, which :func:`_metric_columns` reads from ``report.overall``)."""
    return RunRecord(
        source=NIGHTLY, key=key.with_alias(alias), overall=report.overall, categories=dict(report.categories), config=dict(report.config), alias=alias,
        prompts=list(report.prompts), target_ref=report.target_ref, drafter_kind=report.drafter_kind,
        drafter_ref=report.drafter_ref, target_hash=lineage.target_hash, draft_hash=lineage.draft_hash,
        code_version=lineage.code_version or report.code_version, device=report.device, dtype=report.dtype,
        method=report.method, wall_seconds=report.wall_seconds, report_created_at=report.created_at,
        target_adapter=(report.target_adapter or {}).get("name"),
        target_adapter_hash=(report.target_adapter or {}).get("weights_hash"),
        draft_adapter=(report.draft_adapter or {}).get("name"), acceptance_rule=report.acceptance_rule,
    )


def _metric_columns(rec: RunRecord) -> dict[str, Any]:
    """The row's column values of ``rec`` (flat metrics from ``rec.overall``, NaN -> None)."""
    g = rec.overall
    names = ("acceptance_rate", "alpha_hat", "alpha_tf", "speedup", "per_token_acceptance")
    (ar_lo, ar_hi), (ah_lo, ah_hi), (tf_lo, tf_hi), (sp_lo, sp_hi), (pt_lo, pt_hi) = (_ci(g, f"{n}_ci") for n in names)
    cols = dict(
        speedup_ci_low=sp_lo, speedup_ci_high=sp_hi, load_avg_1m=g.load_avg_1m, num_cpus=g.num_cpus or None,
        num_prompts=g.num_prompts, num_drafts=g.num_drafts, num_draft_tokens=g.num_draft_tokens,
        num_accepted_tokens=g.num_accepted_tokens, acceptance_rate=g.acceptance_rate,
        acceptance_rate_ci_low=ar_lo, acceptance_rate_ci_high=ar_hi,
        mean_accepted_length=g.mean_accepted_length, draft_tokens_per_step=g.draft_tokens_per_step,
        alpha_hat=g.alpha_hat, alpha_hat_ci_low=ah_lo, alpha_hat_ci_high=ah_hi,
        per_token_acceptance=g.per_token_acceptance, per_token_acceptance_ci_low=pt_lo, per_token_acceptance_ci_high=pt_hi,
        alpha_tf=g.alpha_tf, alpha_tf_ci_low=tf_lo, alpha_tf_ci_high=tf_hi,
        top1_agreement=g.top1_agreement, total_variation=g.total_variation,
        kl_divergence=g.kl_divergence, speedup=g.speedup, predicted_speedup=g.predicted_speedup,
        target_only_seconds=g.target_only_seconds, speculative_seconds=g.speculative_seconds,
        replay_decode_agreement=g.replay_decode_agreement, replay_beyond_numerics=g.replay_beyond_numerics,
        exact_rule_acceptance=g.exact_rule_acceptance, argmax_rule_acceptance=g.argmax_rule_acceptance,
        overall=nan_to_none(asdict(g)),
        categories={k: nan_to_none(asdict(v)) for k, v in rec.categories.items()},
        config=json.loads(json.dumps(nan_to_none(dict(rec.config)), default=str)),
        num_speculative_tokens=g.num_speculative_tokens or rec.config.get("num_speculative_tokens"),
        pair_version=rec.key.pair_version, **{f: getattr(rec, f) for f in _PLAIN_COLUMNS},
    )
    return {k: nan_to_none(v) for k, v in cols.items()}


#: record fields stored as they are in the column of the same name
_PLAIN_COLUMNS = ("source", "engine", "production_source", "window_start", "window_end", "target_ref", "drafter_kind",
                  "drafter_ref", "target_hash", "draft_hash", "code_version", "device", "dtype", "method", "wall_seconds",
                  "report_created_at", "target_adapter", "target_adapter_hash", "draft_adapter", "acceptance_rule")


def _prompt_rows(run_id: int, prompts: list[PromptResult]) -> list[PromptRow]:
    ids = [p.prompt_id for p in prompts]
    if len(ids) != len(set(ids)):
        dup = sorted({i for i in ids if ids.count(i) > 1})[:5]
        raise ValueError(f"report has duplicate prompt ids {dup}; held-out prompt ids must be unique")
    cols = set(PromptRow.__table__.columns.keys()) - {"id", "run_id", "data"}
    rows = []
    for p in prompts:
        d = nan_to_none(asdict(p))
        rows.append(PromptRow(run_id=run_id, data=d, **{k: v for k, v in d.items() if k in cols}))
    return rows


def _select_for_update(key: RunKey):
    """The nightly row of ``key``, locked (an alias-less key: the newest of its rows)."""
    r = ValidationRun
    return select(r).where(r.source == NIGHTLY, *key._where()).order_by(r.id.desc()).limit(1).with_for_update()


def claim_run(
    db: Database, key: RunKey, *, alias: str | None = None,
    stale_after_s: float = DEFAULT_STALE_AFTER_S, now: dt.datetime | None = None,
    holder_dead: Callable[[int, str], bool] | None = None,
) -> Claim:
    """Claim ``key`` (under ``alias`` when the key has none: :meth:`RunKey.with_alias`) for this process: insert
    the row as ``running`` or re-claim it; a re-claimed row's previous numbers are cleared.

    A finished row (completed/passed/failed/inconclusive/error) is re-claimed: a retried nightly
    run re-does the work in the same row. A ``running`` row whose heartbeat is older than
    ``stale_after_s`` seconds (a crashed run) is taken over.

    Args:
        db: the history store. key: the idempotency key. alias: the alias the pair version was
            resolved through (``"champion"``...), stored on the row. now: injected clock (UTC; default the store's, :func:`store_now`).
        holder_dead: ``f(run_id, claim_token)`` that knows when the process holding a ``running``
            claim is dead (e.g. :func:`flows.recovery.holder_dead`, same host); such a claim is
            taken over at once instead of after ``stale_after_s``.
    Returns:
        :class:`Claim` to pass to :func:`record_run` / :func:`heartbeat` / :func:`mark_error`.
    Raises:
        RunAlreadyClaimed: a live run holds the key.
    """
    key = key.with_alias(alias)
    for attempt in range(2):
        token = str(uuid.uuid4())
        try:
            with db.session() as s:
                now = now or store_now(s)
                row = s.scalars(_select_for_update(key)).first()
                if row is None:
                    row = ValidationRun(
                        pair_name=key.pair_name, pair_version=key.pair_version,
                        heldout_name=key.heldout_name, heldout_version=key.heldout_version,
                        config_hash=key.config_hash, scheduled_date=key.scheduled_date,
                        alias=key.alias or None, status=RUNNING, claim_token=token, claimed_at=now,
                        heartbeat_at=now, started_at=now, updated_at=now, attempts=1,
                        mlflow_logged=False,
                    )
                    s.add(row)
                    s.flush()
                    return Claim(row.id, token, key, None, 1)
                previous = row.status
                if row.status == RUNNING:
                    beat = row.heartbeat_at or row.claimed_at
                    previous = "running (stale)"
                    if beat is not None and (now - beat).total_seconds() < stale_after_s:
                        if not (holder_dead and row.claim_token and holder_dead(row.id, row.claim_token)):
                            age = (now - beat).total_seconds()
                            raise RunAlreadyClaimed(key, row.id, row.claimed_at,
                                                    f"already running (heartbeat {age:.0f} s ago)")
                        previous = "running (holder process died)"
                row.status, row.claim_token, row.error = RUNNING, token, None
                row.claimed_at = row.heartbeat_at = row.started_at = row.updated_at = now
                row.attempts = (row.attempts or 0) + 1
                _clear_results(s, row)
                if alias is not None and not row.alias:
                    row.alias = alias
                return Claim(row.id, token, key, previous, row.attempts)
        except IntegrityError:  # a concurrent insert won the race (Postgres); re-read once
            if attempt:
                raise
    raise AssertionError("unreachable")


#: what a row says about the work that was done on it, not what it is: cleared when the row is claimed again
_KEPT_ON_RETRY = frozenset({
    "id", "pair_name", "pair_version", "heldout_name", "heldout_version", "config_hash", "scheduled_date", "alias",
    "source", "engine", "production_source", "window_start", "window_end", "status", "claim_token", "claimed_at",
    "heartbeat_at", "attempts", "started_at", "updated_at", "error", "target_ref", "drafter_kind", "drafter_ref",
    "target_hash", "draft_hash", "code_version", "config", "num_speculative_tokens", "device", "dtype",
    "target_adapter", "target_adapter_hash", "draft_adapter", "acceptance_rule", "method", "mlflow_logged"})


def _clear_results(s, row: ValidationRun) -> None:
    """Clear what an earlier attempt measured and concluded on ``row`` (metrics, timings, rule results, Evidently,
    MLflow run, per-prompt rows): a retried row shows none of the previous attempt's numbers while it runs, nor
    after it ends in an error or a crash."""
    for name in ValidationRun.__table__.columns.keys():
        if name not in _KEPT_ON_RETRY:
            setattr(row, name, None)
    row.mlflow_logged = False
    s.execute(delete(PromptRow).where(PromptRow.run_id == row.id))


def store_now(s) -> dt.datetime:
    """The clock claims and heartbeats are written and compared on (UTC, aware): on PostgreSQL the server's
    own (``now()``), one clock for every host sharing the store, so a host whose clock is an hour ahead
    neither blocks a dead claim for that hour nor loses a live one; on another store (SQLite: one host's
    file) this process's."""
    if s.get_bind().dialect.name != "postgresql":
        return utcnow()
    value = s.scalar(select(func.now()))
    return value.astimezone(dt.timezone.utc) if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)


def _owned_row(s, claim: Claim) -> ValidationRun:
    row = s.get(ValidationRun, claim.run_id, with_for_update=True)
    if row is None or row.claim_token != claim.token or row.status != RUNNING:
        raise RunAlreadyClaimed(claim.key, claim.run_id, row.claimed_at if row else None,
                                "claim lost (taken over after going stale, or already finished)")
    return row


def heartbeat(db: Database, claim: Claim, *, now: dt.datetime | None = None) -> None:
    """Refresh the claim so long validations are not considered stale.

    Raises:
        RunAlreadyClaimed: the claim was lost.
    """
    with db.session() as s:
        row = _owned_row(s, claim)
        row.heartbeat_at = row.updated_at = now or store_now(s)


def record_run(
    db: Database, report: ValidationReport, key: RunKey, lineage: Lineage, *,
    claim: Claim | None = None, alias: str | None = None, now: dt.datetime | None = None,
) -> int:
    """Write the nightly ``report`` into the row of ``key``: :func:`upsert` of :func:`record_of`.

    Args:
        report: the validation report (``report.prompts`` are stored one row each).
        key: the idempotency key (its config hash is what identifies the row; ``report.config`` is
            stored as the config JSON). lineage: weight hashes and versions.
        claim / alias / now: as :func:`upsert`.
    Returns:
        The run id (primary key of ``validation_runs``).
    Raises:
        RunAlreadyClaimed: the claim was lost, or (without a claim) another run holds the key.
        ValueError: duplicate prompt ids in the report.
    """
    return upsert(db, record_of(report, key, lineage, alias=alias), claim=claim, now=now)


def same_origin(source: str, engine: str | None, production_source: str | None) -> list:
    """The WHERE clauses of rows from the same origin: ``source``, ``engine`` and ``production_source`` equal
    (``NULL`` matching ``NULL``)."""
    r = ValidationRun
    return [r.source == source, r.engine.is_(None) if engine is None else r.engine == engine,
            r.production_source.is_(None) if production_source is None else r.production_source == production_source]


def _origin_of(row: ValidationRun) -> list:
    """:func:`same_origin` of ``row``."""
    return same_origin(row.source, row.engine, row.production_source)


def _find_row(s, rec: RunRecord) -> ValidationRun | None:
    """The row of ``rec``'s identity, locked (see :class:`RunRecord` for a production window's)."""
    r, k = ValidationRun, rec.key
    origin = same_origin(rec.source, rec.engine, rec.production_source)
    if rec.window_end is None:
        where = [*origin, *k._where()]
    else:
        where = [*origin, r.pair_name == k.pair_name, r.heldout_name == k.heldout_name,
                 r.heldout_version == k.heldout_version, r.config_hash == k.config_hash]
    return s.scalars(select(r).where(*where).order_by(r.id.desc()).limit(1).with_for_update()).first()


def _new_row(rec: RunRecord, now: dt.datetime) -> ValidationRun:
    key = {k: v for k, v in asdict(rec.key).items() if k != "alias"}
    return ValidationRun(**key, alias=rec.key.alias or rec.alias, source=rec.source, started_at=now, attempts=0,
                         mlflow_logged=False)


def upsert(db: Database, record: RunRecord, *, claim: Claim | None = None, now: dt.datetime | None = None) -> int:
    """The one writer of ``validation_runs``: insert or update the row of ``record`` and replace its prompts.

    Status becomes ``completed`` (the rules later set passed/failed/inconclusive), the claim is
    released, the previous evaluation, Evidently report and MLflow run are cleared (the nightly logs
    its MLflow run after this call). ``attempts``: a nightly row counts them when claimed
    (:func:`claim_run`), a row of any other source on each write.

    Args:
        record: the row (:class:`RunRecord`). claim: the :class:`Claim` from :func:`claim_run`;
            without one, a row held by a live ``running`` claim is refused. now: injected clock (UTC).
    Returns:
        The row id.
    Raises:
        RunAlreadyClaimed: the claim was lost, or (without a claim) another run holds the row.
        ValueError: duplicate prompt ids in ``record.prompts``.
    """
    now = now or utcnow()
    values = _metric_columns(record)
    for attempt in range(2):
        try:
            with db.session() as s:
                row = _owned_row(s, claim) if claim is not None else _find_row(s, record)
                if claim is None and row is not None and row.status == RUNNING:
                    raise RunAlreadyClaimed(record.key, row.id, row.claimed_at, "held by a running claim")
                new = row is None
                if new:
                    row = _new_row(record, now)
                    s.add(row)
                    s.flush()
                counted = claim is None and (new or record.source != NIGHTLY)
                _write(s, row, record, values, now, counted=counted)
                return row.id
        except IntegrityError:
            if attempt or claim is not None:
                raise
    raise AssertionError("unreachable")


def _write(s, row: ValidationRun, rec: RunRecord, values: dict[str, Any], now: dt.datetime, *, counted: bool) -> None:
    """Set ``row`` from ``rec`` (``values``: its columns); ``counted``: one more attempt."""
    for k, v in values.items():
        setattr(row, k, v)
    if rec.key.alias or rec.alias is not None:  # a keyed alias is the row's identity: never replaced by another
        row.alias = rec.key.alias or rec.alias
    row.attempts = (row.attempts or 0) + counted
    row.status, row.claim_token, row.error = COMPLETED, None, None
    row.finished_at = row.updated_at = now
    row.mlflow_logged, row.mlflow_run_id = False, None
    row.rule_results = row.root_cause_hint = row.baseline_run_id = None
    row.evidently_html = row.evidently_json = row.evidently_verdict = None
    s.execute(delete(PromptRow).where(PromptRow.run_id == row.id))
    s.add_all(_prompt_rows(row.id, rec.prompts))


def mark_error(db: Database, claim: Claim, message: str, *, now: dt.datetime | None = None) -> None:
    """Record that the validation failed (status ``error``); the key can be re-claimed later.

    Does nothing if the claim was already lost (the new holder owns the row).
    """
    now = now or utcnow()
    with db.session() as s:
        row = s.get(ValidationRun, claim.run_id, with_for_update=True)
        if row is None or row.claim_token != claim.token:
            return
        row.status, row.claim_token, row.error = ERROR, None, message[:4000]
        row.finished_at = row.updated_at = now


def mark_crashed(db: Database, run_id: int, token: str, reason: str, *, now: dt.datetime | None = None) -> bool:
    """Record that the process holding claim ``token`` on row ``run_id`` died (status ``crashed``, ``reason`` as
    its error; the row can be claimed again). Returns whether the row was still ``running`` under that claim
    (a row another process took over, or that ended, is left alone)."""
    with db.session() as s:
        row = s.get(ValidationRun, run_id, with_for_update=True)
        if row is None or row.claim_token != token or row.status != RUNNING:
            return False
        row.status, row.claim_token, row.error = CRASHED, None, reason[:4000]
        row.finished_at = row.updated_at = now or store_now(s)
        return True


def crash_stale_runs(db: Database, *, stale_after_s: float, now: dt.datetime | None = None) -> list[int]:
    """Mark ``crashed`` every nightly row still ``running`` whose heartbeat is older than ``stale_after_s``
    seconds (its process died on any host: nothing refreshes it); the reason names the last heartbeat.
    Returns the ids marked."""
    with db.session() as s:
        now = now or store_now(s)
        r = ValidationRun
        rows = s.scalars(select(r).where(r.source == NIGHTLY, r.status == RUNNING).with_for_update()).all()
        marked = []
        for row in rows:
            beat = row.heartbeat_at or row.claimed_at
            if beat is not None and (now - beat).total_seconds() >= stale_after_s:
                row.status, row.claim_token = CRASHED, None
                row.error = (f"its process stopped refreshing the claim at {beat:%Y-%m-%d %H:%M} UTC (killed, or its "
                             f"host lost) and nothing was recorded; marked by a later nightly run")
                row.finished_at = row.updated_at = now
                marked.append(row.id)
        return marked


def set_evaluation(
    db: Database, run_id: int, *, status: str, rule_results: list[dict], root_cause_hint: str | None,
    baseline_run_id: int | None,
) -> None:
    """Store the drift-rule outcome of a run (status passed/failed/inconclusive)."""
    with db.session() as s:
        row = s.get(ValidationRun, run_id, with_for_update=True)
        if row is None:
            raise KeyError(f"no validation run {run_id}")
        row.status, row.rule_results = status, nan_to_none(rule_results)
        row.root_cause_hint, row.baseline_run_id = root_cause_hint, baseline_run_id
        row.updated_at = utcnow()


def attach_evidently(db: Database, run_id: int, *, html_path: str, json_path: str,
                     verdict: dict[str, Any]) -> None:
    """Store the paths of a run's Evidently report and the verdict read from its JSON."""
    with db.session() as s:
        row = s.get(ValidationRun, run_id, with_for_update=True)
        if row is None:
            raise KeyError(f"no validation run {run_id}")
        row.evidently_html, row.evidently_json = str(html_path), str(json_path)
        row.evidently_verdict = nan_to_none(verdict)


def mark_mlflow_logged(db: Database, run_id: int, mlflow_run_id: str) -> None:
    """Record the MLflow run id of a history row and set ``mlflow_logged``."""
    with db.session() as s:
        row = s.get(ValidationRun, run_id, with_for_update=True)
        if row is None:
            raise KeyError(f"no validation run {run_id}")
        row.mlflow_run_id, row.mlflow_logged, row.updated_at = mlflow_run_id, True, utcnow()


def runs_pending_mlflow(db: Database, pair_name: str | None = None) -> list[ValidationRun]:
    """Finished nightly runs (not running, not error) not yet logged to MLflow (production never is), oldest first."""
    with db.session() as s:
        q = select(ValidationRun).where(
            ValidationRun.mlflow_logged.is_(False), ValidationRun.status.notin_((RUNNING, ERROR, CRASHED)),
            ValidationRun.source == NIGHTLY,
        )
        if pair_name:
            q = q.where(ValidationRun.pair_name == pair_name)
        return list(s.scalars(q.order_by(ValidationRun.id)))


def get_run(db: Database, run_id: int) -> ValidationRun | None:
    """The run row (detached, read-only) or ``None``."""
    with db.session() as s:
        return s.get(ValidationRun, run_id)


def find_run(db: Database, key: RunKey) -> ValidationRun | None:
    """The nightly row of ``key`` (detached, read-only) or ``None``; lets the flow skip finished work."""
    with db.session() as s:
        r = ValidationRun
        return s.scalars(select(r).where(r.source == NIGHTLY, *key._where()).order_by(r.id.desc()).limit(1)).first()


def list_runs(db: Database, *, pair_name: str | None = None, limit: int = 20,
              source: str | None = None, engine: str | None = None) -> list[ValidationRun]:
    """Most recent runs first (by scheduled date, then production window end, then id); detached
    rows. ``source``: only ``nightly``, ``production`` or ``engine`` rows (all when ``None``);
    ``engine``: only rows of that serving engine."""
    with db.session() as s:
        r = ValidationRun
        q = select(r).where(*([r.pair_name == pair_name] if pair_name else []), *([r.source == source] if source else []),
                            *([r.engine == engine] if engine else []))
        q = q.order_by(r.scheduled_date.desc(), r.window_end.desc().nulls_last(), r.id.desc()).limit(limit)
        return list(s.scalars(q))


def newer_evaluated_run(db: Database, run_id: int, *, alias: str | None = None) -> ValidationRun | None:
    """A run of the same pair and origin (:func:`same_origin`) scheduled *after* run ``run_id`` that was already evaluated
    (passed/failed/inconclusive), restricted to ``alias`` when given; else ``None``.

    Used to keep a late retry of an older nightly run from reopening or resolving incidents.
    """
    with db.session() as s:
        cur = s.get(ValidationRun, run_id)
        if cur is None:
            raise KeyError(f"no validation run {run_id}")
        r = ValidationRun
        q = select(r).where(r.pair_name == cur.pair_name, r.scheduled_date > cur.scheduled_date,
                            r.status.in_((PASSED, FAILED, INCONCLUSIVE)), *_origin_of(cur))
        if alias:
            q = q.where(r.alias == alias)
        return s.scalars(q.order_by(r.scheduled_date.desc()).limit(1)).first()


def find_baseline(
    db: Database, run_id: int, *, champion_version: str | int | None = None,
    champion_alias: str = "champion", same_config: bool = True,
) -> ValidationRun | None:
    """The last *passing* run of the current champion before run ``run_id`` (passed, or inconclusive
    only because its speed was timed on a busy machine: :func:`monitoring.rules.speed_only_inconclusive`).

    With ``champion_version`` the champion is that pair version of the same pair; otherwise it is
    any run of the same pair whose ``alias`` column is ``champion_alias``. Only runs on the same
    held-out set name (any version) and, with ``same_config``, the same config hash (same k,
    temperature, ...) qualify, since the acceptance rate depends on them. The run itself, runs
    scheduled after it and runs of another origin (``source``, ``engine``, ``production_source``) are excluded.
    """
    with db.session() as s:
        cur = s.get(ValidationRun, run_id)
        if cur is None:
            raise KeyError(f"no validation run {run_id}")
        r = ValidationRun
        q = select(r).where(
            r.pair_name == cur.pair_name, r.status.in_((PASSED, INCONCLUSIVE)), r.id != cur.id,
            r.heldout_name == cur.heldout_name, r.scheduled_date <= cur.scheduled_date, *_origin_of(cur),
        )
        if champion_version is not None:
            q = q.where(r.pair_version == str(champion_version))
        else:
            q = q.where(r.alias == champion_alias)
        if same_config:
            q = q.where(r.config_hash == cur.config_hash)
        q = q.order_by(r.scheduled_date.desc(), r.finished_at.desc(), r.id.desc()).limit(50)
        return next((x for x in s.scalars(q) if x.status == PASSED or speed_only_inconclusive(x.rule_results)), None)


def snapshot(db: Database, run_id: int) -> RunSnapshot:
    """The stored metrics and lineage of a run as a :class:`RunSnapshot`.

    Raises:
        KeyError: no such run. ValueError: the run has no recorded metrics yet.
    """
    row = get_run(db, run_id)
    if row is None:
        raise KeyError(f"no validation run {run_id}")
    return snapshot_of(row)


def snapshot_of(row: ValidationRun) -> RunSnapshot:
    """:class:`RunSnapshot` of a (detached) run row."""
    if row.overall is None:
        raise ValueError(f"validation run {row.id} has no recorded metrics (status {row.status})")
    return RunSnapshot(
        overall=group_metrics_from_dict(row.overall),
        categories={k: group_metrics_from_dict(v) for k, v in (row.categories or {}).items()},
        lineage=Lineage(row.target_hash, row.draft_hash, row.heldout_version, row.code_version, row.target_adapter,
                        row.target_adapter_hash),
        run_id=row.id, pair_name=row.pair_name, pair_version=row.pair_version,
        scheduled_date=row.scheduled_date, acceptance_rule=row.acceptance_rule,
    )


_PR_FIELDS = {f.name: f.type for f in fields(PromptResult)}


def prompt_results(db: Database, run_id: int) -> list[PromptResult]:
    """The per-prompt rows of a run as :class:`specdec.validation.report.PromptResult` (NULL -> nan)."""
    with db.session() as s:
        rows = list(s.scalars(select(PromptRow).where(PromptRow.run_id == run_id).order_by(PromptRow.id)))
        out = []
        for r in rows:
            src = dict(r.data or {})
            d = {name: src.get(name, getattr(r, name, None)) for name in _PR_FIELDS
                 if name in src or hasattr(r, name)}
            for name, typ in _PR_FIELDS.items():
                if typ == "float" and name in d:
                    d[name] = none_to_nan(d[name])
            out.append(PromptResult(**d))
        return out


def trend_points(db: Database, pair: str, *, limit: int = 500, exclude_run: int | None = None) -> list[dict[str, Any]]:
    """Acceptance trend of ``pair`` from both sources, oldest first, as plain dicts for
    :func:`registry.plots.plot_trend`: ``time`` (production: window end; nightly: finish time, else
    the scheduled date), ``acceptance_rate``, ``acceptance_rate_ci_low``, ``per_token_acceptance``,
    ``per_token_acceptance_ci_low``, ``pair_version``, ``source`` (:func:`source_label`),
    ``run_id`` (history row), and the measured ``speedup`` / ``speedup_ci_low`` / ``speedup_ci_high`` /
    ``predicted_speedup`` (``None`` where not measured). The history store is the one source of the
    trend plots (the nightly hands these points to its MLflow run). ``exclude_run``: leave out that row
    (the run being logged adds its own point)."""
    rows = [r for r in list_runs(db, pair_name=pair, limit=limit) if r.id != exclude_run]
    pts = []
    for r in rows:
        if r.acceptance_rate is None:
            continue
        if r.source == PRODUCTION:
            t = r.window_end
        else:
            t = r.finished_at or dt.datetime.combine(r.scheduled_date, dt.time(), dt.timezone.utc)
        pts.append({"time": t, "acceptance_rate": r.acceptance_rate,
                    "acceptance_rate_ci_low": r.acceptance_rate_ci_low, "per_token_acceptance": r.per_token_acceptance,
                    "per_token_acceptance_ci_low": r.per_token_acceptance_ci_low, "pair_version": r.pair_version,
                    "source": source_label(r.source, r.engine), "run_id": r.id, "speedup": r.speedup, "speedup_ci_low": r.speedup_ci_low,
                    "speedup_ci_high": r.speedup_ci_high, "predicted_speedup": r.predicted_speedup,
                    "night": None if r.source == PRODUCTION else r.scheduled_date.isoformat()})
    return sorted(pts, key=lambda p: (p["time"], p["run_id"]))
