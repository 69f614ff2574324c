"""Monitoring: validation history in SQL, drift rules, Evidently reports, Slack/webhook alerts.

Consumes :class:`specdec.validation.report.ValidationReport`; never imports ``registry`` or ``flows`` (lineage
facts come in as plain data). Public API (imported lazily, so ``specdec --help`` stays fast)::

    from monitoring import (connect, RunKey, Lineage, RunAlreadyClaimed, record_and_evaluate,
                            evaluate_run, drift_report, alert, MonitoringSettings)
    from monitoring import history, rules, alerts, evidently_report
"""

from __future__ import annotations

from specdec.lazy import lazy_exports

_EXPORTS = {
    "connect": "monitoring.db",
    "Database": "monitoring.db",
    "RunKey": "monitoring.history",
    "Lineage": "monitoring.history",
    "Claim": "monitoring.history",
    "RunAlreadyClaimed": "monitoring.history",
    "config_hash": "monitoring.history",
    "record_and_evaluate": "monitoring.pipeline",
    "evaluate_run": "monitoring.pipeline",
    "drift_report": "monitoring.pipeline",
    "alert": "monitoring.pipeline",
    "Evaluation": "monitoring.rules",
    "MonitoringOutcome": "monitoring.pipeline",
    "MonitoringSettings": "monitoring.settings",
    "get_settings": "monitoring.settings",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
