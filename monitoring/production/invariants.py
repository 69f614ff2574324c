"""The counters' invariants, checked per scrape before anything is recorded.

vLLM's speculative-decoding counters (``monitoring.production.engines``) obey, at every scrape and
for every model: each value is finite and >= 0; accepted tokens <= drafted tokens; accepted tokens
at position i <= drafts; and a counter only decreases when it restarted (a *detected* reset: a
changed ``_created`` timestamp or process start time, or no creation time known at all, the
Prometheus convention). The same bounds hold for the increases over a window. A scrape that breaks
one of them (an exporter bug, a proxy mixing two servers, ``+Inf``) is refused with one line per
broken series, and nothing of it reaches the history: no acceptance rate outside [0, 1] is stored.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Iterable, Mapping

from monitoring.production.counters import SeriesData, WindowCounters
from monitoring.production.engines import ACCEPTED, DRAFT_TOKENS, DRAFTS, PER_POSITION
from specdec.validation.report import GroupMetrics


def _name(s: SeriesData) -> str:
    pos = "" if s.position is None else f", position={s.position}"
    return f"{s.role}{{model={s.model!r}{pos}}}"


def _series_violations(s: SeriesData) -> list[str]:
    out = []
    pts = sorted(s.samples)
    for t, v in pts:
        if not math.isfinite(v) or (not s.gauge and v < 0):
            return [f"series {_name(s)}: value {v} at {t:.0f} is not a finite non-negative count"]
    if s.gauge:
        return out
    for (t0, v0), (t1, v1) in zip(pts, pts[1:]):
        c0, c1 = s.created.get(t0), s.created.get(t1)
        if v1 < v0 and c0 is not None and c0 == c1:
            out.append(f"series {_name(s)}: decreased from {v0:g} to {v1:g} at {t1:.0f} without a reset "
                       f"(same creation time {c0:.0f})")
    return out


def scrape_violations(series: Iterable[SeriesData]) -> dict[str, list[str]]:
    """Broken invariants of raw samples, per model label value (``{}``: all hold).

    Per series: finite, non-negative, monotone unless a reset is detected. Per model and sample
    time (series scraped together share their timestamp): summed accepted <= summed drafted
    tokens, summed accepted at each position <= summed drafts.
    """
    out: dict[str, list[str]] = defaultdict(list)
    at: dict[tuple[str, float], dict] = defaultdict(lambda: defaultdict(float))
    for s in series:
        bad = _series_violations(s)
        out[s.model] += bad
        if bad or s.gauge:
            continue
        for t, v in s.samples:
            key = (PER_POSITION, s.position) if s.role == PER_POSITION else s.role
            at[(s.model, t)][key] += v
    for (model, t), sums in sorted(at.items()):
        out[model] += _bounds(sums, f"model {model!r} at {t:.0f}")
    return {m: v for m, v in out.items() if v}


def _bounds(sums: Mapping, where: str) -> list[str]:
    out = []
    acc, drafted, drafts = sums.get(ACCEPTED), sums.get(DRAFT_TOKENS), sums.get(DRAFTS)
    if acc is not None and drafted is not None and acc > drafted:
        out.append(f"{where}: accepted tokens {acc:g} > drafted tokens {drafted:g}")
    for key, v in sums.items():
        if isinstance(key, tuple) and drafts is not None and v > drafts:
            out.append(f"{where}: accepted at position {key[1]} {v:g} > drafts {drafts:g}")
    return out


def window_violations(wc: WindowCounters) -> list[str]:
    """The same bounds on one model's pooled increases over a window."""
    sums: dict = {ACCEPTED: wc.num_accepted_tokens, DRAFT_TOKENS: wc.num_draft_tokens, DRAFTS: wc.num_drafts}
    sums = {k: v for k, v in sums.items() if v is not None}
    sums.update({(PER_POSITION, i): v for i, v in enumerate(wc.accepted_per_position)})
    neg = [f"window of model {wc.model!r}: {k} increased by {v:g} < 0" for k, v in sums.items() if v < 0]
    return neg + _bounds(sums, f"window of model {wc.model!r}")


def check_rates(g: GroupMetrics, what: str) -> None:
    """Refuse to store a rate outside [0, 1] or a CI whose lower end is above its upper end.

    Raises:
        ValueError: naming ``what`` and the offending value.
    """
    def ok(x) -> bool:
        return x is None or (isinstance(x, float) and math.isnan(x)) or 0.0 <= float(x) <= 1.0

    rates = {"acceptance_rate": g.acceptance_rate, "alpha_hat": g.alpha_hat}
    rates.update({f"per_position_acceptance[{i}]": v for i, v in enumerate(g.per_position_acceptance or [])})
    for name, v in rates.items():
        if not ok(v):
            raise ValueError(f"{what}: {name} {v} is outside [0, 1]; not stored")
    ci = list(g.acceptance_rate_ci or [])
    if len(ci) == 2 and all(x is not None and math.isfinite(x) for x in ci):
        if not (ok(ci[0]) and ok(ci[1]) and ci[0] <= ci[1]):
            raise ValueError(f"{what}: acceptance-rate CI [{ci[0]}, {ci[1]}] is not an interval in [0, 1]; not stored")
