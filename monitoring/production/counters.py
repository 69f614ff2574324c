"""Reset-aware counter deltas per window, pooled per served model, and the window's metrics.

A window is the half-open interval ``(start, end]`` (UTC). Each series (one label set of one
counter) is delta'd on its own, then the deltas are summed per served model:

* the *anchor* is the series' last sample at or before ``start``; the window's increase is the sum
  of the increments between consecutive samples from the anchor through the last sample in the
  window, so adjacent windows partition a series' increments exactly (nothing counted twice);
* a *reset* (server restart) is a value below the previous one, or a changed ``_created``
  timestamp; the increment across a reset is the new value itself (the counter restarted at 0);
* without an anchor (the series appeared inside the window) the first sample counts in full only
  when the counter was created inside the window (its ``_created`` timestamp, or the process start
  time, after ``start``); otherwise it is only the starting point, as Prometheus' ``increase()``
  treats it.

Metrics follow vLLM's definitions (``specdec.core.stats.DecodingStats``): acceptance rate = accepted /
drafted tokens, mean accepted length = 1 + accepted / drafts, per-position rate = accepted at
position i / drafts, drafted tokens per step = drafted tokens / drafts.

The acceptance-rate 95% CI is a normal interval with the verification step (draft) as the unit:
``se = sd(a) / sqrt(n) / (drafted tokens per step)`` where ``a`` is the accepted count of one draft.
With vLLM's per-position counters the distribution of ``a`` is known exactly (drafts that accepted
exactly j tokens = accepted_at[j-1] - accepted_at[j]); without them ``var(a)`` is bounded by
``m (k - m)`` (Bhatia-Davis inequality for a variable in [0, k] with mean m), a conservative
interval. Drafts of one request are treated as independent, so the interval is somewhat narrow when
acceptance varies a lot between requests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from scipy.stats import norm

from monitoring.production.engines import ACCEPTED, DRAFT_TOKENS, DRAFTS, LENGTH_GAUGE, PER_POSITION, RATE_GAUGE
from specdec.validation.report import GroupMetrics
from specdec.core.stats import DecodingStats

Z95 = float(norm.ppf(0.975))


@dataclass
class SeriesDelta:
    """One series' increase over a window: ``increase`` (counter units), ``resets`` seen inside the
    window, ``samples`` inside the window (0: the series said nothing about this window)."""

    increase: float = 0.0
    resets: int = 0
    samples: int = 0


def counter_increase(
    samples: Sequence[tuple[float, float]], start: float, end: float,
    created: Mapping[float, float] | None = None, created_default: float | None = None,
) -> SeriesDelta:
    """Reset-aware increase of one counter series over the window ``(start, end]``.

    Args:
        samples: ``(unix seconds, value)`` pairs of the series, any order; samples after ``end`` are
            ignored, samples at or before ``start`` only serve as the anchor.
        start / end: window bounds in unix seconds (``start < end``).
        created: sample time -> the counter's ``_created`` timestamp at that sample (optional).
        created_default: creation time to assume where ``created`` has none (e.g. the process start
            time); ``None``: unknown.
    Returns:
        :class:`SeriesDelta`.
    Raises:
        ValueError: ``end <= start``.
    """
    if end <= start:
        raise ValueError(f"window end {end} must be after its start {start}")
    created = created or {}
    pts = sorted((float(t), float(v)) for t, v in samples if t <= end)
    before = [p for p in pts if p[0] <= start]
    inside = [p for p in pts if p[0] > start]
    out = SeriesDelta(samples=len(inside))
    if not inside:
        return out

    def born(t: float) -> float | None:
        return created.get(t, created_default)

    prev = before[-1] if before else None
    if prev is None:
        c = born(inside[0][0])
        if c is not None and c > start:  # created inside the window: it started from 0
            out.increase += inside[0][1]
        prev, inside = inside[0], inside[1:]
    for t, v in inside:
        c_prev, c_cur = born(prev[0]), born(t)
        restarted = v < prev[1] or (c_prev is not None and c_cur is not None and c_cur != c_prev)
        if restarted:
            out.resets += 1
            out.increase += v
        else:
            out.increase += v - prev[1]
        prev = (t, v)
    return out


@dataclass
class WindowCounters:
    """Pooled counter increases of one served model over one window.

    Attributes:
        model: the model label value (``""`` for engines without one).
        num_drafts / num_draft_tokens / num_accepted_tokens: summed increases (vLLM names);
            ``None`` when the engine does not export that counter.
        accepted_per_position: summed increase per draft position (index = position), ``[]``
            when not exported.
        resets: counter resets seen in the window (any series). series: series that contributed.
        gauge_acceptance_rate / gauge_accept_length: mean of gauge samples (SGLang), else ``None``.
    """

    model: str
    num_drafts: int | None = None
    num_draft_tokens: int | None = None
    num_accepted_tokens: int | None = None
    accepted_per_position: list[int] = field(default_factory=list)
    resets: int = 0
    series: int = 0
    gauge_acceptance_rate: float | None = None
    gauge_accept_length: float | None = None

    @property
    def empty(self) -> bool:
        """True when nothing in the window says anything about speculative decoding."""
        return not self.series and self.gauge_acceptance_rate is None


@dataclass(frozen=True)
class SeriesData:
    """Everything known about one series: role (``drafts``...), model label value, position (for
    per-position counters), samples ``[(t, value)]`` and created timestamps ``{t: created}``."""

    role: str
    model: str
    position: int | None
    samples: tuple[tuple[float, float], ...]
    created: Mapping[float, float] = field(default_factory=dict)
    gauge: bool = False


def pool_window(series: Iterable[SeriesData], start: float, end: float, *,
                created_default: float | None = None) -> dict[str, WindowCounters]:
    """Delta every counter series over ``(start, end]`` and pool them per model.

    Returns:
        model label value -> :class:`WindowCounters`; models without samples in the window are left
        out.
    """
    acc: dict[str, dict] = {}
    for s in series:
        m = acc.setdefault(s.model, {"sums": {}, "pos": {}, "resets": 0, "series": 0, "gauges": {}})
        if s.gauge:
            vals = [v for t, v in s.samples if start < t <= end and math.isfinite(v)]
            if vals:
                m["gauges"].setdefault(s.role, []).extend(vals)
            continue
        d = counter_increase(s.samples, start, end, s.created, created_default)
        if not d.samples:
            continue
        m["series"] += 1
        m["resets"] += d.resets
        if s.role == PER_POSITION and s.position is not None:
            m["pos"][s.position] = m["pos"].get(s.position, 0.0) + d.increase
        else:
            m["sums"][s.role] = m["sums"].get(s.role, 0.0) + d.increase
    out: dict[str, WindowCounters] = {}
    for model, m in acc.items():
        def total(role: str) -> int | None:
            return int(round(m["sums"][role])) if role in m["sums"] else None

        k = max(m["pos"]) + 1 if m["pos"] else 0
        g = m["gauges"]
        wc = WindowCounters(
            model=model, num_drafts=total(DRAFTS), num_draft_tokens=total(DRAFT_TOKENS),
            num_accepted_tokens=total(ACCEPTED),
            accepted_per_position=[int(round(m["pos"].get(i, 0.0))) for i in range(k)],
            resets=m["resets"], series=m["series"],
            gauge_acceptance_rate=sum(g[RATE_GAUGE]) / len(g[RATE_GAUGE]) if g.get(RATE_GAUGE) else None,
            gauge_accept_length=sum(g[LENGTH_GAUGE]) / len(g[LENGTH_GAUGE]) if g.get(LENGTH_GAUGE) else None,
        )
        if not wc.empty:
            out[model] = wc
    return out


def acceptance_rate_ci(num_drafts: int, num_draft_tokens: int, num_accepted_tokens: int,
                       accepted_per_position: Sequence[int], k: int | None) -> list[float]:
    """95% CI ``[low, high]`` of the pooled acceptance rate, draft as the unit (module docstring).

    Uses the exact accepted-length distribution when ``accepted_per_position`` is complete and
    consistent (non-increasing, at most ``num_drafts``, summing to ``num_accepted_tokens``), else
    the Bhatia-Davis bound with ``k``. ``[nan, nan]`` when fewer than 2 drafts, nothing drafted, or
    neither per-position counts nor k are known.
    """
    nan = [math.nan, math.nan]
    if num_drafts < 2 or num_draft_tokens <= 0:
        return nan
    rate = num_accepted_tokens / num_draft_tokens
    mean = num_accepted_tokens / num_drafts
    pp = list(accepted_per_position)
    ok = (pp and sum(pp) == num_accepted_tokens and pp[0] <= num_drafts
          and all(a >= b >= 0 for a, b in zip(pp, pp[1:])))
    if ok:
        reach = [num_drafts] + pp + [0]  # reach[j]: drafts that accepted at least j tokens
        second = sum(j * j * (reach[j] - reach[j + 1]) for j in range(1, len(pp) + 1)) / num_drafts
        var = max(second - mean * mean, 0.0)
    elif k:
        var = max(mean * (k - mean), 0.0)
    else:
        return nan
    se = math.sqrt(var / num_drafts) / (num_draft_tokens / num_drafts)
    return [max(rate - Z95 * se, 0.0), min(rate + Z95 * se, 1.0)]


def window_metrics(wc: WindowCounters, k: int | None = None) -> GroupMetrics:
    """:class:`specdec.validation.report.GroupMetrics` of one window (``num_prompts`` = 0: no prompts).

    Args:
        wc: pooled counters. k: ``num_speculative_tokens`` when known from settings; otherwise the
            number of per-position counters.
    Returns:
        GroupMetrics with the vLLM counters, acceptance rate and its CI, mean accepted length,
        per-position rates, drafted tokens per step and α̂ (when per-position counts give the
        rejected steps). Gauge-only windows (SGLang) carry the gauge means and no counts.
    """
    k = k or len(wc.accepted_per_position) or None
    drafts, drafted, accepted = wc.num_drafts, wc.num_draft_tokens, wc.num_accepted_tokens
    if drafted is None or accepted is None:  # gauge-only engine
        g = GroupMetrics(num_speculative_tokens=k or 0)
        if wc.gauge_acceptance_rate is not None:
            g.acceptance_rate = float(wc.gauge_acceptance_rate)
        if wc.gauge_accept_length is not None:
            g.mean_accepted_length = float(wc.gauge_accept_length)
        return g
    if drafts is None and k:  # an engine without a drafts counter: each draft proposes at most k tokens
        drafts_for_ci = math.ceil(drafted / k)
    else:
        drafts_for_ci = drafts or 0
    pp = list(wc.accepted_per_position)
    rejected = drafts - pp[-1] if drafts is not None and pp and k == len(pp) else 0
    stats = DecodingStats(num_speculative_tokens=k or 0, num_drafts=drafts or 0, num_draft_tokens=drafted,
                          num_accepted_tokens=accepted, num_rejected_steps=max(rejected, 0),
                          accepted_per_position=pp)
    g = GroupMetrics(
        num_speculative_tokens=k or 0, num_drafts=drafts or 0, num_draft_tokens=drafted,
        num_accepted_tokens=accepted, accepted_per_position=pp,
        acceptance_rate=stats.acceptance_rate,
        acceptance_rate_ci=acceptance_rate_ci(drafts_for_ci, drafted, accepted, pp, k),
    )
    if drafts:
        g.mean_accepted_length = stats.mean_accepted_length
        g.draft_tokens_per_step = stats.draft_tokens_per_step
        g.per_position_acceptance = stats.per_position_acceptance if pp else []
        g.num_emitted_tokens = accepted + drafts
        if pp and k == len(pp):
            g.alpha_hat = stats.alpha_hat
    return g
