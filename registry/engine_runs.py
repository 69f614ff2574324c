"""An engine check of a pair version as an MLflow run (the nightly's engine step, :mod:`flows.engine_check`).

The run holds the engine's and the core's acceptance rate with their CIs and the difference as metrics,
the verdict and the source (``engine:llamacpp``) as tags, and ``engine_check.json`` (the whole report:
per-prompt rows, the fingerprint, the audit, the speed) as its evidence. It lives in its own experiment
(:data:`ENGINE_CHECK_EXPERIMENT`), so the promotion gate, which reads the validation experiment, never
mistakes an engine check for a validation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from registry.service import Registry, mlflow_errors

ENGINE_CHECK_EXPERIMENT = "specdec-engine-checks"
_METRICS = {"engine_acceptance_rate": "engine_acceptance_rate", "core_acceptance_rate": "core_acceptance_rate",
            "difference": "acceptance_rate_difference"}


def engine_check_metrics(overall: Mapping[str, Any]) -> dict[str, float]:
    """The finite figures of an engine check's ``overall`` group (its ``to_dict()``) as MLflow metrics:
    each rate, the difference and their 95% CI bounds (``..._ci_low`` / ``..._ci_high``)."""
    out: dict[str, float] = {}
    for key, name in _METRICS.items():
        value, ci = overall.get(key), overall.get(f"{key}_ci") or []
        for suffix, v in (("", value), *zip(("_ci_low", "_ci_high"), ci)):
            if isinstance(v, (int, float)) and math.isfinite(v):
                out[f"{name}{suffix}"] = float(v)
    return out


def log_engine_check(pair: str, version: str | int, report_file: str | Path, report: Mapping[str, Any], *,
                     source: str, night: str, registry: Registry) -> str:
    """Log one engine check of a pair version as a finished MLflow run; returns its id.

    Args:
        report_file: the written ``engine_check.json`` (logged as the run's artifact).
        report: the same report as a dict (``EngineCheckReport.to_dict()``).
        source: the history source (``engine:llamacpp``); night: the scheduled date (ISO).
    Raises:
        RegistryUnavailable: the server did not answer; MLflow's errors otherwise. A run that fails after
        it was created is ended FAILED.
    """
    client = registry.client
    with mlflow_errors(client.tracking_uri):
        eid = registry.experiment(ENGINE_CHECK_EXPERIMENT)
        tags = {"specdec.pair": pair, "specdec.pair_version": str(version),
                "specdec.pair_uri": f"models:/{pair}/{version}", "specdec.source": source,
                "specdec.engine_check.verdict": str(report.get("verdict")),
                "specdec.engine_check.url": str(report.get("url")),
                "specdec.validation.heldout": f"{report.get('heldout_name')}@{report.get('heldout_version')}"}
        run_id = client.create_run(eid, run_name=f"{pair} v{version} {source} night {night}", tags=tags).info.run_id
        try:
            for name, value in engine_check_metrics(report.get("overall") or {}).items():
                client.log_metric(run_id, name, value)
            client.log_artifact(run_id, str(report_file))
        except BaseException:  # noqa: BLE001 (re-raised: a half-logged run must not look finished)
            client.set_terminated(run_id, "FAILED")
            raise
        client.set_terminated(run_id, "FINISHED")
    return run_id
