"""Read a serving engine's speculative-decoding series: a direct ``/metrics`` scrape, or raw
samples from a Prometheus server's HTTP query API.

The exposition text is parsed with ``prometheus_client.parser.text_string_to_metric_families``
(no hand-written parser). Prometheus is asked for *raw samples* (an instant query of a range
vector, ``{__name__=~"..."}[Ns]``, ``GET /api/v1/query``) rather than ``increase()``, which
extrapolates to the window edges and returns non-integer counts; the reset-aware deltas are then
computed exactly by :mod:`monitoring.production.counters`.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from monitoring.production.counters import SeriesData
from monitoring.production.engines import PER_POSITION, EngineMetrics
from monitoring.production.restarts import infer_restarts
from monitoring.redact import redact_text
from specdec.engines.http import MAX_BODY_BYTES, Fetched, read_within  # noqa: F401 (MAX_BODY_BYTES, Fetched: re-exported)
from specdec.redact import redact_url

log = logging.getLogger(__name__)
PROCESS_START = "process_start_time_seconds"
# label matchers a user may add to the Prometheus query: name="v", name!="v", name=~"re", name!~"re"
_SELECTOR_RE = re.compile(r'^\s*([a-zA-Z_][a-zA-Z0-9_]*\s*(=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"\s*(,\s*|$))*$')


class ProductionSourceError(RuntimeError):
    """A production source could not be read (unreachable, HTTP error, malformed answer). The
    message names the source by scheme and host only."""


@dataclass
class Scrape:
    """One direct ``/metrics`` scrape: when (``at``, UTC), the engine's series as plain dicts
    (``{"name", "labels", "value", "created"}``; ``created`` from the matching ``_created`` sample
    or ``None``), and the process start time (unix seconds) when exported."""

    at: dt.datetime
    series: list[dict[str, Any]] = field(default_factory=list)
    process_start_time: float | None = None


def fetch_within(client: httpx.Client, url: str, *, timeout_s: float, **kw) -> Fetched:
    """GET ``url`` and read the whole body within ``timeout_s`` seconds overall
    (:func:`specdec.engines.http.read_within`: one deadline for the whole request, not per read).

    Raises:
        httpx.HTTPError: from httpx (unreachable, protocol errors).
        TimeoutError: the answer was not complete by the deadline, or exceeded :data:`MAX_BODY_BYTES`.
    """
    return read_within(client, "GET", url, timeout_s=timeout_s, **kw)


def _key(labels: dict[str, str]) -> tuple:
    return tuple(sorted(labels.items()))


def parse_exposition(text: str, engine: EngineMetrics) -> tuple[list[dict[str, Any]], float | None]:
    """The engine's speculative-decoding series in a Prometheus text exposition.

    Args:
        text: ``/metrics`` body (text format 0.0.4 or OpenMetrics text).
        engine: which names to keep.
    Returns:
        ``(series, process_start_time)``: series dicts ``{"name": role-bearing sample name,
        "labels", "value", "created"}`` for counters (``_total`` samples) and gauges.
    Raises:
        ProductionSourceError: the text does not parse.
    """
    values: dict[tuple, dict[str, Any]] = {}
    created: dict[tuple, float] = {}
    start = None
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == PROCESS_START:
                    start = float(s.value)
                    continue
                kind = engine.role_of(s.name)
                if kind is None:
                    continue
                k = (kind[1], _key(s.labels))
                if kind[0] == "created":
                    created[k] = float(s.value)
                else:
                    values[k] = {"name": s.name, "role": kind[1], "labels": dict(s.labels),
                                 "value": float(s.value), "gauge": kind[0] == "gauge"}
    except ValueError as e:
        raise ProductionSourceError(f"malformed Prometheus exposition: {e}") from None
    out = []
    for k, v in values.items():
        v["created"] = created.get(k)
        out.append(v)
    return out, start


def scrape_metrics(url: str, engine: EngineMetrics, *, timeout_s: float = 10.0,
                   client: httpx.Client | None = None, now: dt.datetime | None = None) -> Scrape:
    """GET a ``/metrics`` endpoint and keep the engine's speculative-decoding series.

    ``timeout_s`` bounds the whole request (:func:`fetch_within`), not each read.

    Raises:
        ProductionSourceError: unreachable, non-2xx, unparsable, or not complete within the deadline.
    """
    own = client is None
    client = client or httpx.Client(timeout=timeout_s)
    try:
        resp = fetch_within(client, url, timeout_s=timeout_s, headers={"Accept": "text/plain"})
        at = now or dt.datetime.now(dt.timezone.utc)
        if resp.status_code >= 400:
            raise ProductionSourceError(f"{redact_url(url)} answered HTTP {resp.status_code}")
        series, start = parse_exposition(resp.text, engine)
    except (httpx.HTTPError, TimeoutError) as e:
        raise ProductionSourceError(f"cannot scrape {redact_url(url)}: {type(e).__name__}: "
                                    f"{redact_text(str(e))}") from None
    finally:
        if own:
            client.close()
    return Scrape(at=at, series=series, process_start_time=start)


def _model_of(labels: dict[str, str], engine: EngineMetrics) -> str:
    return labels.get(engine.model_label, "") if engine.model_label else ""


def _target(labels: dict[str, str], engine: EngineMetrics) -> tuple:
    """The exporting process of a series: its labels without the per-position label."""
    return _key({k: v for k, v in labels.items() if k != engine.position_label})


def _position(labels: dict[str, str], engine: EngineMetrics, role: str) -> int | None:
    if role != PER_POSITION:
        return None
    try:
        return int(labels[engine.position_label])
    except (KeyError, ValueError):
        return None


def scrape_series(previous: Scrape, current: Scrape, engine: EngineMetrics) -> list[SeriesData]:
    """Two scrapes of the same endpoint as two-sample series (for a window ``(previous.at,
    current.at]``). A changed process start time is passed on as a reset marker; without any
    creation time (llama.cpp) restarts and not-yet-exported series are inferred
    (:mod:`monitoring.production.restarts`)."""
    t0, t1 = previous.at.timestamp(), current.at.timestamp()
    prev = {(s["role"], _key(s["labels"])): s for s in previous.series}
    out = []
    for s in current.series:
        k = (s["role"], _key(s["labels"]))
        old = prev.get(k)
        samples = [(t1, s["value"])] if old is None else [(t0, old["value"]), (t1, s["value"])]
        created = {}
        for t, src, pst in ((t0, old, previous.process_start_time), (t1, s, current.process_start_time)):
            c = (src or {}).get("created")
            c = c if c is not None else pst
            if src is not None and c is not None:
                created[t] = c
        out.append((_target(s["labels"], engine),
                    SeriesData(role=s["role"], model=_model_of(s["labels"], engine),
                               position=_position(s["labels"], engine, s["role"]), samples=tuple(samples),
                               created=created, gauge=bool(s.get("gauge")))))
    return infer_restarts(out)


def check_selector(selector: str) -> str:
    """Validate extra PromQL label matchers (``job="vllm", instance=~"gpu-.*"``).

    Raises:
        ValueError: not a comma-separated list of label matchers.
    """
    selector = (selector or "").strip().strip("{}").strip()
    if selector and not _SELECTOR_RE.match(selector):
        raise ValueError(f"invalid label selector {selector!r}: expected matchers like job=\"vllm\"")
    return selector


def query_raw_series(
    url: str, engine: EngineMetrics, start: dt.datetime, end: dt.datetime, *, lookback_s: float = 600.0,
    selector: str = "", timeout_s: float = 30.0, client: httpx.Client | None = None,
) -> list[SeriesData]:
    """Raw samples of the engine's series in ``[start - lookback, end]`` from a Prometheus server.

    Args:
        url: Prometheus base URL (``http://prometheus:9090``; a trailing ``/`` is fine).
        start / end: the window (aware datetimes). lookback_s: extra seconds before ``start`` to find
            each series' anchor sample (at least one scrape interval).
        selector: extra label matchers (e.g. ``job="vllm"``), see :func:`check_selector`.
    Returns:
        :class:`~monitoring.production.counters.SeriesData` per series (counters and gauges);
        ``_created`` series are attached to their counter as created timestamps; without any
        (llama.cpp) restarts and not-yet-exported series are inferred per scraped target
        (:mod:`monitoring.production.restarts`).
    Raises:
        ProductionSourceError: unreachable, HTTP error, or a Prometheus ``status: error`` answer.
        ValueError: bad selector or ``end <= start``.
    """
    if end <= start:
        raise ValueError(f"window end {end.isoformat()} must be after its start {start.isoformat()}")
    sel = check_selector(selector)
    names = "|".join(engine.sample_names())  # metric names: [a-zA-Z_:][a-zA-Z0-9_:]*, no regex escapes needed
    rng = int(round((end - start).total_seconds() + lookback_s))
    query = f'{{__name__=~"{names}"{", " + sel if sel else ""}}}[{rng}s]'
    own = client is None
    client = client or httpx.Client(timeout=timeout_s)
    api = url.rstrip("/") + "/api/v1/query"
    try:
        resp = fetch_within(client, api, timeout_s=timeout_s,
                            params={"query": query, "time": f"{end.timestamp():.3f}"})
        body = json.loads(resp.text) if resp.content_type.startswith("application/json") else None
    except (httpx.HTTPError, TimeoutError, ValueError) as e:
        raise ProductionSourceError(f"cannot query Prometheus at {redact_url(url)}: {type(e).__name__}: "
                                    f"{redact_text(str(e))}") from None
    finally:
        if own:
            client.close()
    if body is None or resp.status_code >= 400 or body.get("status") != "success":
        why = (body or {}).get("error") or f"HTTP {resp.status_code}"
        raise ProductionSourceError(f"Prometheus at {redact_url(url)} refused the query: {why}")
    data = body.get("data") or {}
    if data.get("resultType") != "matrix":
        raise ProductionSourceError(f"Prometheus at {redact_url(url)} answered {data.get('resultType')!r}, "
                                    "expected a matrix of raw samples")
    values: dict[tuple, tuple[str, dict, list]] = {}
    created: dict[tuple, dict[float, float]] = {}
    for r in data.get("result") or []:
        labels = dict(r.get("metric") or {})
        name = labels.pop("__name__", "")
        kind = engine.role_of(name)
        if kind is None:
            continue
        pts = [(float(t), float(v)) for t, v in r.get("values") or []]
        k = (kind[1], _key(labels))
        if kind[0] == "created":
            created[k] = dict(pts)
        else:
            values[k] = (kind[0], labels, pts)
    out = []
    for (role, _), (kind, labels, pts) in values.items():
        out.append((_target(labels, engine),
                    SeriesData(role=role, model=_model_of(labels, engine), position=_position(labels, engine, role),
                               samples=tuple(pts), created=created.get((role, _key(labels)), {}),
                               gauge=kind == "gauge")))
    return infer_restarts(out)
