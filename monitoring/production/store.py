"""Production rows in the history store: one ``validation_runs`` row per (pair, source, model,
window), ``source = production``; the last direct scrape per source; the lookups the production
rules need (previous passing window, nightly champion run).

Row layout (so the nightly queries never see production rows and vice versa, and a re-ingested
window updates its own row):

* ``production_source`` = the source name, ``engine`` = its serving engine, ``heldout_name`` = the model
  label (``-`` without one), ``window_start`` / ``window_end`` the window, ``heldout_version`` = the
  window end's label (``YYYY-MM-DDTHH:MM:SS.mmmZ``, part of the unique key; never parsed),
  ``scheduled_date`` = the window end's UTC date;
* ``config`` / ``config_hash``: source, engine, model label, window length, k;
* ``alias``: the alias production serves (from the mapping), ``pair_version``: the version it
  pointed at when the window was ingested (``"unknown"`` if unresolved).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from monitoring import history
from monitoring.production.invariants import check_rates
from monitoring.db import (
    FAILED,
    INCONCLUSIVE,
    NIGHTLY,
    PASSED,
    PRODUCTION,
    Database,
    ProductionScrape,
    ValidationRun,
    utcnow,
)
from monitoring.production.sources import Scrape
from specdec.validation.report import GroupMetrics, nan_to_none

EVALUATED = (PASSED, FAILED, INCONCLUSIVE)


def heldout_name(model: str) -> str:
    """The model label, ``-`` without one (at most 200 characters, the column size)."""
    return (model or "-")[:200]


def window_label(end: dt.datetime) -> str:
    """The window end as ``YYYY-MM-DDTHH:MM:SS.mmmZ`` (UTC, milliseconds), the row's ``heldout_version``."""
    u = end.astimezone(dt.timezone.utc)
    return u.strftime("%Y-%m-%dT%H:%M:%S.") + f"{u.microsecond // 1000:03d}Z"


class ImpossibleMetrics(ValueError):
    """A window's metrics that cannot be true (a rate outside [0, 1], a CI with lower > upper)."""


@dataclass(frozen=True)
class Window:
    """One production window of one served model: what :func:`record_window` stores.

    Attributes:
        pair / version / alias: the registered pair serving this model, the version its alias
            pointed at (``None`` -> ``"unknown"``), and the alias.
        source / engine / model: where the counters came from. start / end: the window (aware UTC).
        metrics: :func:`monitoring.production.counters.window_metrics`. config: what identifies the
            measurement (hashed; must not contain secrets). code_version: the ingesting code's version.
    """

    pair: str
    version: str | None
    alias: str
    source: str
    engine: str
    model: str
    start: dt.datetime
    end: dt.datetime
    metrics: GroupMetrics
    config: dict[str, Any]
    code_version: str | None = None


def window_record(w: Window, *, now: dt.datetime) -> history.RunRecord:
    """The :class:`monitoring.history.RunRecord` of window ``w`` (row layout: the module docstring)."""
    return history.RunRecord(
        source=PRODUCTION, engine=w.engine, production_source=w.source, key=history.RunKey(
            w.pair, str(w.version) if w.version is not None else "unknown", heldout_name(w.model),
            window_label(w.end), history.config_hash(w.config), w.end.astimezone(dt.timezone.utc).date()),
        overall=w.metrics, config=dict(w.config), alias=w.alias, window_start=w.start, window_end=w.end,
        target_ref=f"production:{w.engine}", drafter_kind=w.engine, code_version=w.code_version or "",
        wall_seconds=(w.end - w.start).total_seconds(), report_created_at=now.isoformat(),
    )


def record_window(db: Database, window: Window, *, now: dt.datetime | None = None) -> int:
    """Insert or update the production row of one window (idempotent per pair/source/model/window).

    Args:
        window: the :class:`Window`. now: injected clock (UTC).
    Returns:
        The row id (:func:`monitoring.history.upsert`). Status is ``completed`` until the rules are evaluated.
    Raises:
        ImpossibleMetrics: a rate outside [0, 1] or a CI with lower > upper (nothing written).
    """
    w = window
    try:
        check_rates(w.metrics, f"source {w.source}, model {w.model!r}")
    except ValueError as e:
        raise ImpossibleMetrics(str(e)) from None
    now = now or utcnow()
    return history.upsert(db, window_record(w, now=now), now=now)


def _sibling_window(db: Database, run_id: int, *, before: bool, statuses: tuple[str, ...]) -> ValidationRun | None:
    """The nearest production window of run ``run_id``'s pair, model and config, before or after it,
    whose status is in ``statuses``. Raises ``KeyError`` for an unknown run."""
    with db.session() as s:
        cur = s.get(ValidationRun, run_id)
        if cur is None:
            raise KeyError(f"no validation run {run_id}")
        r = ValidationRun
        side = r.window_end < cur.window_end if before else r.window_end > cur.window_end
        return s.scalars(select(r).where(
            *history.same_origin(PRODUCTION, cur.engine, cur.production_source), r.pair_name == cur.pair_name,
            r.heldout_name == cur.heldout_name,
            r.config_hash == cur.config_hash, r.status.in_(statuses), side,
        ).order_by(r.window_end.desc() if before else r.window_end).limit(1)).first()


def previous_passing_window(db: Database, run_id: int) -> ValidationRun | None:
    """The last *passing* window before run ``run_id`` of the same pair, source, model and config."""
    return _sibling_window(db, run_id, before=True, statuses=(PASSED,))


def newer_evaluated_window(db: Database, run_id: int) -> ValidationRun | None:
    """An already evaluated window *after* run ``run_id`` (same pair, source, model, config), if any:
    a late re-ingestion of an old window must not flip incidents."""
    return _sibling_window(db, run_id, before=False, statuses=tuple(EVALUATED))


def nightly_reference(db: Database, pair: str, version: str | None, alias: str) -> ValidationRun | None:
    """The nightly run production is compared with: the latest evaluated nightly run of ``pair``
    version ``version`` (any alias), or, when the version is unknown, of whatever ``alias`` pointed
    at. ``None`` when there is none."""
    with db.session() as s:
        r = ValidationRun
        q = select(r).where(r.source == NIGHTLY, r.pair_name == pair, r.status.in_(EVALUATED),
                            r.overall.is_not(None))
        q = q.where(r.pair_version == str(version)) if version not in (None, "unknown") else q.where(r.alias == alias)
        return s.scalars(q.order_by(r.scheduled_date.desc(), r.id.desc()).limit(1)).first()


def version_from_history(db: Database, pair: str, alias: str) -> str | None:
    """The pair version the latest nightly run validated under ``alias`` (a fallback when the
    registry cannot be asked)."""
    with db.session() as s:
        r = ValidationRun
        row = s.scalars(select(r).where(r.source == NIGHTLY, r.pair_name == pair, r.alias == alias)
                        .order_by(r.scheduled_date.desc(), r.id.desc()).limit(1)).first()
        return row.pair_version if row is not None else None


def load_scrape(db: Database, source: str) -> Scrape | None:
    """The last stored direct scrape of ``source`` (``None`` before the first)."""
    with db.session() as s:
        row = s.scalars(select(ProductionScrape).where(ProductionScrape.source == source)).one_or_none()
        if row is None:
            return None
        return Scrape(at=row.scraped_at, series=list(row.series or []), process_start_time=row.process_start_time)


def save_scrape(db: Database, source: str, engine: str, scrape: Scrape) -> None:
    """Store ``scrape`` as the last scrape of ``source`` (replacing the previous one)."""
    with db.session() as s:
        row = s.scalars(select(ProductionScrape).where(ProductionScrape.source == source)
                        .with_for_update()).one_or_none()
        if row is None:
            row = ProductionScrape(source=source, engine=engine)
            s.add(row)
        row.engine, row.scraped_at = engine, scrape.at
        row.process_start_time = scrape.process_start_time
        row.series = nan_to_none(scrape.series)
