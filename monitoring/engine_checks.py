"""Engine checks in the history store, their rules and their incidents: attribution of an acceptance
drop to the serving stack or to the pair.

Row layout (as production windows, so the nightly's queries never see these rows):

* ``source = engine``, ``engine`` the engine (e.g. ``llamacpp``), ``heldout_name`` / ``heldout_version`` the
  held-out set's, ``scheduled_date`` the night (every surface shows the source as ``engine:<engine>``,
  :func:`monitoring.history.source_label`);
* the acceptance columns hold **the engine's own counters** (what users get), so the drift rules and
  the incident lifecycle apply to them unchanged;
* ``config`` holds what identifies the measurement (engine, URL without credentials, k, tokens,
  sampling: hashed into ``config_hash``) and, under ``engine_check``, the evidence that is not part
  of the key: the core's acceptance for the same prompts and tokens, the paired difference and its
  CI, the audit and the engine fingerprint (build, target/draft files and their hashes, flags).

Rules: the usual health rules on the engine's acceptance (floor, relative drop vs the previous passing
check) plus the **engine gap** rule: it fires when the engine accepts credibly less than the core for
the same prompts (the difference CI's upper end below 0), and the **engine serving** rule: it fires on
any finding of the check (the engine serves another target/draft/vocabulary than the registered pair,
its declared flags or its measured per-step counters draft less than the validated rule, its greedy
output leaves the target's; :mod:`specdec.validation.engine_delivery`), whatever the acceptance rate
does. The hint separates the two causes:

* a finding or the gap fires: the serving stack differs (build, kernels, quantization, KV-cache type, flags), not
  the draft; the fingerprint's change since the last passing check is named as the likely cause;
* the engine fell while the gap is closed: the core falls with it, so the draft no longer fits the
  target (re-derive or re-train it).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict
from typing import Any

import httpx
from sqlalchemy import select

from monitoring import alerts, history, rules
from monitoring.db import ENGINE, PASSED, Database, ValidationRun, utcnow
from monitoring.rules import FIRING, INSUFFICIENT, OK, Evaluation, RuleResult
from monitoring.settings import MonitoringSettings
from specdec.core.stats import per_token_acceptance
from specdec.validation.engine_report import EngineCheckReport
from specdec.validation.metrics import bootstrap_ratio_ci
from specdec.validation.report import GroupMetrics, nan_to_none

__all__ = ["ENGINE_GAP_RULE", "ENGINE_SERVING_RULE", "source_of", "engine_record", "record_engine_check", "evaluate_engine_check",
           "alert_engine_check", "alert_engine_error", "fingerprint_changes"]

ENGINE_GAP_RULE = "engine_gap"
ENGINE_SERVING_RULE = "engine_serving"
#: fingerprint fields whose change is named as a likely cause, in the order they are named
FINGERPRINT_FIELDS = ("draft_sha256", "model_sha256", "flags", "build_info", "model_ftype", "model_path",
                      "n_ctx", "total_slots")


def source_of(engine: str) -> str:
    """``engine:<engine>``: how an engine's checks are shown and scoped (history table, MLflow tag ``specdec.source``,
    incident scope); :func:`monitoring.history.source_label` of the row's ``source`` and ``engine`` columns."""
    return history.source_label(ENGINE, engine)


def _metrics(report: EngineCheckReport, rows: list[Any] | None = None, group: Any = None) -> GroupMetrics:
    """The engine's counters of ``group`` (default overall) as :class:`GroupMetrics`, with the floor's
    per-token acceptance: llama.cpp's per-request timings have no drafts count, so each prompt's drafts
    are its drafted tokens over the run's drafted tokens per step (``/metrics`` delta) for the CI."""
    o = group or report.overall
    rows = [r for r in (report.prompts if rows is None else rows) if r.status == "ok"]
    k = int(report.config.get("num_speculative_tokens") or 0)
    g = GroupMetrics(num_prompts=o.num_prompts, num_speculative_tokens=k, num_draft_tokens=o.engine_draft_tokens,
                     num_accepted_tokens=o.engine_accepted_tokens, acceptance_rate=o.engine_acceptance_rate,
                     acceptance_rate_ci=list(o.engine_acceptance_rate_ci))
    if group is None and report.engine_per_position:
        g.accepted_per_position = list(report.engine_per_position)
    if report.engine_num_drafts and report.overall.engine_draft_tokens:
        per_step = report.overall.engine_draft_tokens / report.engine_num_drafts
        drafts = [r.engine_draft_tokens / per_step for r in rows]
        g.num_drafts = int(round(sum(drafts)))
        if g.num_drafts:
            g.mean_accepted_length = 1 + o.engine_accepted_tokens / g.num_drafts
            mean_ci = bootstrap_ratio_ci([r.engine_accepted_tokens for r in rows], drafts)
            g.per_token_acceptance, g.per_token_acceptance_ci = per_token_acceptance(
                sum(drafts), o.engine_draft_tokens, o.engine_accepted_tokens, mean_ci)
    return g


def engine_record(report: EngineCheckReport, *, pair: str, version: str, alias: str, scheduled_date: dt.date,
                  now: dt.datetime) -> history.RunRecord:
    """The :class:`monitoring.history.RunRecord` of one engine check (row layout: the module docstring)."""
    identity = {"engine": report.engine, "url": report.url, "heldout": report.heldout_name,
                **{k: report.config.get(k) for k in ("num_speculative_tokens", "max_new_tokens", "temperature",
                                                     "top_k", "top_p", "seed", "limit")}}
    return history.RunRecord(
        source=ENGINE, engine=report.engine,
        key=history.RunKey(pair, str(version), report.heldout_name[:200], report.heldout_version,
                           history.config_hash(identity), scheduled_date, alias or ""),
        overall=_metrics(report), categories={c: _metrics(report, [r for r in report.prompts if r.category == c], g)
                                              for c, g in report.categories.items()},
        config={**identity, "engine_check": nan_to_none(_evidence(report))}, alias=alias,
        target_ref=report.target_ref, drafter_kind="model", drafter_ref=report.drafter_ref, code_version="",
        wall_seconds=report.wall_seconds, report_created_at=now.isoformat(),
    )


def _evidence(report: EngineCheckReport) -> dict[str, Any]:
    """What the check found that is not part of the row's key (the ``engine_check`` config entry)."""
    o = report.overall
    return {"core_acceptance_rate": o.core_acceptance_rate, "core_acceptance_rate_ci": o.core_acceptance_rate_ci,
            "difference": o.difference, "difference_ci": o.difference_ci, "verdict": report.verdict,
            "audit": report.audit, "speed": report.speed, "fingerprint": report.fingerprint,
            "counters_source": report.counters_source, "core_per_position": report.core_per_position,
            "findings": [{"kind": f.kind, "message": f.message} for f in report.findings],
            "delivery": asdict(report.delivery) if report.delivery else None, "rule": report.rule}


def record_engine_check(db: Database, report: EngineCheckReport, *, pair: str, version: str, alias: str,
                        scheduled_date: dt.date, now: dt.datetime | None = None) -> int:
    """Insert or update the engine-check row of one pair version on one night (:func:`monitoring.history.upsert`
    of :func:`engine_record`); returns its id."""
    now = now or utcnow()
    record = engine_record(report, pair=pair, version=version, alias=alias, scheduled_date=scheduled_date, now=now)
    return history.upsert(db, record, now=now)


def engine_gap_rule(evidence: dict[str, Any], engine: str, tolerance: float = 0.0) -> RuleResult:
    """``engine_gap``: firing when the engine accepts credibly less than the core for the same prompts
    (the difference CI's upper end below ``-tolerance``)."""
    diff, ci = evidence.get("difference"), evidence.get("difference_ci") or [None, None]
    base = dict(rule=ENGINE_GAP_RULE, scope="overall", metric="acceptance_rate (engine - core)", value=diff,
                ci=tuple(ci) if None not in ci else None, threshold=-tolerance,
                baseline=evidence.get("core_acceptance_rate"))
    text = (f"{engine} accepts {_pct(diff)} points vs the core for the same prompts and tokens "
            f"(95% CI {_pct(ci[0])} to {_pct(ci[1])})")
    if diff is None or None in ci:
        return RuleResult(status=INSUFFICIENT, message=f"{engine} vs core: not enough prompts for a CI", **base)
    if ci[1] < -tolerance:
        return RuleResult(status=FIRING, severity="critical", message=text, **base)
    return RuleResult(status=OK, severity="info", message=text, **base)


def engine_serving_rule(evidence: dict[str, Any], engine: str) -> RuleResult:
    """``engine_serving``: firing (critical) on any finding of the check (the module docstring), its message the
    findings joined; ok without."""
    found = [f.get("message", "") for f in evidence.get("findings") or []]
    base = dict(rule=ENGINE_SERVING_RULE, scope="overall", metric="serving stack vs the registered pair")
    if found:
        return RuleResult(status=FIRING, severity="critical", message=f"{engine}: " + "; ".join(found), **base)
    return RuleResult(status=OK, severity="info", message=f"{engine} serves the registered pair under its validated rule",
                      **base)


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{100 * x:+.1f}"


def _previous_passing(db: Database, row: ValidationRun) -> ValidationRun | None:
    with db.session() as s:
        r = ValidationRun
        return s.scalars(select(r).where(*history.same_origin(row.source, row.engine, row.production_source),
                                         r.pair_name == row.pair_name,
                                         r.heldout_name == row.heldout_name, r.status == PASSED, r.id != row.id,
                                         r.scheduled_date <= row.scheduled_date)
                         .order_by(r.scheduled_date.desc(), r.id.desc()).limit(1)).one_or_none()


def fingerprint_changes(before: dict[str, Any] | None, after: dict[str, Any],
                        fields: tuple[str, ...] = FINGERPRINT_FIELDS) -> list[str]:
    """``field: old -> new`` for each of ``fields`` (default llama.cpp's; an engine profile's ``fingerprint_fields``)
    that changed (flags: the differing arguments)."""
    if not before:
        return []
    out = []
    for key in fields:
        a, b = before.get(key), after.get(key)
        if a == b or (a is None and b is None):
            continue
        if key == "flags" and a and b:
            gone, new = [x for x in a if x not in b], [x for x in b if x not in a]
            out.append(f"flags: {' '.join(gone) or '-'} -> {' '.join(new) or '-'}")
        elif key.endswith("sha256"):
            out.append(f"{key.replace('_sha256', ' file')}: sha256 {str(a)[:12]} -> {str(b)[:12]}")
        else:
            out.append(f"{key}: {a} -> {b}")
    return out


def _fields_of(engine: str) -> tuple[str, ...]:
    """The engine profile's fingerprint fields (llama.cpp's for an engine no profile knows)."""
    from specdec.engines.profiles import ENGINE_PROFILES

    profile = ENGINE_PROFILES.get(engine)
    return profile.fingerprint_fields if profile is not None else FINGERPRINT_FIELDS


def _hint(engine: str, gap: RuleResult, health: list[RuleResult], changes: list[str], since: str | None,
          serving: RuleResult | None = None) -> str:
    if serving is not None and serving.firing:
        what = f"; changed since {since}: {'; '.join(changes)}" if changes else ""
        return (f"{serving.message}: the serving stack differs from the validated pair, not the draft{what}; fix the "
                "deployment (the pair's files, its flags), the pair itself needs nothing")
    if gap.firing:
        what = (f"; changed since {since}: {'; '.join(changes)} (the likely cause)" if changes else
                "; nothing in the recorded fingerprint changed (build, files, declared flags): look at what it does not "
                "record (KV-cache type, kernels, runtime settings)")
        return (f"{gap.message}: the serving stack (build, kernels, quantization, KV-cache type, flags) differs from the "
                f"validated pair, not the draft{what}")
    if any(r.firing for r in health):
        return (f"{engine} and the core fell together ({gap.message}): the draft no longer fits the target; "
                "re-derive or re-train the draft")
    return gap.message


def evaluate_engine_check(db: Database, run_id: int, *, settings: MonitoringSettings) -> Evaluation:
    """Health rules (engine counters) + the engine gap rule; stores verdict, results and hint on the row.

    Raises:
        KeyError: unknown run.
    """
    row = history.get_run(db, run_id)
    if row is None:
        raise KeyError(f"no validation run {run_id}")
    engine = row.engine
    evidence = (row.config or {}).get("engine_check") or {}
    base_row = _previous_passing(db, row)
    health = rules.evaluate(history.snapshot_of(row), history.snapshot_of(base_row) if base_row else None, settings.rules)
    gap = engine_gap_rule(evidence, engine, settings.rules.engine_gap_tolerance)
    serving = engine_serving_rule(evidence, engine)
    before = ((base_row.config or {}).get("engine_check") or {}).get("fingerprint") if base_row else None
    since = f"{base_row.scheduled_date.isoformat()} (run {base_row.id})" if base_row else None
    changes = fingerprint_changes(before, evidence.get("fingerprint") or {}, _fields_of(engine))
    hint = _hint(engine, gap, health, changes, since, serving)
    results = health + [gap, serving]
    verdict = rules.verdict(results)
    history.set_evaluation(db, run_id, status=verdict, rule_results=[r.to_dict() for r in results],
                           root_cause_hint=hint, baseline_run_id=base_row.id if base_row else None)
    label = f"{row.pair_name} v{base_row.pair_version} engine check run {base_row.id}" if base_row else None
    return Evaluation(run_id, verdict, results, hint, base_row.id if base_row else None, label)


def alert_engine_check(db: Database, ev: Evaluation, *, settings: MonitoringSettings,
                       now: dt.datetime | None = None, client: httpx.Client | None = None) -> str | None:
    """The incident lifecycle of an evaluated engine check (scope ``engine:<engine>``: one alert per
    incident, one resolve); returns the transition (``fire`` / ``remind-<n>`` / ``resolve`` / None)."""
    row = history.get_run(db, ev.run_id)
    fp = ((row.config or {}).get("engine_check") or {}).get("fingerprint") or {}
    scope = source_of(row.engine)
    where = f"{scope} at {(row.config or {}).get('url')} (build {fp.get('build_info', '?')}) on {row.heldout_name}"
    ctx = alerts.AlertContext(pair_name=row.pair_name, pair_version=row.pair_version, run_id=row.id, scope=scope,
                              alias=row.alias, heldout=where, num_speculative_tokens=row.num_speculative_tokens,
                              baseline=ev.baseline_label, root_cause_hint=ev.root_cause_hint)
    return alerts.process(db, ctx, ev.results, settings=settings, now=now, client=client).transition



def alert_engine_error(db: Database, *, pair: str, version: str, alias: str, engine: str, url: str, message: str,
                       settings: MonitoringSettings, now: dt.datetime | None = None) -> str | None:
    """One alert for an engine check that could not measure the engine at all (unreachable, stalled past its
    deadline, a malformed or impossible answer, a synthetic-acceptance mode): an incident of the engine's
    scope (``engine:<engine>``, like a failing engine check, so the next healthy check resolves it), with a hint
    that names the serving stack, not the pair. Returns the transition (``fire`` / ``remind-<n>`` / None).

    Args:
        message: one line saying what went wrong (no credentials: URLs are shown without them).
    """
    result = RuleResult(rule="engine_error", scope="overall", status=FIRING, severity="critical",
                        metric="engine check", message=message)
    ctx = alerts.AlertContext(pair_name=pair, pair_version=str(version), scope=source_of(engine), alias=alias,
                              heldout=f"{source_of(engine)} at {url}",
                              root_cause_hint=f"the engine could not be measured tonight ({message}): look at the "
                                              "serving engine and its endpoint; the pair itself is not implicated")
    return alerts.process(db, ctx, [result], settings=settings, now=now).transition
