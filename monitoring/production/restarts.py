"""Restarts and late-exported series of counters that carry no creation time.

llama.cpp's ``llama-server --metrics`` exports plain counters: no ``_created`` sample and no
``process_start_time_seconds`` (vLLM in prometheus_client multiprocess mode has no ``_created``
either). Two facts about such a *target* (the series of one process: the same labels apart from the
per-position label, scraped together, so they share sample times) are then inferred from the samples:

* **restart**: at a sample time where any counter of the target is below its previous sample, the
  whole target restarted (one process, all counters back to 0), including counters that already grew
  past their old value. Each sample gets a creation-time bound: ``-inf`` before the first detected
  restart, else the target's sample time just before that restart (the process started after it), so
  :func:`monitoring.production.counters.counter_increase` sees a changed creation time. A restart after
  which *every* counter already exceeds its old value by the next scrape is invisible without a
  creation time (scrape more often than the server restarts and refills its counters).
* **not yet exported = 0**: llama-server writes ``..._per_pos_total{position}`` only once it has
  drafted since it started. A series absent from a scrape of its target, with no sample of its own since
  the target's last (re)start, was 0 there; that 0 sample is added, so the series' first increments
  count (Prometheus' ``increase()`` would take its first sample as the starting point and lose them).

Targets with any creation time known are passed through unchanged (their ``_created`` or process start
time already says when each counter restarted).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace
from typing import Hashable, Iterable

from monitoring.production.counters import SeriesData


def _epochs(members: list[SeriesData], times: list[float]) -> dict[float, float]:
    """Sample time -> creation-time bound (``-inf`` until the first restart)."""
    pos = {t: i for i, t in enumerate(times)}
    drops = [(t0, t1) for m in members for (t0, v0), (t1, v1) in zip(sorted(m.samples), sorted(m.samples)[1:])
             if v1 < v0]
    restarted = {t1 for t0, t1 in drops if pos[t1] == pos[t0] + 1}
    for t0, t1 in drops:  # a fall across scrapes the series was absent from: one restart in that gap
        if not any(times[i] in restarted for i in range(pos[t0] + 1, pos[t1] + 1)):
            restarted.add(t1)
    out, born = {}, -math.inf
    for i, t in enumerate(times):
        if t in restarted and i > 0:
            born = times[i - 1]
        out[t] = born
    return out


def _zero_filled(m: SeriesData, times: list[float], born: dict[float, float]) -> list[tuple[float, float]]:
    """``m``'s samples plus a 0 at each target time where it was absent and not yet exported since the
    target's last (re)start."""
    own = sorted(m.samples)
    have = {t for t, _ in own}
    seen_since: dict[float, bool] = {}
    out = list(own)
    for t in times:
        if t in have:
            seen_since[born[t]] = True
        elif not seen_since.get(born[t]):
            out.append((t, 0.0))
    return sorted(out)


def infer_restarts(series: Iterable[tuple[Hashable, SeriesData]]) -> list[SeriesData]:
    """Series with restarts and late-exported zeros filled in for targets without creation times.

    Args:
        series: ``(target key, series)`` pairs; the key identifies the process that exports the series
            (its labels without the per-position label).
    Returns:
        The series, in input order: counters of targets without any creation time get ``created``
        bounds (module docstring) and the 0 samples they were absent with; gauges and targets with a
        creation time are unchanged.
    """
    items = list(series)
    groups: dict[Hashable, list[int]] = defaultdict(list)
    for i, (key, s) in enumerate(items):
        if not s.gauge:
            groups[key].append(i)
    out = [s for _, s in items]
    for idx in groups.values():
        members = [out[i] for i in idx]
        if any(m.created for m in members):
            continue
        times = sorted({t for m in members for t, _ in m.samples})
        born = _epochs(members, times)
        for i, m in zip(idx, members):
            pts = _zero_filled(m, times, born)
            out[i] = replace(m, samples=tuple(pts), created={t: born[t] for t, _ in pts})
    return out

