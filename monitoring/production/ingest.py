"""Ingest one window of a production source: read counters, pool per model, map to a pair, record,
evaluate the rules, run the incident lifecycle.

::

    db = monitoring.connect(tree.monitoring)      # the settings tree built at the edge (a CLI, a flow)
    outcomes = ingest_window(db, source, start, end, settings=tree.production,
                             monitoring_settings=tree.monitoring)

Incidents: scope ``production:<source>`` for the health rules (one fire message, reminders at most
daily, one resolve), scope ``representativeness:<source>`` for the nightly comparison (opened when
it fires, resolved when it is consistent again, left alone while it cannot be judged).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from dataclasses import dataclass, field
from typing import Callable

import httpx

from monitoring import alerts, history
from monitoring.db import Database, utcnow
from monitoring.production import store
from monitoring.production.counters import pool_window, window_metrics
from monitoring.production.engines import engine_metrics
from monitoring.production.invariants import scrape_violations, window_violations
from monitoring.production.rules import evaluate_window
from monitoring.production.settings import ProductionSettings, ProductionSource, find_mapping
from monitoring.production.sources import query_raw_series, scrape_metrics, scrape_series
from specdec.redact import redact_url
from monitoring.rules import FIRING, OK, Evaluation
from monitoring.settings import MonitoringSettings

log = logging.getLogger(__name__)
VersionResolver = Callable[[str, str], "str | None"]


@dataclass
class WindowOutcome:
    """What happened to one (source, model) in one window.

    ``status``: the health verdict (``passed``/``failed``/``inconclusive``), or ``unmapped`` (no
    mapping for this model label), ``baseline`` (first direct scrape stored, no window yet),
    ``refused`` (the counters broke an invariant or the scrape was empty: nothing recorded; for a
    direct scrape the previous scrape stays the baseline, so the next good one covers this window).
    """

    source: str
    model: str
    status: str
    start: dt.datetime | None = None
    end: dt.datetime | None = None
    pair: str | None = None
    alias: str | None = None
    version: str | None = None
    run_id: int | None = None
    acceptance_rate: float | None = None
    acceptance_rate_ci: list[float] = field(default_factory=list)
    mean_accepted_length: float | None = None
    num_drafts: int | None = None
    num_draft_tokens: int | None = None
    resets: int = 0
    representativeness: str | None = None
    health_transition: str | None = None
    representativeness_transition: str | None = None
    message: str = ""
    per_token_acceptance: float | None = None  # the floor's metric (docs/metrics.md "Per-token acceptance")
    per_token_acceptance_ci: list[float] = field(default_factory=list)


def _num(x) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def _resolve(pair: str, alias: str, pinned: str | None, resolver: VersionResolver | None, db: Database) -> str | None:
    if pinned:
        return str(pinned)
    if resolver is not None:
        try:
            v = resolver(pair, alias)
            if v is not None:
                return str(v)
        except Exception as e:  # noqa: BLE001 (resolve_version is the caller's function (MLflow): whatever it raises, fall back to what the nightly runs saw)
            log.warning("cannot resolve %s@%s from the registry (%s: %s); using the history store",
                        pair, alias, type(e).__name__, e)
    return store.version_from_history(db, pair, alias)


def _single(scrape, eng) -> list:
    """One scrape as one-sample series (for the per-scrape invariants of a first scrape)."""
    from monitoring.production.sources import Scrape

    return scrape_series(Scrape(at=scrape.at, series=[], process_start_time=None), scrape, eng)


def _refuse(source: str, bad: dict[str, list[str]], start: dt.datetime | None,
            end: dt.datetime | None) -> list[WindowOutcome]:
    """One error line per broken invariant, one ``refused`` outcome per model."""
    out = []
    for model, lines in sorted(bad.items()):
        for line in lines:
            log.error("source %s: refused, nothing recorded: %s", source, line)
        more = f" (+{len(lines) - 1} more, see the log)" if len(lines) > 1 else ""
        out.append(WindowOutcome(source, model, "refused", start, end, message=f"refused: {lines[0]}{more}"))
    return out


def alert_window(db: Database, ev: Evaluation, *, source: str, settings: MonitoringSettings,
                 now: dt.datetime | None = None, client: httpx.Client | None = None,
                 links: dict[str, str] | None = None) -> tuple[str | None, str | None]:
    """Incident lifecycle for an evaluated window; returns ``(health transition, representativeness
    transition)`` (``fire``/``remind-<n>``/``resolve``/``None``). A window older than an already
    evaluated one changes no incident (pending deliveries are still sent)."""
    row = history.get_run(db, ev.run_id)
    if store.newer_evaluated_window(db, ev.run_id) is not None:
        log.info("window %s is older than an evaluated window: incidents left as they are", row.heldout_version)
        alerts.deliver_pending(db, settings=settings, now=now, client=client)
        return None, None
    where = f"production {source}, model {row.heldout_name}, window " \
            f"{row.window_start:%Y-%m-%d %H:%M}-{row.window_end:%H:%M} UTC"
    common = dict(pair_name=row.pair_name, pair_version=row.pair_version, run_id=row.id, alias=row.alias,
                  heldout=where, num_speculative_tokens=row.num_speculative_tokens, links=dict(links or {}))
    health = alerts.process(db, alerts.AlertContext(scope=f"production:{source}", baseline=ev.baseline_label,
                                                    root_cause_hint=ev.root_cause_hint, **common),
                            ev.results, settings=settings, now=now, client=client)
    rep = ev.representativeness
    rep_transition = None
    if rep.status in (FIRING, OK):  # not judged (no nightly run, too few tokens): leave it alone
        ctx = alerts.AlertContext(scope=f"representativeness:{source}", baseline=ev.nightly_label,
                                  root_cause_hint=rep.message, **common)
        rep_transition = alerts.process(db, ctx, [rep], settings=settings, now=now, client=client).transition
    return health.transition, rep_transition


@dataclass
class _ReadWindow:
    """One window read from a source: its series, bounds (aware datetimes), length in seconds, and, for a
    ``metrics`` source, the scrape to store as the next baseline once the window is recorded."""

    series: list
    start: dt.datetime
    end: dt.datetime
    seconds: int
    scrape: object | None = None


def _read_window(db: Database, source: ProductionSource, start: dt.datetime | None, end: dt.datetime | None, *,
                 settings: ProductionSettings, client: httpx.Client | None,
                 now: dt.datetime | None) -> _ReadWindow | list[WindowOutcome]:
    """Read :func:`ingest_window`'s window: ``prometheus``: the range ``(start, end]``; ``metrics``: scrape now
    and diff against the stored previous scrape. Returns the outcomes instead when the run ends here (a first
    scrape stored as the baseline; an empty or invariant-breaking first scrape refused). Raises ``ValueError``
    for a prometheus source without bounds, ``ProductionSourceError`` when the source cannot be read."""
    eng = engine_metrics(source.engine)
    if source.kind == "prometheus":
        if start is None or end is None:
            raise ValueError("a prometheus source needs the window's start and end")
        series = query_raw_series(source.url, eng, start, end, lookback_s=settings.lookback_minutes * 60.0,
                                  selector=source.selector, timeout_s=settings.timeout_s, client=client)
        return _ReadWindow(series, start, end, int(round((end - start).total_seconds())))
    current = scrape_metrics(source.url, eng, timeout_s=settings.timeout_s, client=client, now=now)
    if not current.series:
        return _refuse(source.name, {"": [f"empty scrape of {redact_url(source.url)}: no {source.engine} "
                                          "speculative-decoding series; the previous scrape stays the baseline"]},
                       None, current.at)
    previous = store.load_scrape(db, source.name)
    if previous is None or previous.at >= current.at:
        bad = scrape_violations(_single(current, eng))
        if bad:  # not a baseline either
            return _refuse(source.name, bad, None, current.at)
        store.save_scrape(db, source.name, source.engine, current)
        log.info("source %s: first scrape of %s stored; the next run ingests a window",
                 source.name, redact_url(source.url))
        return [WindowOutcome(source.name, "", "baseline", end=current.at,
                              message="first scrape stored as the baseline of the next window")]
    return _ReadWindow(scrape_series(previous, current, eng), previous.at, current.at,
                       int(round(settings.window_minutes * 60)), current)


def ingest_window(
    db: Database, source: ProductionSource, start: dt.datetime | None = None, end: dt.datetime | None = None, *,
    settings: ProductionSettings, monitoring_settings: MonitoringSettings,
    resolve_version: VersionResolver | None = None, alert: bool = True, code_version: str | None = None,
    now: dt.datetime | None = None, client: httpx.Client | None = None,
) -> list[WindowOutcome]:
    """Read one window of ``source``, record one production row per mapped model, evaluate, alert.

    The protocol, in the order it must happen: read (:func:`_read_window`), refuse what breaks the counter
    invariants before anything is written, map, record, evaluate, alert.

    Args:
        db: history store. source: where to read (``prometheus``: the window ``(start, end]``;
            ``metrics``: scrape now; the window runs from the previous stored scrape to this one,
            and the very first scrape only stores a baseline).
        start / end: window bounds (aware datetimes) for ``prometheus`` sources.
        settings: mappings, lookback, timeouts. monitoring_settings: rules, alert channels.
        resolve_version: ``(pair, alias) -> version`` (e.g. the MLflow registry); without it, or
            when it fails, the version the latest nightly run saw under that alias is used.
        alert: run the incident lifecycle (else only record and evaluate).
    Returns:
        One :class:`WindowOutcome` per model seen (mapped or not).
    Raises:
        monitoring.production.sources.ProductionSourceError: the source could not be read (nothing
            is written). ValueError: bad window or selector.
    """
    read = _read_window(db, source, start, end, settings=settings, client=client, now=now)
    if isinstance(read, list):  # a first scrape stored as the baseline, or an empty or broken one refused
        return read
    series, start, end, window_s, current_scrape = read.series, read.start, read.end, read.seconds, read.scrape
    bad = scrape_violations(series)
    pooled = pool_window([x for x in series if x.model not in bad], start.timestamp(), end.timestamp())
    bad.update({m: v for m, wc in pooled.items() if (v := window_violations(wc))})
    if bad and current_scrape is not None:  # not saved: the next good scrape covers this window
        return _refuse(source.name, bad, start, end)
    out: list[WindowOutcome] = _refuse(source.name, bad, start, end) if bad else []
    pooled = {m: wc for m, wc in pooled.items() if m not in bad}
    for model, wc in sorted(pooled.items()):
        mapping = find_mapping(settings.mappings, source.name, model)
        if mapping is None:
            log.warning("source %s: no mapping for model %r; skipped (add one to SPECDEC_PRODUCTION_MAPPINGS)",
                        source.name, model)
            out.append(WindowOutcome(source.name, model, "unmapped", start, end,
                                     message="no (source, model) -> pair mapping"))
            continue
        version = _resolve(mapping.pair, mapping.alias, mapping.version, resolve_version, db)
        g = window_metrics(wc, mapping.num_speculative_tokens)
        config = {"source": source.name, "engine": source.engine, "model": model, "window_seconds": window_s,
                  "num_speculative_tokens": g.num_speculative_tokens or None}
        try:
            run_id = store.record_window(db, store.Window(
                pair=mapping.pair, version=version, alias=mapping.alias, source=source.name, engine=source.engine,
                model=model, start=start, end=end, metrics=g, config=config, code_version=code_version), now=now)
        except store.ImpossibleMetrics as e:
            out += _refuse(source.name, {model: [str(e)]}, start, end)
            continue
        ev = evaluate_window(db, run_id, settings=monitoring_settings)
        ht = rt = None
        if alert:
            ht, rt = alert_window(db, ev, source=source.name, settings=monitoring_settings,
                                  now=now or utcnow(), client=client)
        fired = [r.message for r in ev.firing]
        out.append(WindowOutcome(
            source.name, model, ev.verdict, start, end, mapping.pair, mapping.alias, version, run_id,
            _num(g.acceptance_rate), [x for x in map(_num, g.acceptance_rate_ci) if x is not None],
            _num(g.mean_accepted_length), wc.num_drafts, wc.num_draft_tokens, wc.resets,
            ev.representativeness.status, ht, rt, "; ".join(fired) or ev.representativeness.message,
            _num(g.per_token_acceptance), [x for x in map(_num, g.per_token_acceptance_ci) if x is not None],
        ))
    if current_scrape is not None:  # only now: a failure above re-reads this window next time
        store.save_scrape(db, source.name, source.engine, current_scrape)
    return out
