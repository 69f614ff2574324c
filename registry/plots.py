"""PNG plots for validation runs (matplotlib, Agg canvas; no pyplot global state).

Each function writes one PNG and returns its path. Acceptance rates are probabilities in [0, 1].
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from specdec.settings.policy import get_policy
from specdec.validation.report import ValidationReport


def _figure(width: float = 6.4, height: float = 4.0):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _ok(x: float | None) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def plot_per_position(report: ValidationReport, path: str | Path) -> Path:
    """Per-position acceptance curve: P(draft token i accepted | reached), i = 0..k-1.

    Uses ``report.overall.per_position_acceptance`` (and each category's, as thin lines).
    """
    fig = _figure()
    ax = fig.add_subplot(1, 1, 1)
    overall = report.overall.per_position_acceptance
    if overall:
        ax.plot(range(len(overall)), overall, marker="o", linewidth=2.2, label="all prompts", color="black")
    for cat, g in sorted(report.categories.items()):
        if g.per_position_acceptance:
            ax.plot(range(len(g.per_position_acceptance)), g.per_position_acceptance, marker=".", linewidth=0.9, alpha=0.7, label=cat)
    ax.set_xlabel("draft position i (0 = first draft token)")
    ax.set_ylabel("acceptance rate at position i")
    ax.set_ylim(0, 1.02)
    if overall:
        ax.set_xticks(range(len(overall)))
    ax.set_title(f"Per-position acceptance (k={report.config.get('num_speculative_tokens', '?')})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    out = Path(path)
    fig.savefig(out, bbox_inches="tight")
    return out


def plot_per_category(report: ValidationReport, path: str | Path, threshold: float | None = None) -> Path:
    """Per-category acceptance-rate bars with 95% CI error bars and the gate threshold line."""
    fig = _figure(max(6.4, 0.7 * (len(report.categories) + 1) + 2))
    ax = fig.add_subplot(1, 1, 1)
    groups = [("all", report.overall)] + sorted(report.categories.items())
    names, vals, lo, hi = [], [], [], []
    for name, g in groups:
        rate = g.acceptance_rate if _ok(g.acceptance_rate) else 0.0
        ci = g.acceptance_rate_ci or [math.nan, math.nan]
        names.append(name)
        vals.append(rate)
        lo.append(max(rate - ci[0], 0.0) if _ok(ci[0]) else 0.0)
        hi.append(max(ci[1] - rate, 0.0) if len(ci) > 1 and _ok(ci[1]) else 0.0)
    colors = ["#444444"] + ["#4C72B0"] * (len(names) - 1)
    ax.bar(range(len(names)), vals, yerr=[lo, hi], capsize=3, color=colors)
    threshold = get_policy().threshold if threshold is None else threshold  # the acceptance policy's line
    ax.axhline(threshold, color="#C44E52", linestyle="--", linewidth=1, label=f"gate {threshold:.2f}")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("acceptance rate")
    ax.set_title("Acceptance rate per category (95% CI)")
    ax.legend(fontsize=7)
    out = Path(path)
    fig.savefig(out, bbox_inches="tight")
    return out


def _label(h: dict[str, Any]) -> str:
    """A point's x label: its night (``YYYY-MM-DD``, the history key's date) for nightly runs, the
    window end (``MM-DD HH:MM``) for production windows."""
    if h.get("night") and (h.get("source") or "nightly") == "nightly":
        return str(h["night"])
    t = h.get("time")
    if isinstance(t, datetime):
        return t.strftime("%Y-%m-%d") if (h.get("source") or "nightly") == "nightly" else t.strftime("%m-%d %H:%M")
    return str(t or "")[:16]


def _series(pts: list[dict[str, Any]]) -> dict[tuple[str, str], list[int]]:
    """Indices of the points of each (source, pair version), in order: one line each, so two versions
    are never joined by a line."""
    out: dict[tuple[str, str], list[int]] = {}
    for i, h in enumerate(pts):
        out.setdefault((h.get("source") or "nightly", str(h.get("pair_version") or "?")), []).append(i)
    return out


def plot_trend(history: Sequence[dict[str, Any]], path: str | Path, threshold: float | None = None, title: str = "") -> Path:
    """Acceptance rate (top panel) and measured speedup (bottom panel, when measured) over past
    validation runs of a pair: one line per pair version and source (never joined across versions),
    each panel with its own y-axis, points labelled by night.

    Args:
        history: oldest first; dicts with ``time`` (datetime or ISO string), ``acceptance_rate``,
            optional ``night`` (``YYYY-MM-DD``: the x label of a nightly point; else the date of
            ``time``), ``pair_version``, ``acceptance_rate_ci_low`` and ``source`` (``"nightly"``,
            the default, or ``"production"``: windows of the serving engine's counters, dotted), and
            ``speedup`` / ``speedup_ci_low`` / ``speedup_ci_high`` (measured speedup with its CI).
    """
    pts = [h for h in history if _ok(h.get("acceptance_rate"))]
    sp = [i for i, h in enumerate(pts) if _ok(h.get("speedup"))]
    fig = _figure(7.6, 5.6 if sp else 4.0)
    ax = fig.add_subplot(2, 1, 1) if sp else fig.add_subplot(1, 1, 1)
    ax2 = fig.add_subplot(2, 1, 2, sharex=ax) if sp else None
    colors = ["#4C72B0", "#C44E52", "#55A868", "#8172B2", "#CCB974", "#64B5CD", "#DD8452", "#937860"]
    for n, ((src, ver), idx) in enumerate(_series(pts).items()):
        color = colors[n % len(colors)]
        style = dict(color=color, marker="o" if src == "nightly" else ".", linestyle="-" if src == "nightly" else ":")
        ax.plot(idx, [float(pts[i]["acceptance_rate"]) for i in idx], label=f"v{ver} ({src})", **style)
        lows = [pts[i].get("acceptance_rate_ci_low") for i in idx]
        if all(_ok(v) for v in lows):
            ax.plot(idx, lows, linestyle=":", color=color, alpha=0.6, linewidth=0.9)
        sx = [i for i in idx if i in sp]
        if ax2 is not None and sx:
            sy = [float(pts[i]["speedup"]) for i in sx]
            lo = [y - float(pts[i]["speedup_ci_low"]) if _ok(pts[i].get("speedup_ci_low")) else 0.0 for y, i in zip(sy, sx)]
            hi = [float(pts[i]["speedup_ci_high"]) - y if _ok(pts[i].get("speedup_ci_high")) else 0.0 for y, i in zip(sy, sx)]
            ax2.errorbar(sx, sy, yerr=[lo, hi], marker="s", color=color, capsize=3, label=f"v{ver}")
    threshold = get_policy().threshold if threshold is None else threshold  # the acceptance policy's line
    ax.axhline(threshold, color="#C44E52", linestyle="--", linewidth=1, label=f"gate {threshold:.2f}")
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("acceptance rate\n(dotted: CI lower bound)")
    ax.set_title(title or "Acceptance rate over validation runs")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left", ncol=2)
    bottom = ax2 if ax2 is not None else ax
    if ax2 is not None:
        ax2.axhline(1.0, color="#55A868", linestyle=":", linewidth=1, label="1.0x (no gain)")
        top = max(float(pts[i].get("speedup_ci_high") if _ok(pts[i].get("speedup_ci_high")) else pts[i]["speedup"]) for i in sp)
        ax2.set_ylim(0, max(top, 1.5) * 1.1)
        ax2.set_ylabel("measured speedup (x)\nvs target-only, 95% CI")
        ax2.grid(alpha=0.3)
        ax2.legend(fontsize=7, loc="lower left", ncol=2)
    if pts:
        step = max(1, math.ceil(len(pts) / 16))  # at most ~16 tick labels
        bottom.set_xticks(list(range(len(pts)))[::step])
        bottom.set_xticklabels([_label(h) for h in pts][::step], rotation=30, ha="right", fontsize=7)
        if ax2 is not None:
            ax.tick_params(labelbottom=False)
    out = Path(path)
    fig.savefig(out, bbox_inches="tight")
    return out


#: the speed metrics a trend point carries (MLflow metric names)
SPEED_KEYS = ("speedup", "speedup_ci_low", "speedup_ci_high", "predicted_speedup")


def night_of(run_name: str | None) -> str | None:
    """The night of a validation run from its name (``<pair> v<N> night <YYYY-MM-DD>``), else None."""
    return run_name.rsplit(" night ", 1)[1] if run_name and " night " in run_name else None


def write_run_plots(report: ValidationReport, out: Path, history: list, run_id: str, version: str,
                    metrics: dict[str, float], threshold: float, pair: str, night: str | None = None) -> Path:
    """The plots of one validation run into ``out``: per-position and per-category acceptance, and
    the trend of ``history`` (earlier runs, :func:`registry.runs.validation_history`) plus this run."""
    out.mkdir(parents=True, exist_ok=True)
    plot_per_position(report, out / "per_position_acceptance.png")
    plot_per_category(report, out / "per_category_acceptance.png", threshold=threshold)
    point = {"time": datetime.now(timezone.utc), "run_id": run_id, "pair_version": version, "night": night,
             "acceptance_rate": metrics.get("acceptance_rate", math.nan),
             "acceptance_rate_ci_low": metrics.get("acceptance_rate_ci_low", math.nan),
             **{k: metrics.get(k, math.nan) for k in SPEED_KEYS}}
    plot_trend(list(history) + [point], out / "acceptance_trend.png", threshold=threshold,
               title=f"{pair}: acceptance rate and speedup over validation runs")
    return out
