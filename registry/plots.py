"""PNG plots for validation runs (matplotlib, Agg canvas; no pyplot global state).

Each function writes one PNG and returns its path. Acceptance rates are probabilities in [0, 1].
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from specdec.policy import METRICS, TREND_ESTIMATOR
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


def _judged_label(estimator: str) -> tuple[str, str, str]:
    """(GroupMetrics / MLflow metric name, its CI field, axis label) of ``estimator``'s judged metric."""
    metric, ci, label = METRICS[estimator]
    return metric, ci, ("per-token acceptance α (same at every k)" if metric == "per_token_acceptance" else "acceptance rate")


def plot_per_category(report: ValidationReport, path: str | Path, *, threshold: float, estimator: str) -> Path:
    """Per-category bars of the metric ``estimator`` judges (the acceptance policy's: ``pooled`` or
    ``per_token``) with 95% CI error bars and the floor line at ``threshold``; vLLM's acceptance rate at k
    is marked beside each bar when the bars are per-token."""
    fig = _figure(max(6.4, 0.7 * (len(report.categories) + 1) + 2))
    ax = fig.add_subplot(1, 1, 1)
    metric, ci_name, ylabel = _judged_label(estimator)
    k = report.config.get("num_speculative_tokens", "?")
    groups = [("all", report.overall)] + sorted(report.categories.items())
    names, vals, lo, hi, rates = [], [], [], [], []
    for name, g in groups:
        v = getattr(g, metric)
        rate = v if _ok(v) else 0.0
        ci = getattr(g, ci_name) or [math.nan, math.nan]
        names.append(name)
        vals.append(rate)
        rates.append(g.acceptance_rate if _ok(g.acceptance_rate) else math.nan)
        lo.append(max(rate - ci[0], 0.0) if _ok(ci[0]) else 0.0)
        hi.append(max(ci[1] - rate, 0.0) if len(ci) > 1 and _ok(ci[1]) else 0.0)
    colors = ["#444444"] + ["#4C72B0"] * (len(names) - 1)
    ax.bar(range(len(names)), vals, yerr=[lo, hi], capsize=3, color=colors, label=ylabel.split(" (")[0])
    if metric != "acceptance_rate":
        ax.plot(range(len(names)), rates, linestyle="none", marker="_", markersize=14, color="#DD8452",
                label=f"acceptance rate at k={k} (accepted/drafted)")
    else:  # the per-token α beside the rate
        alphas = [g.per_token_acceptance if _ok(g.per_token_acceptance) else math.nan for _n, g in groups]
        ax.plot(range(len(names)), alphas, linestyle="none", marker="_", markersize=14, color="#DD8452",
                label="per-token acceptance α (same at every k)")
    ax.axhline(threshold, color="#C44E52", linestyle="--", linewidth=1, label=f"floor {threshold:.2f} ({metric})")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0, 1.02)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{ylabel.split(' (')[0].capitalize()} per category (95% CI), k={k}")
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


def plot_trend(history: Sequence[dict[str, Any]], path: str | Path, *, threshold: float, estimator: str,
               title: str = "") -> Path:
    """Acceptance (top panel) and measured speedup (bottom panel, when measured) over past validation runs
    of a pair: the per-token acceptance α (solid: the cross-version trend, the same at every k) and the
    acceptance rate at each version's k (dashed: what the floor judges by default, line at the floor), one
    line per pair version and source (never joined across versions), points labelled by night.

    Args:
        history: oldest first; dicts with ``time`` (datetime or ISO string), ``per_token_acceptance``
            and/or ``acceptance_rate``, optional ``night`` (``YYYY-MM-DD``: the x label of a nightly point;
            else the date of ``time``), ``pair_version`` and ``source`` (``"nightly"``,
            the default, or ``"production"``: windows of the serving engine's counters, dotted), and
            ``speedup`` / ``speedup_ci_low`` / ``speedup_ci_high`` (measured speedup with its CI).
        threshold / estimator: the floor line and the metric it judges (the acceptance policy's).
    """
    trend, rate = METRICS[TREND_ESTIMATOR][0], "acceptance_rate"
    pts = [h for h in history if _ok(h.get(trend)) or _ok(h.get(rate))]
    sp = [i for i, h in enumerate(pts) if _ok(h.get("speedup"))]
    fig = _figure(7.6, 5.6 if sp else 4.0)
    ax = fig.add_subplot(2, 1, 1) if sp else fig.add_subplot(1, 1, 1)
    ax2 = fig.add_subplot(2, 1, 2, sharex=ax) if sp else None
    colors = ["#4C72B0", "#C44E52", "#55A868", "#8172B2", "#CCB974", "#64B5CD", "#DD8452", "#937860"]
    for n, ((src, ver), idx) in enumerate(_series(pts).items()):
        color = colors[n % len(colors)]
        style = dict(color=color, marker="o" if src == "nightly" else ".", linestyle="-" if src == "nightly" else ":")
        alpha = [i for i in idx if _ok(pts[i].get(trend))]
        if alpha:  # the per-token α: the same at every k, so versions at another k still compare
            ax.plot(alpha, [float(pts[i][trend]) for i in alpha], label=f"v{ver} ({src}) α", **style)
        rated = [i for i in idx if _ok(pts[i].get(rate))]
        if rated:  # the rate engines print, at each version's own k: what the floor judges by default
            ax.plot(rated, [float(pts[i][rate]) for i in rated], color=color, marker="x", linestyle="--",
                    linewidth=0.9, alpha=0.8, label=f"v{ver} ({src}) rate at k")
        sx = [i for i in idx if i in sp]
        if ax2 is not None and sx:
            sy = [float(pts[i]["speedup"]) for i in sx]
            lo = [y - float(pts[i]["speedup_ci_low"]) if _ok(pts[i].get("speedup_ci_low")) else 0.0 for y, i in zip(sy, sx)]
            hi = [float(pts[i]["speedup_ci_high"]) - y if _ok(pts[i].get("speedup_ci_high")) else 0.0 for y, i in zip(sy, sx)]
            ax2.errorbar(sx, sy, yerr=[lo, hi], marker="s", color=color, capsize=3, label=f"v{ver}")
    judged = METRICS[estimator][2]
    ax.axhline(threshold, color="#C44E52", linestyle="--", linewidth=1, label=f"floor {threshold:.2f} ({judged})")
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("per-token acceptance α (solid, same at every k)\nacceptance rate at k (dashed)")
    ax.set_title(title or "Acceptance over validation runs")
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


#: the acceptance metrics a trend point carries (MLflow metric names): both estimators, so the plot
#: draws whichever the policy judges
ACCEPTANCE_KEYS = ("acceptance_rate", "acceptance_rate_ci_low", "per_token_acceptance", "per_token_acceptance_ci_low")
#: the speed metrics a trend point carries (MLflow metric names)
SPEED_KEYS = ("speedup", "speedup_ci_low", "speedup_ci_high", "predicted_speedup")


def night_of(run_name: str | None) -> str | None:
    """The night of a validation run from its name (``<pair> v<N> night <YYYY-MM-DD>``), else None."""
    return run_name.rsplit(" night ", 1)[1] if run_name and " night " in run_name else None


def write_run_plots(report: ValidationReport, out: Path, *, history: list, run_id: str, version: str,
                    metrics: dict[str, float], threshold: float, estimator: str, pair: str,
                    night: str | None = None) -> Path:
    """The plots of one validation run into ``out``: per-position and per-category acceptance, and
    the trend of ``history`` (earlier runs, :func:`registry.runs.validation_history`) plus this run;
    ``threshold`` / ``estimator``: the gate's floor and judged metric (:class:`registry.gate.GateConfig`)."""
    out.mkdir(parents=True, exist_ok=True)
    plot_per_position(report, out / "per_position_acceptance.png")
    plot_per_category(report, out / "per_category_acceptance.png", threshold=threshold, estimator=estimator)
    point = {"time": datetime.now(timezone.utc), "run_id": run_id, "pair_version": version, "night": night,
             **{k: metrics.get(k, math.nan) for k in ACCEPTANCE_KEYS + SPEED_KEYS}}
    plot_trend(list(history) + [point], out / "acceptance_trend.png", threshold=threshold, estimator=estimator,
               title=f"{pair}: per-token acceptance, acceptance rate at k and speedup over validation runs")
    return out
