"""The monitoring steps of a validation, composed from history, rules, the Evidently report and alerts.

Step by step (what :func:`record_evidence` then :func:`alert_evidence` compose; the nightly flow calls
the first, logs its MLflow run, then calls the second with the run's links)::

    db = monitoring.connect(settings)                            # migrates to head
    claim = history.claim_run(db, key, alias="champion")         # RunAlreadyClaimed -> exit
    ... validate ...                                             # history.mark_error on failure
    run_id = history.record_run(db, report, key, lineage, claim=claim, alias="champion")
    ev = evaluate_run(db, run_id, champion_version="3", settings=settings)  # rules + hint, sets status
    drift = drift_evidence(db, ev, settings=settings)            # Evidently HTML + JSON, or None
    ... log the MLflow run; history.mark_mlflow_logged(db, run_id, mlflow_run_id) ...
    outcome = alert(db, ev, links={"Evidently report": drift.html_path, "MLflow run": url}, settings=settings)

or all at once with :func:`record_and_evaluate`. Everything crossing this boundary is plain data;
``settings`` (:class:`monitoring.settings.MonitoringSettings`) is handed down by the caller (the CLI or
the flow builds it at the edge).
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from monitoring import alerts, history, rules
from monitoring.db import Database
from monitoring.rules import Evaluation
from monitoring.settings import MonitoringSettings
from specdec.validation.report import ValidationReport

log = logging.getLogger(__name__)


@dataclass
class MonitoringOutcome:
    """Everything :func:`record_evidence` (then :func:`alert_evidence`) did: ``alert`` is ``None`` until alerted."""

    run_id: int
    evaluation: Evaluation
    drift: object | None  # monitoring.evidently_report.DriftVerdict
    alert: alerts.AlertOutcome | None = None
    links: dict[str, str] = field(default_factory=dict)


def evaluate_run(
    db: Database, run_id: int, *, champion_version: str | int | None = None,
    champion_alias: str = "champion", settings: MonitoringSettings,
    extra_results: list[rules.RuleResult] | None = None,
) -> Evaluation:
    """Evaluate the drift rules on a recorded run against its baseline; store the outcome.

    The baseline is the last passing run of the champion: pair version ``champion_version`` when
    given, else runs whose ``alias`` is ``champion_alias`` (see :func:`history.find_baseline`).
    ``extra_results`` (e.g. the nightly's promotion-gate criteria beyond acceptance, rule ``gate``) are
    judged with the rules. The run's status becomes the one verdict word (:func:`rules.verdict`).

    Raises:
        KeyError: unknown run. ValueError: the run has no recorded metrics.
    """
    current = history.snapshot(db, run_id)
    base_row = history.find_baseline(db, run_id, champion_version=champion_version,
                                     champion_alias=champion_alias)
    baseline = history.snapshot_of(base_row) if base_row is not None else None
    results = rules.evaluate(current, baseline, settings.rules) + list(extra_results or [])
    row = history.get_run(db, run_id)
    hint = rules.root_cause_hint(current.lineage, baseline.lineage if baseline else None,
                                 drafter_kind=row.drafter_kind, drafter_ref=row.drafter_ref)
    verdict = rules.verdict(results)
    history.set_evaluation(db, run_id, status=verdict, rule_results=[r.to_dict() for r in results],
                           root_cause_hint=hint, baseline_run_id=base_row.id if base_row else None)
    return Evaluation(run_id, verdict, results, hint, base_row.id if base_row else None,
                      baseline.describe() if baseline else None)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:100] or "pair"


def drift_report(
    db: Database, evaluation: Evaluation, *, settings: MonitoringSettings, out_dir: str | Path | None = None,
):
    """Evidently report of the run against its baseline, saved and attached to the history row.

    Args:
        out_dir: default ``<reports_dir>/<pair>/run-<id>/`` (files ``drift.html``, ``drift.json``).
    Returns:
        :class:`monitoring.evidently_report.DriftVerdict`, or ``None`` without a baseline or
        without enough measured prompts.
    """
    from monitoring import evidently_report

    if evaluation.baseline_run_id is None:
        log.info("run %s: no passing baseline run yet, so no Evidently drift report", evaluation.run_id)
        return None
    row = history.get_run(db, evaluation.run_id)
    out = Path(out_dir) if out_dir else settings.reports_dir / _safe(row.pair_name) / f"run-{row.id}"
    base = history.get_run(db, evaluation.baseline_run_id)
    verdict = evidently_report.build_report(
        history.prompt_results(db, evaluation.run_id),
        history.prompt_results(db, evaluation.baseline_run_id), out,
        acceptance_threshold=settings.rules.policy.threshold,
        relative_drop=settings.rules.relative_drop,
        judged=settings.rules.policy.metric,
        current_label=f"{row.pair_name} v{row.pair_version}, night {row.scheduled_date} (history run {row.id})",
        reference_label=f"{base.pair_name} v{base.pair_version}, night {base.scheduled_date} (history run {base.id}, "
                        "the last passing run of the champion)",
        pooled=(row.acceptance_rate, base.acceptance_rate) if None not in (row.acceptance_rate, base.acceptance_rate) else None,
    )
    if verdict is not None:
        history.attach_evidently(db, evaluation.run_id, html_path=verdict.html_path,
                                 json_path=verdict.json_path, verdict=verdict.to_dict())
    else:
        log.warning("run %s: Evidently drift report skipped: fewer than two measured prompts in this run or "
                    "its baseline (run %s); a drift test needs at least two per side",
                    evaluation.run_id, evaluation.baseline_run_id)
    return verdict


def alert(
    db: Database, evaluation: Evaluation, *, settings: MonitoringSettings, links: dict[str, str] | None = None,
    scope: str | None = None, now: dt.datetime | None = None, client: httpx.Client | None = None,
) -> alerts.AlertOutcome:
    """Run the incident lifecycle for an evaluated run and deliver what is due (plus old pending).

    A run older (by scheduled date) than an already evaluated run of the same pair and scope
    changes no incident; pending deliveries are still sent.

    Args:
        links: name -> URL/path shown in the message (MLflow run, Evidently report).
        scope: incident scope. Default: the run's alias (``champion``/``challenger``), else ``""``.
            So a failing challenger and a passing champion of the same pair validated the same
            night do not open and resolve one incident in turn; pass ``""`` to track the pair as
            a whole across aliases.
    """
    row = history.get_run(db, evaluation.run_id)
    if scope is None:
        scope = row.alias or ""
    newer = history.newer_evaluated_run(db, row.id, alias=scope or None)
    if newer is not None:  # a late retry of an older night must not flip the incident
        log.info("run %s is older than evaluated run %s: incident left as is", row.id, newer.id)
        return alerts.AlertOutcome(None, None, evaluation.verdict,
                                   alerts.deliver_pending(db, settings=settings, now=now, client=client))
    ctx = alerts.AlertContext(
        pair_name=row.pair_name, pair_version=row.pair_version, run_id=row.id, scope=scope,
        alias=row.alias, heldout=f"{row.heldout_name}@{row.heldout_version}",
        num_speculative_tokens=row.num_speculative_tokens, target_hash=row.target_hash,
        draft_hash=row.draft_hash, baseline=evaluation.baseline_label, target_ref=row.target_ref,
        draft_ref=row.drafter_ref, drafter_kind=row.drafter_kind,
        root_cause_hint=evaluation.root_cause_hint, links=dict(links or {}),
        changed=_changed(row, history.get_run(db, evaluation.baseline_run_id) if evaluation.baseline_run_id else None),
    )
    return alerts.process(db, ctx, evaluation.results, settings=settings, now=now, client=client)


def _changed(row, base) -> str | None:
    """``target`` | ``draft`` | ``both`` | None: which weights differ between a run and its baseline run
    (unknown hashes count as unchanged, as in :func:`rules.root_cause_hint`)."""
    if base is None:
        return None
    t, d = ((a is not None and b is not None and a != b) for a, b in
            ((row.target_hash, base.target_hash), (row.draft_hash, base.draft_hash)))
    return "both" if t and d else "target" if t else "draft" if d else None


def drift_evidence(db: Database, evaluation: Evaluation, *, settings: MonitoringSettings,
                   out_dir: str | Path | None = None):
    """:func:`drift_report`, best-effort: the report is evidence, not the alert path.

    Returns:
        the :class:`monitoring.evidently_report.DriftVerdict`, or ``None`` (no baseline, too few
        prompts, or the report failed: that is logged with its type and the alert still goes out).
    """
    try:
        return drift_report(db, evaluation, settings=settings, out_dir=out_dir)
    except Exception as exc:  # noqa: BLE001 (Evidently, pandas and the filesystem raise many types; none may block the alert)
        log.error("Evidently report for run %s failed: %s: %s (the alert still goes out)", evaluation.run_id,
                  type(exc).__name__, exc, exc_info=log.isEnabledFor(logging.DEBUG))
        return None


def record_evidence(
    db: Database, report: ValidationReport, key: history.RunKey, lineage: history.Lineage, *,
    settings: MonitoringSettings, claim: history.Claim | None = None, alias: str | None = None,
    champion_version: str | int | None = None, links: dict[str, str] | None = None, evidently: bool = True,
    now: dt.datetime | None = None, evidently_dir: str | Path | None = None,
    extra_results: list[rules.RuleResult] | None = None,
) -> MonitoringOutcome:
    """Record ``report`` (:func:`history.record_run` on ``key``), evaluate the rules, build the Evidently
    report: everything before the alert (:func:`alert_evidence`).

    The history row and the rules always happen; the Evidently report is best-effort (:func:`drift_evidence`).

    Args:
        links: name -> URL/path known already (the Evidently report's path is added after them).
        evidently_dir: where the Evidently files go (default: see :func:`drift_report`).
        extra_results: more rule results judged with the rules (:func:`evaluate_run`).
    Returns:
        :class:`MonitoringOutcome` without ``alert``; ``links`` holds ``links`` and the Evidently report.
    Raises:
        RunAlreadyClaimed: the claim was lost / another live run holds the key.
    """
    run_id = history.record_run(db, report, key, lineage, claim=claim, alias=alias, now=now)
    ev = evaluate_run(db, run_id, champion_version=champion_version, settings=settings, extra_results=extra_results)
    drift, links = None, dict(links or {})
    if evidently:
        drift = drift_evidence(db, ev, settings=settings, out_dir=evidently_dir)
        if drift is not None:
            links.setdefault("Evidently report", str(drift.html_path))
    elif ev.baseline_run_id is not None:
        log.info("run %s: Evidently report skipped (disabled)", run_id)
    return MonitoringOutcome(run_id, ev, drift, links=links)


def alert_evidence(
    db: Database, evidence: MonitoringOutcome, *, settings: MonitoringSettings, links: dict[str, str] | None = None,
    scope: str | None = None, now: dt.datetime | None = None, client: httpx.Client | None = None,
) -> MonitoringOutcome:
    """The alert step after :func:`record_evidence` (:func:`alert`), with ``links`` (the MLflow run...) added
    after the evidence's (a name in both: ``links``' URL); ``scope`` as :func:`alert`.

    Returns:
        ``evidence`` with its ``alert`` set and the links the alert carried.
    """
    merged = {**evidence.links, **(links or {})}
    outcome = alert(db, evidence.evaluation, links=merged, scope=scope, settings=settings, now=now, client=client)
    return MonitoringOutcome(evidence.run_id, evidence.evaluation, evidence.drift, outcome, merged)


def record_and_evaluate(
    db: Database, report: ValidationReport, key: history.RunKey, lineage: history.Lineage, *,
    settings: MonitoringSettings, scope: str | None = None, client: httpx.Client | None = None, **record: object,
) -> MonitoringOutcome:
    """:func:`record_evidence` then :func:`alert_evidence` at once (no step between them).

    Args:
        scope / client: as :func:`alert_evidence`. record: the keywords of :func:`record_evidence`
            (claim, alias, champion_version, links, evidently, now, evidently_dir, extra_results).
    Returns:
        :class:`MonitoringOutcome`. Raises: as :func:`record_evidence`.
    """
    evidence = record_evidence(db, report, key, lineage, settings=settings, **record)
    return alert_evidence(db, evidence, settings=settings, scope=scope, now=record.get("now"), client=client)


def alert_broken(
    db: Database, pair_name: str, alias: str, message: str, *, settings: MonitoringSettings,
    version: str | None = None, now: dt.datetime | None = None, client: httpx.Client | None = None,
) -> alerts.AlertOutcome:
    """One alert for a (pair, alias) that could not be validated at all: a broken alias, a pair
    version or model that no longer exists, a model that does not load, a validation that raised.

    It is an incident of scope ``alias`` like a failing validation (a rule ``reference`` that
    fires), so it is sent once, reminded daily while it stays broken, and resolved by the next
    passing validation of that alias.

    Args:
        message: one line saying what is broken (shown in the alert; no secrets).
        version: the pair version, when known.
    """
    result = rules.RuleResult(rule="reference", scope=rules.OVERALL, status=rules.FIRING, metric="reference",
                              message=message)
    ctx = alerts.AlertContext(pair_name=pair_name, pair_version=version or "?", scope=alias, alias=alias,
                              root_cause_hint="nothing was validated for this alias tonight; fix the reference "
                                              "in MLflow (aliases, versions, models) or the error above")
    return alerts.process(db, ctx, [result], settings=settings, now=now, client=client)
