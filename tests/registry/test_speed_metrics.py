"""Speed evidence reaches the MLflow run: metrics, pair-version tags, and the trend plot's series."""

from __future__ import annotations

import math

from tests.support.reports import make_report
from registry.runs import report_metrics, validation_tags
from tests.support.gate import policy_gate


def test_speed_metrics_and_tags():
    rep = make_report(0.9, num_prompts=12)
    g = rep.overall
    g.speedup, g.speedup_ci, g.load_avg_1m, g.load_avg_1m_max, g.num_cpus = 1.21, [1.12, 1.30], 2.1, 2.4, 2
    m = report_metrics(rep)
    assert (m["speedup"], m["speedup_ci_low"], m["speedup_ci_high"]) == (1.21, 1.12, 1.30)
    assert (m["load_avg_1m"], m["load_avg_1m_max"], m["num_cpus"]) == (2.1, 2.4, 2.0)
    assert "predicted_speedup" in m
    tags = validation_tags(status="passed", run_id="r", metrics=m, gate=policy_gate())
    assert tags["speedup"] == "1.21"
    g.speedup_ci = [math.nan, math.nan]
    assert "speedup_ci_low" not in report_metrics(rep)


def test_trend_plot_with_speedup(tmp_path):
    import datetime as dt

    from registry import plots

    t0 = dt.datetime(2026, 11, 28, tzinfo=dt.timezone.utc)
    hist = [{"time": t0 + dt.timedelta(days=i), "acceptance_rate": a, "acceptance_rate_ci_low": a - 0.05,
             "per_token_acceptance": a, "per_token_acceptance_ci_low": a - 0.05, "pair_version": str(i + 1), "speedup": s, "speedup_ci_low": s - 0.1, "speedup_ci_high": s + 0.1}
            for i, (a, s) in enumerate([(0.95, 1.2), (0.23, 0.45), (0.96, 1.22)])]
    floor = dict(threshold=0.4, estimator="pooled")
    with_speed = plots.plot_trend(hist, tmp_path / "a.png", **floor)
    without = plots.plot_trend([{k: v for k, v in h.items() if not k.startswith("speedup")} for h in hist],
                               tmp_path / "b.png", **floor)
    assert with_speed.stat().st_size > 0 and with_speed.read_bytes() != without.read_bytes()
