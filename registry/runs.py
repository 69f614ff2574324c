"""Validation runs in MLflow: one run per validation of one pair version.

Run (experiment ``specdec-validation``):

- tags: ``specdec.pair``, ``specdec.pair_version``, ``specdec.pair_uri``, ``specdec.target``,
  ``specdec.draft``, ``specdec.drafter_kind``, ``specdec.validation.heldout``, ``validation_status`` (gate verdict),
  ``specdec.gate_reasons``, ``specdec.config_mismatch`` (k/sampling differences vs the pair version).
- params: ``heldout_name``, ``heldout_version``, every key of ``report.config`` (``num_speculative_tokens``,
  ``temperature``, ``top_k``, ``top_p``, ``max_new_tokens``, ``seed``, ``limit``...), ``device``,
  ``dtype``, ``code_version``, ``drafter_kind``. Never a URL or secret.
- metrics (NaN skipped): ``acceptance_rate``, ``acceptance_rate_ci_low/high``, ``mean_accepted_length``,
  ``alpha_tf`` (+ ``_ci_low/high``), ``alpha_hat`` (+ ``_ci_low/high``), ``top1_agreement``,
  ``total_variation``, ``kl_divergence``, ``speedup``, ``predicted_speedup``, ``cost_ratio``,
  ``draft_tokens_per_step``, counters (``num_prompts``, ``num_drafts``, ``num_draft_tokens``,
  ``num_accepted_tokens``, ``num_emitted_tokens``, ``exactness_checked``, ``exactness_mismatches``) and
  every other scalar of ``report.overall``; ``acceptance_rate.pos_<i>`` per draft position, and
  ``<metric>.<category>`` per held-out category (``acceptance_rate``, ``acceptance_rate_ci_low``,
  ``mean_accepted_length``, ``alpha_tf``, ``alpha_hat``, ``top1_agreement``, ``speedup``,
  ``predicted_speedup``, ``num_prompts``, ``exact_rule_acceptance``, ``argmax_rule_acceptance``); both acceptance
  rules overall (``exact_rule_acceptance``, ``argmax_rule_acceptance``, each with ``_ci_low/high`` and ``.pos_<i>``)
  next to the tag ``specdec.acceptance_rule`` (the rule the pair is served under); ``config_mismatch`` (1 if the validation's k/sampling differ
  from the pair version's, which fails the gate).
- artifacts: ``report.json``, ``prompts.csv``, ``plots/per_position_acceptance.png``,
  ``plots/per_category_acceptance.png``, ``plots/acceptance_trend.png`` (acceptance and measured
  speedup with its CI), plus ``extra_artifacts``.

Afterwards the pair version gets the tags ``validation_status``, ``acceptance_rate``, ``speedup`` and
``policy`` and its one-line description (:mod:`registry.describe`); the run gets a readable name
(``<pair> v<version> night <date>``) and the same line plus links as its description.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from datetime import datetime, timezone
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from registry.describe import describe_run, refresh_description, validation_version_tags
from specdec.core.config import SpeculativeConfig
from registry.errors import PairNotFound
from registry.pairfile import full_tags
from registry.pairs import DRAFT_SIDES, get_pair_model_version
from registry.plots import ACCEPTANCE_KEYS, SPEED_KEYS, night_of, write_run_plots
from registry.gate import GateConfig, GateResult, evaluate_gate
from registry.service import Registry, mlflow_errors
from registry.settings import VALIDATION_EXPERIMENT
from specdec import events
from specdec.policy import combine
from specdec.validation.report import PROMPTS_FILE, REPORT_FILE, ValidationReport
from specdec.validation.report_profile import PROFILE_FILE, write_profile

_log = logging.getLogger(__name__)
_CATEGORY_METRICS = ("acceptance_rate", "per_token_acceptance", "mean_accepted_length", "alpha_tf", "alpha_hat", "top1_agreement", "speedup",
                     "predicted_speedup", "num_prompts", "exact_rule_acceptance", "argmax_rule_acceptance")
#: per-draft-position lists of GroupMetrics and their metric prefix (``<prefix>.pos_<i>``)
_POSITION_METRICS = (("per_position_acceptance", "acceptance_rate"),
                     ("conditional_per_position_acceptance", "conditional_acceptance_rate"),
                     ("exact_rule_per_position", "exact_rule_acceptance"),
                     ("argmax_rule_per_position", "argmax_rule_acceptance"))


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))


def metric_key(text: str) -> str:
    """A valid MLflow metric-name piece: characters other than ``[A-Za-z0-9_.-/ ]`` become ``_``, and so does
    an empty, ``.`` or ``..`` path segment (MLflow refuses a name that normalises to another path, e.g. ``../x``)."""
    return "/".join(s if s.strip(" .") else "_" for s in (re.sub(r"[^A-Za-z0-9_.\-/ ]", "_", text) or "_").split("/"))


def report_metrics(report: ValidationReport) -> dict[str, float]:
    """Flatten a report into MLflow metric names -> finite floats (NaN/None dropped).

    Every scalar field of ``report.overall`` (:class:`~specdec.validation.report.GroupMetrics`) is logged under its
    own name (so fields added to the report later are logged too); ``<name>_ci`` intervals become
    ``<name>_ci_low`` / ``<name>_ci_high``; ``per_position_acceptance[i]`` becomes
    ``acceptance_rate.pos_<i>``, ``conditional_per_position_acceptance[i]``
    ``conditional_acceptance_rate.pos_<i>`` and both acceptance rules' per-position rates
    ``exact_rule_acceptance.pos_<i>`` / ``argmax_rule_acceptance.pos_<i>`` (docs/metrics.md); per category, ``<metric>.<category>`` for the metrics in
    ``_CATEGORY_METRICS`` plus ``acceptance_rate_ci_low.<category>``. Also ``wall_seconds`` and
    ``num_skipped_prompts``.
    """
    from dataclasses import fields

    out: dict[str, float] = {}
    g = report.overall
    for f in fields(g):
        v = getattr(g, f.name)
        if _finite(v):
            out[f.name] = float(v)
        elif f.name.endswith("_ci") and isinstance(v, (list, tuple)) and len(v) == 2:
            base = f.name[: -len("_ci")]
            if _finite(v[0]):
                out[f"{base}_ci_low"] = float(v[0])
            if _finite(v[1]):
                out[f"{base}_ci_high"] = float(v[1])
    for field_name, prefix in _POSITION_METRICS:
        for i, v in enumerate(getattr(g, field_name, None) or []):
            if _finite(v):
                out[f"{prefix}.pos_{i}"] = float(v)
    for cat, cg in report.categories.items():
        key = metric_key(cat)
        for name in _CATEGORY_METRICS:
            v = getattr(cg, name, None)
            if _finite(v):
                out[f"{name}.{key}"] = float(v)
        ci = cg.acceptance_rate_ci or []
        if len(ci) == 2 and _finite(ci[0]):
            out[f"acceptance_rate_ci_low.{key}"] = float(ci[0])
    if _finite(report.wall_seconds):
        out["wall_seconds"] = float(report.wall_seconds)
    out["num_skipped_prompts"] = float(sum(1 for p in report.prompts if p.status != "ok"))
    return out


_SECRET_KEY = re.compile(r"secret|passw|api[_-]?key|access[_-]?token|auth|webhook|credential|^token$|hf_token", re.I)
_SECRET_VALUE = re.compile(r"://|\bhf_[A-Za-z0-9]{20,}|\bsk-[A-Za-z0-9]{20,}|\bxox[a-z]-", re.I)


def _looks_secret(key: str, value: str) -> bool:
    """True for params that must not be logged: URL values (may embed credentials) and secret-like keys."""
    return bool(_SECRET_KEY.search(key)) or (bool(_SECRET_VALUE.search(value)) and not value.startswith("models:/"))


def report_params(report: ValidationReport) -> dict[str, str]:
    """MLflow params of a validation run: held-out name/version, the decoding config, device, dtype and
    code version. Values that look like URLs or secrets are dropped."""
    params: dict[str, Any] = {"heldout_name": report.heldout_name, "heldout_version": report.heldout_version,
                              "device": report.device, "dtype": report.dtype, "code_version": report.code_version,
                              "drafter_kind": report.drafter_kind}
    for k, v in (report.config or {}).items():
        params.setdefault(str(k), v)
    out = {}
    for k, v in params.items():
        s = "none" if v is None else str(v)
        if _looks_secret(str(k), s):
            continue
        out[metric_key(k)] = s[:6000]
    return out


def config_mismatch(report_config: Mapping[str, Any], pair_tags: Mapping[str, str]) -> list[str]:
    """Differences between the decoding config a validation used and the one the pair version serves.

    Both sides go through the one codec (:meth:`specdec.SpeculativeConfig.from_dict` for the
    report's ``config``, :meth:`~specdec.SpeculativeConfig.from_tags` for the pair version's tags),
    so reports and pair versions written before k was renamed compare too. Compares k
    (``num_speculative_tokens``) and the sampling (``temperature``, ``top_k``, ``top_p``);
    ``max_new_tokens`` may differ (validation budgets are often shorter). A side that holds no
    decoding config is not compared.

    Returns:
        one ``"key: validated X, pair serves Y"`` line per difference (empty when they agree).
    """
    try:
        validated = SpeculativeConfig.from_dict(report_config).to_dict()
        served = SpeculativeConfig.from_tags(pair_tags).to_dict()
    except (KeyError, TypeError, ValueError):
        return []
    return [
        f"{key}: validated {validated[key]}, pair serves {served[key]}"
        for key in ("num_speculative_tokens", "temperature", "top_k", "top_p")
        if validated[key] != served[key]
    ]


@dataclass(frozen=True)
class JudgedReport:
    """A report judged by the gate: its MLflow ``metrics`` (with ``config_mismatch``), the config
    differences ``mismatch``, the ``gate`` used (with the pair version's own floor) and its ``result``."""

    metrics: dict[str, float]
    mismatch: list[str]
    gate: GateConfig
    result: GateResult


def judge_report(report: ValidationReport, pair_tags: Mapping[str, str], gate: GateConfig) -> JudgedReport:
    """The gate's verdict on ``report`` for the pair version whose (full) tags are ``pair_tags``: the same
    judgement :func:`log_validation` records, available before any MLflow run exists (the nightly adds its
    non-acceptance part to the drift rules, so one run has one verdict word).

    Raises:
        ValueError: the pair version's ``acceptance_floor`` tag is not a number in [0, 1].
    """
    metrics = report_metrics(report)
    mismatch = config_mismatch(report.config or {}, pair_tags)
    metrics["config_mismatch"] = float(bool(mismatch))
    gate = gate.for_pair(pair_tags)
    return JudgedReport(metrics, mismatch, gate, evaluate_gate(metrics, gate))


def _run_filter(pair: str, version: str | None = None) -> str:
    f = f"tags.`specdec.pair` = '{pair}' and attributes.status = 'FINISHED'"
    if version is not None:
        f += f" and tags.`specdec.pair_version` = '{version}'"
    return f


def client_latest_validation_run(client, pair: str, version: str | int, experiment: str = VALIDATION_EXPERIMENT):
    """The most recent FINISHED validation run of exactly ``pair`` version ``version``:
    ``mlflow.entities.Run`` (``run.data.metrics`` / ``run.data.tags``), or None if never validated."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return None
    runs = client.search_runs([exp.experiment_id], _run_filter(pair, str(version)),
                              order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0] if runs else None




def client_validation_history(client, pair: str, experiment: str = VALIDATION_EXPERIMENT,
                              max_results: int = 200) -> list[dict[str, Any]]:
    """Past finished validation runs of ``pair`` (all versions), oldest first: dicts with ``time``
    (datetime, UTC), ``run_id``, ``pair_version``, ``acceptance_rate``, ``acceptance_rate_ci_low``,
    ``per_token_acceptance``, ``per_token_acceptance_ci_low``,
    ``speedup``, ``speedup_ci_low``, ``speedup_ci_high``, ``predicted_speedup`` (NaN where not logged),
    ``validation_status``."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    runs = client.search_runs([exp.experiment_id], _run_filter(pair), order_by=["attributes.start_time DESC"],
                              max_results=max_results)
    out = []
    for r in reversed(list(runs)):
        m = r.data.metrics
        out.append({"time": datetime.fromtimestamp(r.info.start_time / 1000, timezone.utc), "run_id": r.info.run_id,
                    "night": night_of(r.info.run_name),
                    "pair_version": r.data.tags.get("specdec.pair_version"),
                    **{k: m.get(k, math.nan) for k in ACCEPTANCE_KEYS + SPEED_KEYS},
                    "validation_status": r.data.tags.get("validation_status")})
    return out


def set_validation_tags(pair: str, version: str | int, *, status: str, run_id: str | None,
                        metrics: Mapping[str, float], heldout: str | None = None, reasons: Sequence[str] = (),
                        gate: GateConfig, registry: Registry) -> None:
    """Tag a pair version with its latest validation, so the MLflow UI's version list shows it.

    Tags (:func:`registry.describe.validation_version_tags`): ``validation_status``
    (``passed``/``failed``), ``acceptance_rate``, ``speedup`` (when measured) and ``policy`` (the
    gate's criterion). The run id, time, held-out set and gate reasons live in the validation run.

    Raises:
        ValueError: ``status`` not passed/failed; PairNotFound: no such pair version.
    """
    tags = validation_tags(status=status, run_id=run_id, metrics=metrics, heldout=heldout, reasons=reasons, gate=gate)
    client = registry.client
    with mlflow_errors(client.tracking_uri):
        _set_version_tags(client, pair, str(version), tags)


def validation_tags(*, status: str, run_id: str | None, metrics: Mapping[str, float], heldout: str | None = None,
                    reasons: Sequence[str] = (), gate: GateConfig) -> dict[str, str]:
    """The pair-version tags :func:`set_validation_tags` writes (see there; ``run_id``, ``heldout`` and
    ``reasons`` are recorded in the run, not on the version). Raises ``ValueError`` on a bad status."""
    return validation_version_tags(status, metrics, gate)


def refresh_version(client, pair: str, version: str | int, experiment: str = VALIDATION_EXPERIMENT) -> str:
    """Rewrite pair version ``version``'s one-line description from its latest finished validation run
    (:func:`registry.describe.refresh_description`). Returns the description."""
    return refresh_description(client, pair, str(version), client_latest_validation_run(client, pair, version, experiment))


def _set_version_tags(client, pair: str, version: str, tags: Mapping[str, str]) -> None:
    from mlflow.exceptions import MlflowException

    try:
        for k, v in tags.items():
            client.set_model_version_tag(pair, version, k, v)
    except MlflowException as e:
        if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise PairNotFound(f"pair version models:/{pair}/{version} not found") from e
        raise


def _log_extra(client, run_id: str, paths: Iterable[str | Path]) -> None:
    for p in paths:
        p = Path(p)
        if p.is_dir():
            client.log_artifacts(run_id, str(p), artifact_path=p.name)
        elif p.is_file():
            client.log_artifact(run_id, str(p))
        else:
            raise FileNotFoundError(f"extra artifact not found: {p}")


SERVING_FILE = "serving_config.json"


def serving_config_for(pair_tags: Mapping[str, str], report: ValidationReport) -> dict[str, Any] | None:
    """The serving configuration of the pair's engine profile (``pair.json`` tag ``engine``, default ``vllm``;
    logged as the run's ``serving_config.json``, read back by ``specdec pair show``) at the
    validated k (:func:`specdec.validation.serving.serving_config`); None when it cannot be built
    (unknown engine tag, no k, an engine that cannot serve this drafter as validated).

    Model references are what the engine loads (``<side>.serve_ref``: a Hub id, a checkpoint
    directory or a GGUF file; a target adapter: ``target_adapter.serve_ref``, else its PEFT directory, which only an
    engine whose serving config carries an adapter takes: llama.cpp needs a GGUF adapter). A registered draft without one is named by the directory the
    ``download`` command writes (never an MLflow URI); a derived draft is the target's checkpoint."""
    from specdec.kinds import kind_of
    from registry.changes import drafter_recipe_of
    from specdec.engines.profiles import engine_profile
    from specdec.validation.serving import not_served, serving_config

    k = (report.config or {}).get("num_speculative_tokens")
    kind = pair_tags.get("drafter_kind", report.drafter_kind)
    refused = not_served(kind, k)
    if refused is not None:  # e.g. derived:bf16: no config, the reason (the answer `validate` gives too)
        return refused
    dkind = kind_of(kind)
    target, download = _loadable(pair_tags, "target")
    served_from = DRAFT_SIDES[dkind].served_from
    draft = None  # served_from "none": no draft model
    if served_from == "target":
        draft = target  # the engine loads the target's checkpoint and casts/quantizes/cuts it (recipe)
    elif served_from == "draft":
        draft, d_dl = _loadable(pair_tags, "draft")
        download += d_dl
    adapter, a_dl = _loadable(pair_tags, "target_adapter")  # never dropped: an engine that cannot carry it refuses
    try:
        out = serving_config(engine_profile(pair_tags.get("engine")).name, kind, int(k), draft=draft, target=target,
                             drafter_recipe=drafter_recipe_of({"drafter_kind": kind, **pair_tags}),
                             assistant_confidence_threshold=(report.config or {}).get("assistant_confidence_threshold"),
                             target_adapter=adapter)
    except (TypeError, ValueError) as e:
        _log.warning("no serving configuration for this pair: %s", e)
        return None
    download += a_dl
    if download:
        out["download"] = download
    note = dkind.serving_note(kind)
    if note:
        out["derived"] = note
    return out


def _loadable(tags: Mapping[str, str], side: str) -> tuple[str | None, list[str]]:
    """(what an engine loads for ``side``, the commands that fetch it first)."""
    if tags.get(f"{side}.serve_ref"):
        return tags[f"{side}.serve_ref"], []
    uri = tags.get(side)
    if not uri or uri == "none":
        return None, []
    local = "./" + uri.removeprefix("models:/").replace("/", "-v")
    return local, [f"mlflow artifacts download --artifact-uri {uri} --dst-path {local}"]


def log_validation(
    pair: str,
    version: str | int,
    report: ValidationReport,
    report_dir: str | Path,
    *,
    extra_artifacts: Sequence[str | Path] = (),
    history: Sequence[Mapping[str, Any]] | None = None,
    gate: GateConfig,
    experiment: str = VALIDATION_EXPERIMENT,
    run_name: str | None = None,
    registry: Registry,
    run_key: str | None = None,
    describe: bool = True,
    verdict: str | None = None,
) -> str:
    """Log one validation of a pair version as an MLflow run, then tag the pair version.

    Args:
        pair, version: the pair version validated (must exist).
        report: the :class:`specdec.validation.report.ValidationReport`.
        report_dir: directory holding ``report.json`` + ``prompts.csv`` (written with ``report.write``
            if missing); plots are written to ``<report_dir>/plots``.
        extra_artifacts: more files/directories to attach (e.g. the Evidently HTML/JSON); a directory
            is logged under its own name.
        history: past trend points, oldest first (dicts with ``time``, ``acceptance_rate``,
            optional ``pair_version`` / ``acceptance_rate_ci_low`` / ``source`` / speed keys; the
            nightly hands the history store's points). Default: this pair's past runs read back from
            MLflow (for a validation logged without a history store). This run's point is appended.
        gate: criteria that decide ``validation_status``.
        experiment: MLflow experiment name.
        run_key: idempotency key of this validation (e.g. the nightly history key), stored as tag
            ``specdec.run_key``. Runs of the same key that a crashed process left ``RUNNING`` are
            ended ``FAILED`` and deleted before the new run starts, and older runs of the key are
            deleted once the new one finished: one finished MLflow run per key, however often it
            is retried. The step event ``mlflow`` (:mod:`specdec.events`) is announced
            right after the run exists.
        describe: also write the one-line descriptions (:func:`describe_validation`); the nightly
            does that as its own last step.
        verdict: the run's verdict word from the drift rules (the nightly's, which already holds the
            gate's: :func:`registry.gate.evaluate_gate`); ``validation_status`` is
            :func:`specdec.policy.combine` of it and the gate's, so one run shows one word everywhere.
        The gate judges by the pair version's own floor when it has one (tag ``acceptance_floor``).
        Artifacts that are evidence, not results (plots, ``extra_artifacts``) are best-effort: a
        failure there is logged and the run still finishes.
    Returns:
        the MLflow run id.
    Raises:
        PairNotFound: no such pair version; FileNotFoundError: a missing extra artifact;
        RegistryUnavailable: server unreachable. If logging fails after the run was created, the run is
        marked FAILED (the gate ignores it) and the pair version is not tagged.
    """
    version = str(version)
    client = registry.client
    rdir = Path(report_dir)
    if not (rdir / REPORT_FILE).exists():
        report.write(rdir)
    elif not (rdir / PROFILE_FILE).exists():  # a report directory written before the profile existed
        write_profile(report, rdir)
    with mlflow_errors(client.tracking_uri):
        ptags = full_tags(client, get_pair_model_version(client, pair, version))  # k and sampling live in pair.json
        judged = judge_report(report, ptags, gate)
        metrics, mismatch, gate, result = judged.metrics, judged.mismatch, judged.gate, judged.result
        word = combine([result.status, verdict or result.status])
        if history is None:
            history = client_validation_history(client, pair, experiment)
        eid = registry.experiment(experiment)
        earlier = _end_crashed_runs(client, eid, run_key) if run_key else []
        tags = _run_tags(pair, version, report, ptags, verdict=result, mismatch=mismatch, run_key=run_key, gate=gate)
        tags["validation_status"] = word
        night = str(report.created_at or datetime.now(timezone.utc).isoformat())[:10]
        name = run_name or f"{pair} v{version} night {night}"
        run_id = client.create_run(eid, run_name=name, tags=tags).info.run_id
        events.announce("mlflow", pair=pair, version=version, run_id=run_id)
        _fill_run(client, run_id, report, rdir, metrics=metrics, ptags=ptags,
                  trend=_Trend(pair, version, list(history), gate, night_of(name)), extra_artifacts=extra_artifacts)
        _set_version_tags(client, pair, version, validation_tags(
            status=word, run_id=run_id, metrics=metrics,
            heldout=f"{report.heldout_name}@{report.heldout_version}", reasons=result.reasons, gate=gate))
        if describe:
            _describe(client, pair, version, run_id)
        for old in earlier:  # superseded by this run: one finished run per key
            if old.info.status not in ("RUNNING", "SCHEDULED"):
                client.delete_run(old.info.run_id)
    return run_id


def describe_validation(pair: str, version: str | int, run_id: str, *, registry: Registry) -> None:
    """Write the pair version's one-line description and the run's (the line plus links) from what is
    recorded now (:mod:`registry.describe`): what a person reads in the MLflow UI.

    Raises:
        RegistryUnavailable: server unreachable; mlflow's errors for an unknown run or version.
    """
    client = registry.client
    with mlflow_errors(client.tracking_uri):
        describe_run(client, run_id, pair, str(version),
                     refresh_description(client, pair, str(version), client.get_run(run_id)))


def _describe(client, pair: str, version: str, run_id: str) -> None:
    from mlflow.exceptions import MlflowException

    try:  # what a person reads in the UI; the verdict is already recorded
        describe_run(client, run_id, pair, version, refresh_description(client, pair, version, client.get_run(run_id)))
    except (MlflowException, KeyError, TypeError, ValueError) as e:  # MLflow, or tags it cannot parse
        _log.error("description of %s v%s / run %s not updated: %s: %s", pair, version, run_id, type(e).__name__, e)


def _end_crashed_runs(client, experiment_id: str, run_key: str) -> list:
    """The runs of ``run_key`` so far; those a killed process left RUNNING are ended FAILED and deleted."""
    earlier = _runs_of_key(client, experiment_id, run_key)
    for old in earlier:
        if old.info.status in ("RUNNING", "SCHEDULED"):  # left by a killed process
            client.set_terminated(old.info.run_id, "FAILED")
            client.delete_run(old.info.run_id)
            _log.warning("MLflow run %s of %s was left RUNNING by a crashed process: ended and deleted",
                         old.info.run_id, run_key)
    return earlier


def _run_tags(pair: str, version: str, report: ValidationReport, ptags: Mapping[str, str], *, verdict: GateResult,
              mismatch: list[str], run_key: str | None, gate: GateConfig) -> dict[str, str]:
    tags = {"specdec.pair": pair, "specdec.pair_version": version, "specdec.pair_uri": f"models:/{pair}/{version}",
            "specdec.target": ptags.get("target", "unknown"), "specdec.draft": ptags.get("draft", "unknown"),
            "specdec.drafter_kind": ptags.get("drafter_kind", report.drafter_kind),
            "specdec.validation.heldout": f"{report.heldout_name}@{report.heldout_version}",
            "specdec.report_created_at": str(report.created_at),
            "validation_status": verdict.status, "specdec.gate_status": verdict.status, "specdec.gate_reasons": "; ".join(verdict.reasons)[:5000] or "none",
            "specdec.config_mismatch": "; ".join(mismatch) or "none",
            "specdec.acceptance_rule": report.acceptance_rule or "none"}
    if run_key:
        tags["specdec.run_key"] = run_key
    tags["specdec.acceptance_policy"] = json.dumps(  # recorded with each run, shown with the verdict
        {"threshold": gate.min_acceptance_rate, "floor_source": gate.floor_source, "gate_side": gate.gate_side,
         "min_prompts": gate.min_num_prompts, "min_draft_tokens": gate.min_draft_tokens,
         "estimator": gate.estimator, "alert_side": gate.alert_side})
    return tags


@dataclass(frozen=True)
class _Trend:
    """What the run's plots need besides the report: the pair version, its past points and the gate."""

    pair: str
    version: str
    history: list
    gate: GateConfig
    night: str | None


def _fill_run(client, run_id: str, report: ValidationReport, rdir: Path, *, metrics: dict[str, float],
              ptags: Mapping[str, str], trend: _Trend, extra_artifacts: Sequence[str | Path]) -> None:
    """Metrics, params, report files, serving config (``serving_config.json``, read back by ``specdec pair
    show``), plots and extra artifacts of a created run, then FINISHED; FAILED (and the error re-raised)
    if any of it fails."""
    from mlflow.entities import Metric, Param

    try:
        now = int(time.time() * 1000)
        items = [Metric(k, v, now, 0) for k, v in metrics.items()]
        params = [Param(k, v) for k, v in report_params(report).items()]
        for i in range(0, max(len(items), 1), 900):
            client.log_batch(run_id, metrics=items[i:i + 900], params=params if i == 0 else [])
        for name in (REPORT_FILE, PROMPTS_FILE, PROFILE_FILE):  # the profile: Model Optimizer's schema
            if (rdir / name).exists():
                client.log_artifact(run_id, str(rdir / name))
        serving = serving_config_for(ptags, report)
        if serving is not None:
            client.log_dict(run_id, serving, SERVING_FILE)
        _log_evidence(client, run_id, report, rdir, metrics=metrics, trend=trend, extra_artifacts=extra_artifacts)
        client.set_terminated(run_id, "FINISHED")
    except BaseException:  # noqa: BLE001 (any failure, even KeyboardInterrupt, must not leave the run RUNNING; re-raised)
        try:
            client.set_terminated(run_id, "FAILED")
        except Exception:  # noqa: BLE001 (best effort while already failing; the original error is re-raised)
            pass
        raise


def _log_evidence(client, run_id: str, report: ValidationReport, rdir: Path, *, metrics: Mapping[str, float],
                  trend: _Trend, extra_artifacts: Sequence[str | Path]) -> None:
    """Plots and extra artifacts: evidence, not the result, so a failure is logged and the run goes on
    (except a missing extra artifact, a caller's mistake: FileNotFoundError)."""
    try:
        plots = write_run_plots(report, rdir / "plots", history=trend.history, run_id=run_id, version=trend.version,
                                metrics=metrics, threshold=trend.gate.min_acceptance_rate,
                                estimator=trend.gate.estimator, pair=trend.pair,
                                night=trend.night)
        client.log_artifacts(run_id, str(plots), artifact_path="plots")
    except Exception as e:  # noqa: BLE001 (matplotlib and the artifact store raise many types; plots never block the run)
        _log.error("plots for MLflow run %s failed (%s: %s); the run is logged without them",
                   run_id, type(e).__name__, e, exc_info=_log.isEnabledFor(logging.DEBUG))
    try:
        _log_extra(client, run_id, extra_artifacts)
    except FileNotFoundError:
        raise
    except Exception as e:  # noqa: BLE001 (the artifact store's errors vary by backend; extras never block the run)
        _log.error("extra artifacts of MLflow run %s failed (%s: %s); the run is logged without them",
                   run_id, type(e).__name__, e)


def _runs_of_key(client, experiment_id: str, run_key: str) -> list:
    """Active (not deleted) runs tagged ``specdec.run_key = run_key``, any status."""
    return list(client.search_runs([experiment_id], f"tags.`specdec.run_key` = '{run_key}'", max_results=100))


def latest_validation_run(pair: str, version: str | int, *, experiment: str = VALIDATION_EXPERIMENT,
                          registry: Registry):
    """The most recent FINISHED validation run (``mlflow.entities.Run``) of ``pair`` v``version``, or None."""
    with registry.errors():
        return client_latest_validation_run(registry.client, pair, version, experiment)


def validation_history(pair: str, *, experiment: str = VALIDATION_EXPERIMENT, max_results: int = 200,
                       registry: Registry) -> list[dict]:
    """Past finished validation runs of ``pair`` read back from MLflow, oldest first
    (:func:`client_validation_history`)."""
    with registry.errors():
        return client_validation_history(registry.client, pair, experiment, max_results)
