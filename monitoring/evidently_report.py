"""Evidently report of the current run against the baseline, over per-prompt metrics.

Columns: per-prompt ``acceptance_rate`` (at the pair's k), ``per_token_acceptance`` (the floor's
default metric), ``alpha_tf`` and ``top1_agreement`` (probabilities in [0, 1]), one row per
held-out prompt with status ``ok``.

Method pinned: ``ValueDrift(method="ks")``, the two-sample Kolmogorov-Smirnov test, drift when
p < 0.05. Why K-S and not PSI or Wasserstein: the nightly subset has tens to a few hundred
prompts; PSI needs binning with enough rows per bin and is unstable there (empty bins, a point mass
at acceptance 1.0); Evidently's Wasserstein is normalised by the reference standard deviation,
which is tiny for a good int8 draft (every prompt near 0.98), so harmless shifts explode. K-S needs
no bins, is scale-free, and has a stated false-alarm rate (5%) under no change.

Threshold tests, on the metric the acceptance policy judges (``judged``: ``per_token_acceptance`` by default,
``acceptance_rate`` with ``SPECDEC_POLICY__ESTIMATOR=pooled``; Evidently names each test after its
column, "Mean value of per_token_acceptance"): its per-prompt mean >= the absolute threshold (0.40), and, with
a baseline, >= ``(1 - relative_drop)`` times the baseline mean. The report is saved as HTML (for
people) and JSON; the verdict is read back from the JSON file, never from the HTML.

Evidently 0.7 API: ``Report.run(current_data, reference_data)`` -- the current dataset first.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from specdec.validation.report import PromptResult

COLUMNS = ("acceptance_rate", "per_token_acceptance", "alpha_tf", "top1_agreement")
DRIFT_METHOD = "ks"
DRIFT_THRESHOLD = 0.05  # K-S p-value


@dataclass
class ColumnDrift:
    """Drift of one column: K-S p-value (``score``), the threshold and the decision."""

    column: str
    method: str
    score: float | None
    threshold: float | None
    drifted: bool


@dataclass
class DriftVerdict:
    """What the Evidently report says, read from its JSON.

    Attributes:
        html_path / json_path: the saved report.
        columns: per-column drift. tests: ``{"name", "status", "description"}`` per Evidently test.
        drifted_columns: names of columns with drift. tests_passed: no test FAILed.
    """

    html_path: str
    json_path: str
    columns: dict[str, ColumnDrift] = field(default_factory=dict)
    tests: list[dict[str, Any]] = field(default_factory=list)

    @property
    def drifted_columns(self) -> list[str]:
        """Columns whose drift test failed."""
        return [c for c, d in self.columns.items() if d.drifted]

    @property
    def tests_passed(self) -> bool:
        """True when no Evidently test has status FAIL (or ERROR)."""
        return all(t["status"] not in ("FAIL", "ERROR") for t in self.tests)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (stored on the history row)."""
        return {"html_path": self.html_path, "json_path": self.json_path,
                "columns": {k: asdict(v) for k, v in self.columns.items()}, "tests": self.tests,
                "drifted_columns": self.drifted_columns, "tests_passed": self.tests_passed}


def prompts_frame(prompts: Sequence[PromptResult]):
    """A pandas DataFrame of the ``ok`` prompts with :data:`COLUMNS` (NaN where unmeasured)."""
    import pandas as pd

    rows = [{c: getattr(p, c) for c in COLUMNS} for p in prompts if p.status == "ok"]
    return pd.DataFrame(rows, columns=list(COLUMNS), dtype="float64")


def _usable(cur, ref) -> list[str]:
    return [c for c in COLUMNS if cur[c].notna().sum() >= 2 and ref[c].notna().sum() >= 2]


def explanation(cur, ref, *, current_label: str, reference_label: str, pooled: tuple[float, float] | None) -> str:
    """The HTML header of the saved report: what is compared with what, how to read Evidently's
    "Drift score" (a K-S p-value: small means drift) and why its mean differs from specdec's rate."""
    import html

    def mean(frame, col: str = "acceptance_rate") -> str:
        return f"{frame[col].mean():.3f}" if col in frame else "n/a"

    pooled_txt = (f" specdec's acceptance rate pools tokens (accepted / drafted over all prompts): "
                  f"{pooled[0]:.3f} current, {pooled[1]:.3f} reference." if pooled else "")
    return (
        '<div style="font-family:sans-serif;padding:12px 16px;margin:8px;border:1px solid #ccc;background:#f7f7f7">'
        f"<h2 style=\"margin:0 0 6px\">specdec drift report</h2>"
        f"<p><b>Current</b>: {html.escape(current_label)} ({len(cur)} prompts). "
        f"<b>Reference</b>: {html.escape(reference_label)} ({len(ref)} prompts).</p>"
        f"<p>Columns are per-prompt values: acceptance rate (accepted/drafted at the pair's k), per-token acceptance "
        f"&alpha; (per_token_acceptance, the same at every k: the metric the 40% floor judges unless the policy says "
        f"otherwise; the threshold tests name the column they judged), teacher-forced &alpha; (alpha_tf) and top-1 "
        f"agreement. "
        f"Each column is compared with a two-sample Kolmogorov-Smirnov test. <b>The \"Drift score\" Evidently shows "
        f"is the K-S p-value</b>: drift is detected when it is below {DRIFT_THRESHOLD}, so a score of 0.0 means the "
        f"distributions differ (drift), not \"no drift\".</p>"
        f"<p>The means below are plain means over prompts (acceptance rate {mean(cur)} current, {mean(ref)} reference; "
        f"per-token {mean(cur, 'per_token_acceptance')} current, {mean(ref, 'per_token_acceptance')} reference), "
        f"every prompt weighted equally.{html.escape(pooled_txt)} Histogram axes are Evidently's automatic bins.</p>"
        "</div>")


def _with_header(path: Path, header: str) -> None:
    text = path.read_text(encoding="utf-8")
    i = text.find("<body")
    j = text.find(">", i) + 1 if i >= 0 else 0
    path.write_text(text[:j] + header + text[j:], encoding="utf-8")


def build_report(
    current: Sequence[PromptResult], reference: Sequence[PromptResult], out_dir: str | Path, *,
    acceptance_threshold: float = 0.40, relative_drop: float | None = 0.15, name: str = "drift",
    current_label: str = "this run", reference_label: str = "its baseline run",
    pooled: tuple[float, float] | None = None, judged: str | None = None,
) -> DriftVerdict | None:
    """Run the Evidently report and save ``<out_dir>/<name>.html`` and ``<name>.json``.

    Args:
        current: this run's per-prompt results. reference: the baseline run's.
        out_dir: created if missing. acceptance_threshold: for the mean-acceptance test.
        relative_drop: adds a test "mean acceptance >= (1 - drop) x baseline mean" (None: skip).
        current_label / reference_label: what the two sides are (e.g. ``specdec-pair v2, night
            2026-11-30``), written at the top of the HTML with how to read it (:func:`explanation`).
        pooled: specdec's pooled acceptance rates (current, reference), quoted next to Evidently's mean.
        judged: the column the threshold tests judge (default: the default acceptance policy's metric,
            ``acceptance_rate``; ``per_token_acceptance`` with the per-token estimator: the caller
            passes its policy's).
    Returns:
        The :class:`DriftVerdict` read back from the saved JSON, or ``None`` when fewer than two
        measured prompts exist on either side for every column (nothing to compare).
    """
    os.environ.setdefault("DO_NOT_TRACK", "1")  # Evidently telemetry off unless the user opts in
    from evidently import DataDefinition, Dataset, Report
    from evidently.metrics import MeanValue, ValueDrift
    from evidently.tests import gte

    cur, ref = prompts_frame(current), prompts_frame(reference)
    cols = _usable(cur, ref)
    if not cols:
        return None
    cur, ref = cur[cols], ref[cols]
    definition = DataDefinition(numerical_columns=cols)
    metrics: list[Any] = [ValueDrift(column=c, method=DRIFT_METHOD, threshold=DRIFT_THRESHOLD) for c in cols]
    if judged is None:
        from specdec.policy import AcceptancePolicy

        judged = AcceptancePolicy().metric
    if judged in cols:
        tests = [gte(acceptance_threshold)]
        base_mean = float(ref[judged].mean())
        if relative_drop is not None and not math.isnan(base_mean):
            tests.append(gte(round(base_mean * (1.0 - relative_drop), 6)))
        metrics.append(MeanValue(column=judged, tests=tests))
    report = Report(metrics, include_tests=True)
    snapshot = report.run(Dataset.from_pandas(cur, data_definition=definition),
                          Dataset.from_pandas(ref, data_definition=definition))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    html, js = out / f"{name}.html", out / f"{name}.json"
    snapshot.save_html(str(html))
    _with_header(html, explanation(cur, ref, current_label=current_label, reference_label=reference_label, pooled=pooled))
    snapshot.save_json(str(js))
    return read_verdict(js, html_path=html)


def read_verdict(json_path: str | Path, *, html_path: str | Path | None = None) -> DriftVerdict:
    """Parse a saved Evidently snapshot JSON (``{"metrics": [...], "tests": [...]}``).

    Drift per column comes from the ``ValueDrift`` metrics (value = K-S p-value, config holds the
    method and threshold) and the status of the test bound to each metric id.

    Raises:
        ValueError: the file is not an Evidently snapshot JSON.
    """
    d = json.loads(Path(json_path).read_text())
    if not isinstance(d, dict) or "metrics" not in d:
        raise ValueError(f"{json_path}: not an Evidently snapshot JSON")
    tests = d.get("tests") or []
    status_by_metric: dict[str, list[str]] = {}
    for t in tests:
        mid = (t.get("metric_config") or {}).get("metric_id")
        status_by_metric.setdefault(mid, []).append(t.get("status"))
    columns: dict[str, ColumnDrift] = {}
    for m in d["metrics"]:
        cfg = m.get("config") or {}
        if cfg.get("type", "").endswith(":ValueDrift"):
            col = cfg["column"]
            statuses = status_by_metric.get(m.get("id"), [])
            value = m.get("value")
            columns[col] = ColumnDrift(col, cfg.get("method"), value, cfg.get("threshold"),
                                       drifted="FAIL" in statuses)
    return DriftVerdict(
        html_path=str(html_path or Path(json_path).with_suffix(".html")), json_path=str(json_path),
        columns=columns,
        tests=[{"name": t.get("name"), "status": t.get("status"), "description": t.get("description")}
               for t in tests],
    )
