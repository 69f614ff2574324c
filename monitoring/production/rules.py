"""Production windows through the same drift rules, plus the representativeness rule.

* The health rules are :func:`monitoring.rules.evaluate` unchanged (absolute < 0.40 with the CI
  upper end below it, relative drop and collapse against the previous *passing window* of the same
  source and model; the measurement rule has no teacher-forced α in production and is
  ``not_applicable``). Their verdict drives the incident of scope ``production:<source>``.
* ``representativeness``: the production acceptance and the nightly champion run's (same pair
  version; the policy's metric: per-token by default, which compares across k; the acceptance rate
  only at the same k) have non-overlapping 95% CIs: "held-out set or serving stack differs from
  traffic". It has its own incident (scope ``representativeness:<source>``), so a healthy
  production that merely disagrees with the nightly number never holds the health incident open.
"""

from __future__ import annotations

import math
import re

from monitoring import history, rules
from monitoring.db import Database, ValidationRun
from monitoring.production import store
from monitoring.rules import FIRING, INSUFFICIENT, NOT_APPLICABLE, OK, OVERALL, Evaluation, RuleResult
from monitoring.settings import MonitoringSettings, RuleSettings
from specdec.policy import Floor
from specdec.validation.report import GroupMetrics, group_metrics_from_dict

REPRESENTATIVENESS = rules.REPRESENTATIVENESS
DIFFERS = "held-out set or serving stack differs from traffic"


def _num(x) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def _ci(pair) -> tuple[float, float] | None:
    if not pair or len(pair) < 2 or _num(pair[0]) is None or _num(pair[1]) is None:
        return None
    return float(pair[0]), float(pair[1])


def representativeness_rule(production: GroupMetrics, nightly: GroupMetrics | None, settings: RuleSettings,
                            nightly_label: str | None = None) -> RuleResult:
    """Do production and the nightly champion run disagree beyond their 95% CIs?

    Args:
        production: the window's metrics. nightly: the nightly run's overall metrics (``None``: no
            run to compare with). settings: ``min_draft_tokens`` is the evidence both sides need.
        nightly_label: e.g. ``"specdec-pair v3 (run 12, 2026-11-28) on spec_bench@1"``, for the message.
    Returns:
        :class:`monitoring.rules.RuleResult` (``rule="representativeness"``, ``baseline`` = the
        nightly rate). Fires when the intervals do not overlap; ``not_applicable`` without a nightly
        run or with a different k; ``insufficient_evidence`` when either side lacks tokens or a CI.
    """
    policy = settings.policy
    value, ci = policy.judged(production)
    name = policy.metric_label
    n = int(production.num_draft_tokens or 0)
    common = dict(rule=REPRESENTATIVENESS, scope=OVERALL, metric=policy.metric, value=value, ci=ci,
                  num_draft_tokens=n)
    if nightly is None:
        return RuleResult(status=NOT_APPLICABLE, message="no nightly run of the served pair version to compare with",
                          **common)
    base, base_ci = policy.judged(nightly)
    common["baseline"] = base
    where = f" ({nightly_label})" if nightly_label else ""
    k_p, k_n = production.num_speculative_tokens, nightly.num_speculative_tokens
    if policy.estimator == "pooled" and k_p and k_n and k_p != k_n:  # the per-token metric compares across k
        return RuleResult(status=NOT_APPLICABLE, **common, message=(
            f"production drafts k={k_p}, the nightly run{where} used k={k_n}: not comparable"))
    if value is None or ci is None or n < policy.min_draft_tokens:
        return RuleResult(status=INSUFFICIENT, **common, message=(
            f"production {name} on {n} draft tokens without a usable CI: not enough evidence to compare"))
    if base is None or base_ci is None or int(nightly.num_draft_tokens or 0) < policy.min_draft_tokens:
        return RuleResult(status=INSUFFICIENT, **common, message=(
            f"the nightly run{where} has no usable {name} CI: not enough evidence to compare"))
    text = (f"production {name} {value:.3f} (95% CI {ci[0]:.3f}-{ci[1]:.3f}, k={k_p or '?'}) vs nightly champion "
            f"{base:.3f} (95% CI {base_ci[0]:.3f}-{base_ci[1]:.3f}, k={k_n or '?'}){where}")
    if ci[1] < base_ci[0] or base_ci[1] < ci[0]:
        return RuleResult(status=FIRING, **common, message=f"{text}: {DIFFERS}")
    return RuleResult(status=OK, **common, message=f"{text}: consistent")


def _window_label(row: ValidationRun) -> str:
    return f"{row.pair_name} v{row.pair_version} (window ending {row.heldout_version}, run {row.id})"


def _nightly_label(row: ValidationRun) -> str:
    return (f"{row.pair_name} v{row.pair_version} run {row.id}, {row.scheduled_date.isoformat()}, "
            f"on {row.heldout_name}@{row.heldout_version}")


def production_hint(current: ValidationRun, baseline: ValidationRun | None, rep: RuleResult) -> str:
    """Likely cause of a production health problem, from the nightly comparison and the versions."""
    bits = []
    if baseline is not None and baseline.pair_version != current.pair_version:
        bits.append(f"pair version changed since the last passing window (v{baseline.pair_version} -> "
                    f"v{current.pair_version})")
    if rep.status == FIRING and rep.value is not None and rep.baseline is not None and rep.value < rep.baseline:
        bits.append("production is below the nightly champion on the held-out set: traffic or the serving "
                    f"stack (engine version, speculative config) changed, not the pair; {DIFFERS}")
    elif rep.status == FIRING:
        bits.append(f"production is above the nightly champion on the held-out set: {DIFFERS}")
    elif rep.status == OK:
        bits.append("the nightly champion run measures the same acceptance on the held-out set: the pair "
                    "itself is weak here; re-derive or retrain the draft")
    else:
        bits.append(f"cannot compare with the nightly run ({rep.message})")
    return "; ".join(bits)


def floor_of_nightly(ref: ValidationRun | None, settings: RuleSettings) -> RuleSettings:
    """``settings`` with the floor the served pair version's nightly run was judged by (its stored overall
    floor result: a pair version's own floor, tag ``acceptance_floor``, reaches production this way), or
    ``settings`` as they are without such a run."""
    found = next((r for r in (ref.rule_results or []) if r.get("rule") == "absolute" and r.get("scope") == OVERALL
                  and r.get("threshold") is not None), None) if ref is not None else None
    if found is None:
        return settings
    m = re.search(r"floor [0-9.]+ \(([^)]*)\)", found.get("message") or "")
    return settings.for_floor(Floor(float(found["threshold"]), m.group(1) if m else settings.policy.floor_source))


def evaluate_window(db: Database, run_id: int, *, settings: MonitoringSettings) -> Evaluation:
    """Evaluate the health rules and the representativeness rule on a recorded window; store them. The floor
    is the one the served pair version's nightly run was judged by (:func:`floor_of_nightly`).

    The row's status becomes the health verdict; ``rule_results`` holds every result (health rules,
    then representativeness); ``baseline_run_id`` the previous passing window.

    Raises:
        KeyError: unknown run. ValueError: the run has no recorded metrics.
    """
    row = history.get_run(db, run_id)
    if row is None:
        raise KeyError(f"no validation run {run_id}")
    current = history.snapshot_of(row)
    base_row = store.previous_passing_window(db, run_id)
    baseline = history.snapshot_of(base_row) if base_row is not None else None
    ref = store.nightly_reference(db, row.pair_name, row.pair_version, row.alias or "champion")
    health = rules.evaluate(current, baseline, floor_of_nightly(ref, settings.rules))
    ref_label = _nightly_label(ref) if ref is not None else None
    rep = representativeness_rule(current.overall, group_metrics_from_dict(ref.overall) if ref else None,
                                  settings.rules, ref_label)
    verdict = rules.verdict(health)
    hint = production_hint(row, base_row, rep)
    history.set_evaluation(db, run_id, status=verdict, rule_results=[r.to_dict() for r in health + [rep]],
                           root_cause_hint=hint, baseline_run_id=base_row.id if base_row else None)
    return Evaluation(run_id, verdict, health, hint, base_row.id if base_row else None,
                      _window_label(base_row) if base_row else None, representativeness=rep,
                      nightly_run_id=ref.id if ref else None, nightly_label=ref_label)
