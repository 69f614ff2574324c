"""PNG plots for validation runs (matplotlib, Agg canvas; no pyplot global state).

Each function writes one PNG and returns its path. Acceptance rates are probabilities in [0, 1].
"""

from __future__ import annotations

import math
from datetime import datetime
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


def plot_trend(history: Sequence[dict[str, Any]], path: str | Path, threshold: float | None = None, title: str = "") -> Path:
    """Acceptance-rate trend over past validation runs of a pair, nightly and production apart.

    Args:
        history: oldest first; dicts with ``time`` (datetime or ISO string), ``acceptance_rate``,
            optional ``pair_version`` (annotated on nightly points), ``acceptance_rate_ci_low`` and
            ``source`` (``"nightly"``, the default, or ``"production"``: windows of the serving
            engine's counters, drawn as their own series), and ``speedup`` / ``speedup_ci_low`` /
            ``speedup_ci_high`` (the measured speedup, drawn on a right-hand axis with its CI and a
            1.0x line; points without one are left out of that series).
    """
    fig = _figure(7.2, 4.0)
    ax = fig.add_subplot(1, 1, 1)
    pts = [h for h in history if _ok(h.get("acceptance_rate"))]
    xs = list(range(len(pts)))
    if pts:
        styles = {"nightly": dict(marker="o", color="#4C72B0", label="acceptance rate (nightly, held-out)"),
                  "production": dict(marker=".", color="#DD8452", label="acceptance rate (production traffic)")}
        for src, style in styles.items():
            sel = [(x, h) for x, h in zip(xs, pts) if (h.get("source") or "nightly") == src]
            if not sel:
                continue
            sx, sy = [x for x, _ in sel], [float(h["acceptance_rate"]) for _, h in sel]
            if src == "nightly" and len(sel) == len(pts):
                style = {**style, "label": "acceptance rate"}
            ax.plot(sx, sy, linestyle="-" if src == "nightly" else ":", **style)
            lows = [h.get("acceptance_rate_ci_low") for _, h in sel]
            if all(_ok(v) for v in lows):
                ax.plot(sx, lows, linestyle=":", color=style["color"], alpha=0.7,
                        label="CI lower bound" if src == "nightly" else "production CI lower bound")
            if src == "nightly":
                for x, h in sel:
                    if h.get("pair_version") is not None:
                        ax.annotate(f"v{h['pair_version']}", (x, float(h["acceptance_rate"])),
                                    textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
        labels = []
        for h in pts:
            t = h.get("time")
            labels.append(t.strftime("%m-%d %H:%M") if isinstance(t, datetime) else str(t or "")[5:16])
        step = max(1, math.ceil(len(pts) / 16))  # at most ~16 tick labels
        ax.set_xticks(xs[::step])
        ax.set_xticklabels(labels[::step], rotation=30, ha="right", fontsize=7)
    threshold = get_policy().threshold if threshold is None else threshold  # the acceptance policy's line
    ax.axhline(threshold, color="#C44E52", linestyle="--", linewidth=1, label=f"gate {threshold:.2f}")
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("acceptance rate")
    ax.set_title(title or "Acceptance rate over validation runs")
    ax.grid(alpha=0.3)
    handles, names = ax.get_legend_handles_labels()
    sp = [(x, h) for x, h in zip(xs, pts) if _ok(h.get("speedup"))]
    if sp:  # measured speedup on a second axis, with its paired-bootstrap CI and the 1.0x line
        ax2 = ax.twinx()
        sy = [float(h["speedup"]) for _, h in sp]
        lo = [y - float(h["speedup_ci_low"]) if _ok(h.get("speedup_ci_low")) else 0.0 for y, (_, h) in zip(sy, sp)]
        hi = [float(h["speedup_ci_high"]) - y if _ok(h.get("speedup_ci_high")) else 0.0 for y, (_, h) in zip(sy, sp)]
        ax2.errorbar([x for x, _ in sp], sy, yerr=[lo, hi], marker="s", color="#55A868", capsize=3,
                     label="measured speedup (95% CI)")
        ax2.axhline(1.0, color="#55A868", linestyle=":", linewidth=1, label="speedup 1.0x (no gain)")
        ax2.set_ylim(0, max([y + h for y, h in zip(sy, hi)] + [1.5]) * 1.1)
        ax2.set_ylabel("speedup vs target-only (x)")
        h2, n2 = ax2.get_legend_handles_labels()
        handles, names = handles + h2, names + n2
    ax.legend(handles, names, fontsize=7, loc="lower left")
    out = Path(path)
    fig.savefig(out, bbox_inches="tight")
    return out
