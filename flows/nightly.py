"""The nightly validation flow: validate what ``champion`` and ``challenger`` point at, record
history, log to MLflow, alert on drift.

The steps, in the order :func:`nightly_validation_flow` and :func:`record_night` call them:

1. resolve the aliases to pair versions in MLflow (read at run time, so a promotion done by hand in
   the MLflow UI is what gets validated) and claim each night's history key (:func:`resolve_targets`,
   :func:`claim_target`);
2. validate with :mod:`specdec` (the same core that serves), models cached on the worker
   (:func:`run_validation`, through the flow's task runner: ``parallel=True`` spreads pair versions
   over a Dask cluster, see :func:`nightly_flow_for`);
3. write history first (SQL; the idempotency key makes a retried night update its own row);
4. evaluate the drift rules against the baseline, with the Evidently report as evidence;
5. log the MLflow run (metrics, artifacts, the Evidently files, the trend plot drawn from the history
   store's points) and tag the pair version;
6. alert (one per incident, a reminder at most daily, one resolve message);
7. describe the version (its one-line description in MLflow) and return a :class:`NightlyResult`.

Steps 3-4 are :func:`monitoring.pipeline.record_evidence`, step 5 is the flow's (MLflow is not
monitoring's business), step 6 is :func:`monitoring.pipeline.alert_evidence` with the MLflow run's links
(the two halves of :func:`monitoring.pipeline.record_and_evaluate`). The flow builds its settings tree once
(:func:`flows.settings.for_this_run`) and carries one :class:`NightlyJob` through its steps; the steps
announce themselves as step events (:mod:`specdec.events`).

The rules come before the MLflow run (not after, as the issue's list reads) because the run attaches
the Evidently report, which needs the rules' baseline; the history row still comes first, so a crash
or an MLflow outage loses nothing: the row keeps ``mlflow_logged = false`` and the next run logs it
first. Ungated promotions (``@champion`` moved outside specdec to a version that did not pass the
gate) are noticed before validating, validated first and alerted (:mod:`flows.ungated`).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.task_runners import ThreadPoolTaskRunner

from flows.tasks import (
    MlflowLogging, NightlyResult, describe_version, log_to_mlflow, report_dir_for, resolve_pair_version,
    run_logger, scheduled_date_of_run,
)
from specdec import stopping
from flows.night_request import worth_retrying
from flows.ungated import check_ungated, report_ungated, version_link
from specdec import events
from specdec.policy import VERDICTS

if TYPE_CHECKING:  # the types of what a night holds; imported only for checking (no import cycles, no load)
    from prefect.futures import PrefectFuture

    from flows.recovery import Heartbeat, NightlyLease
    from monitoring.db import Database
    from monitoring.history import Claim, RunKey
    from monitoring.settings import MonitoringSettings
    from registry.gate import GateConfig
    from registry.pairs import PairVersion
    from registry.service import Registry
    from specdec.settings import CoreSettings
    from specdec.validation.heldout import HeldoutSet
    from specdec.validation.report import ValidationReport


#: where a greedy replay night's target continuations come from: the core, or the engine serving the target
CONTINUATIONS = ("core", "engine")


def _logger():
    return run_logger("flows.nightly")


@dataclass(frozen=True)
class ValidationParams:
    """How tonight validates (the flow's parameters, checked once). See :func:`nightly_validation_flow`."""

    heldout: str
    limit: int | None
    device: str
    dtype: str
    seed: int
    batch_size: int
    method: str
    decode_fraction: float
    shards: int = 1
    continuations: str = "core"

    def run_config(self, pv) -> dict[str, Any]:
        """The config part of the history key of validating pair version ``pv`` with these parameters (the
        shard count is not part of it: a sharded night is the one-process night)."""
        cfg = {**pv.config.to_dict(), "drafter_kind": pv.drafter_kind, "limit": self.limit, "seed": self.seed}
        if self.batch_size != 1:  # absent at 1: keys of runs made before batching stay the same
            cfg["batch_size"] = self.batch_size
        if self.method != "decode":  # absent for decode: keys of runs made before replay stay the same
            cfg.update(method=self.method, decode_fraction=self.decode_fraction)
        if self.continuations != "core":  # the engine's continuations are another measurement of the target
            cfg["continuations"] = self.continuations
        return cfg

    def check(self) -> None:
        """Raises ValueError: shards < 1, sharded decoding, unknown ``continuations``, engine continuations
        with a method that decodes."""
        if isinstance(self.shards, bool) or not isinstance(self.shards, int) or self.shards < 1:
            raise ValueError(f"shards must be an int >= 1, got {self.shards!r}")
        if self.shards > 1 and self.method == "decode":
            raise ValueError("shards split the replay: use method 'replay' or 'both' with shards > 1")
        if self.continuations not in CONTINUATIONS:
            raise ValueError(f"continuations must be one of {', '.join(CONTINUATIONS)}, got {self.continuations!r}")
        if self.continuations == "engine" and self.method != "replay":
            raise ValueError("continuations='engine' replays the draft along the engine's output: use method 'replay' "
                             "(the engine's own counters are the engine check's)")


@dataclass(frozen=True)
class NightlyJob:
    """One nightly run's parameters, checked once (:meth:`check`) and carried through its steps.

    Attributes:
        pairs / aliases: what to validate; versions: pair versions validated as well (as ``challenger``).
        validation: how (:class:`ValidationParams`, the validation task's argument).
        scheduled_date: the night (None: the flow run's scheduled date).
        revert_ungated / fail_on_failure: see :func:`nightly_validation_flow`.
    """

    pairs: tuple[str, ...]
    aliases: tuple[str, ...]
    validation: ValidationParams
    versions: tuple[str, ...] = ()
    scheduled_date: dt.date | None = None
    revert_ungated: bool = False
    fail_on_failure: bool = False

    @classmethod
    def from_settings(cls, section, **overrides) -> "NightlyJob":
        """The job the nightly section describes, with ``overrides`` that are not None winning: the one
        mapping from ``SPECDEC_NIGHTLY_*`` to the flow's parameters, for ``nightly run`` (its options are the
        overrides), ``nightly serve`` and the deployments (``fail_on_failure=True``; ``pair watch`` starts
        runs of a deployment with its parameters).

        Args:
            section: :class:`flows.settings.NightlySettings`.
            overrides: any keyword parameter of :func:`nightly_validation_flow`.
        Raises:
            TypeError: a keyword the flow does not take.
        """
        values = {"pairs": list(section.pairs), "aliases": tuple(section.aliases), "heldout": section.heldout,
                  "limit": section.limit, "device": section.device, "dtype": section.dtype, "seed": 0,
                  "batch_size": section.batch_size, "method": section.method,
                  "decode_fraction": section.decode_fraction, "shards": section.shards,
                  "continuations": section.continuations, "versions": (), "scheduled_date": None,
                  "revert_ungated": False, "fail_on_failure": False}
        unknown = sorted(set(overrides) - set(values))
        if unknown:
            raise TypeError(f"not a parameter of the nightly flow: {', '.join(unknown)}")
        values.update({k: v for k, v in overrides.items() if v is not None})
        validation = ValidationParams(**{f: values.pop(f) for f in ValidationParams.__dataclass_fields__})
        return cls(pairs=tuple(values["pairs"]), aliases=tuple(values["aliases"]), validation=validation,
                   versions=tuple(str(v) for v in values["versions"]), scheduled_date=values["scheduled_date"],
                   revert_ungated=values["revert_ungated"], fail_on_failure=values["fail_on_failure"])

    def parameters(self) -> dict[str, Any]:
        """The keyword parameters of :func:`nightly_validation_flow` that run this job (JSON-ready but for
        ``scheduled_date``, left out when None)."""
        v = self.validation
        out = {"pairs": list(self.pairs), "aliases": list(self.aliases), "heldout": v.heldout, "limit": v.limit,
               "device": v.device, "dtype": v.dtype, "seed": v.seed, "batch_size": v.batch_size,
               "method": v.method, "decode_fraction": v.decode_fraction, "shards": v.shards,
               "continuations": v.continuations, "versions": list(self.versions) or None,
               "revert_ungated": self.revert_ungated, "fail_on_failure": self.fail_on_failure}
        return out if self.scheduled_date is None else {**out, "scheduled_date": self.scheduled_date}

    def check(self, *, allowed_aliases: list[str], date_type: type = dt.date) -> "NightlyJob":
        """``self``, once its values are valid (``allowed_aliases``: the registry section's ``SPECDEC_ALIASES``).

        Raises:
            ValueError: ``batch_size`` < 1, a ``scheduled_date`` that is not a date, an alias not in
            ``SPECDEC_ALIASES``.
        """
        from registry.promotion import check_alias_name

        batch_size = self.validation.batch_size
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        self.validation.check()
        if self.scheduled_date is not None and not isinstance(self.scheduled_date, date_type):
            raise ValueError(f"scheduled_date must be a date, got {self.scheduled_date!r}")
        for a in self.aliases:  # a typo in a deployment's parameters fails the run instead of validating nothing
            check_alias_name(a, allowed_aliases)
        return self


@dataclass
class Night:
    """What one nightly run holds open: settings, the history store, the registry, its lease and heartbeat.

    Attributes:
        registry: the one MLflow service of the night. holder_dead: :func:`flows.recovery.holder_dead` of the
        home (``(run_id, token) -> bool``). core: the engine check's key and limits. gate: the promotion gate
        of the night's acceptance policy (the MLflow run's tags, the ungated-promotion checks).
    """

    date: dt.date
    settings: MonitoringSettings
    db: Database
    registry: Registry
    held: HeldoutSet
    lease: NightlyLease
    beat: Heartbeat
    holder_dead: Callable[[int, str], bool]
    core: CoreSettings
    gate: GateConfig

    @property
    def home(self) -> Path:
        return self.settings.home


@dataclass(frozen=True)
class Target:
    """One (pair, alias) resolved to a pair version to validate tonight."""

    pair: str
    alias: str
    pv: PairVersion
    champion_version: str | None

    @property
    def version(self) -> str:
        return str(self.pv.version)


@dataclass
class Job:
    """A claimed target whose validation was submitted (``future.result()`` is the report)."""

    target: Target
    key: RunKey
    claim: Claim
    report_dir: Path
    future: PrefectFuture[ValidationReport] | _Inline


@dataclass
class MlflowOutcome:
    """Step 5's outcome: the MLflow run id (None when logging failed; the row stays pending) and links."""

    run_id: str | None = None
    links: dict[str, str] = field(default_factory=dict)


@task(task_run_name="validate {pv.name}@v{pv.version}", retries=1, retry_delay_seconds=30,
      retry_condition_fn=worth_retrying)
def run_validation(pv, params: ValidationParams, out_dir: str):
    """Load the pair's models (worker cache) and validate them on the held-out set with tonight's ``params``
    (one :func:`specdec.validation.validate` call, whatever the method).

    ``pv`` is the :class:`registry.PairVersion` the flow already read (its models and its
    :class:`specdec.SpeculativeConfig`); nothing is fetched again. ``params``: how tonight validates.

    Returns:
        :class:`specdec.validation.report.ValidationReport`, also written to ``out_dir``.
    """
    from flows.night_request import validate_and_write, validation_progress, validation_request

    return validate_and_write(validation_request(pv, params, validation_progress(pv)), out_dir)


@task(retries=2, retry_delay_seconds=[5, 20], cache_policy=NO_CACHE)
def retry_pending_mlflow_logging(db, home: Path, registry, gate) -> list[str]:
    """Log to MLflow the history rows whose logging failed on an earlier night (oldest first), through the
    night's history store ``db``, MLflow service ``registry`` and gate ``gate``; reports are under ``home``.

    Returns the MLflow run ids logged now. Rows whose report directory is gone are reported and left.
    """
    from monitoring import history
    from registry import RegistryError, RegistryUnavailable

    log = _logger()
    done = []
    for row in history.runs_pending_mlflow(db):
        key = history.RunKey(row.pair_name, row.pair_version, row.heldout_name, row.heldout_version,
                             row.config_hash, row.scheduled_date, row.alias or "")
        rdir = report_dir_for(home, key)
        if not (rdir / "report.json").exists():  # a run recorded before the alias was part of its key
            rdir = report_dir_for(home, replace(key, alias=""))
        if not (rdir / "report.json").exists():
            log.warning("history run %s: report %s is missing; cannot log it to MLflow", row.id, rdir)
            continue
        job = MlflowLogging(row.pair_name, row.pair_version, str(rdir),
                            [p for p in (row.evidently_html, row.evidently_json) if p], key.key_id(),
                            key.scheduled_date.isoformat(), history.trend_points(db, row.pair_name, exclude_run=row.id),
                            row.status if row.status in VERDICTS else None)
        try:
            run_id = log_to_mlflow.fn(job, registry, gate)
        except RegistryUnavailable as e:
            log.warning("MLflow still unreachable (%s); %s run(s) stay pending", e, "these")
            break
        except (RegistryError, OSError, ValueError) as e:  # this row's pair, files or report: the others go on
            log.error("history run %s: MLflow logging failed again (%s: %s); it stays pending", row.id,
                      type(e).__name__, e)
            continue
        history.mark_mlflow_logged(db, row.id, run_id)
        log.info("logged pending history run %s to MLflow run %s", row.id, run_id)
        done.append(run_id)
    return done


def _mlflow_link(registry, run_id: str) -> str:
    from mlflow.exceptions import MlflowException

    uri = registry.uri
    try:
        exp = registry.client.get_run(run_id).info.experiment_id
    except (MlflowException, OSError):  # the link is a convenience: experiment 0 still opens the UI
        exp = "0"
    if uri.startswith("http"):
        from registry.describe import ML_VIEW

        return f"{uri.rstrip('/')}/#/experiments/{exp}/runs/{run_id}{ML_VIEW}"
    return f"runs:/{run_id} (mlflow ui --backend-store-uri {uri})"


def log_night_to_mlflow(night: Night, job: Job, history_run_id: int, drift, verdict: str | None = None) -> MlflowOutcome:
    """Step 5, best-effort: log the MLflow run (task :func:`flows.tasks.log_to_mlflow`) with tonight's
    verdict word (its ``validation_status``) and mark the history row logged.

    A failure is logged and leaves the row pending (the next night logs it first); the alert still
    goes out.
    """
    from monitoring import history

    t = job.target
    extra = [str(drift.html_path), str(drift.json_path)] if drift is not None else []
    logging_job = MlflowLogging(t.pair, t.version, str(job.report_dir), extra, job.key.key_id(),
                                job.key.scheduled_date.isoformat(),
                                history.trend_points(night.db, t.pair, exclude_run=history_run_id), verdict)
    try:
        run_id = log_to_mlflow(logging_job, night.registry, night.gate)
    except Exception as e:  # noqa: BLE001 (MLflow, its HTTP client, the artifact store and matplotlib raise many types; none may stop the alert)
        _logger().error("MLflow logging failed (%s: %s): history run %s kept, logged on the next run",
                        type(e).__name__, e, history_run_id)
        return MlflowOutcome(links={"Report (file on the worker)": str(job.report_dir / "report.json")})
    history.mark_mlflow_logged(night.db, history_run_id, run_id)
    return MlflowOutcome(run_id, {"MLflow run": _mlflow_link(night.registry, run_id),
                                  "Pair version": version_link(t.pair, t.version, night.registry.uri)})


def record_night(night: Night, job: Job, report) -> NightlyResult:
    """Steps 3-7 for one validated pair version: history, rules, evidence
    (:func:`monitoring.pipeline.record_evidence`), the MLflow run, the alert with the run's links
    (:func:`monitoring.pipeline.alert_evidence`), then the description.

    The history row, the rules and the alert always happen; the Evidently report, the MLflow run and
    the description are best-effort (logged, and the alert still goes out).

    Raises:
        RunAlreadyClaimed: another run took the key over while this one was validating.
    """
    from monitoring import pipeline
    from monitoring.history import Lineage

    t = job.target
    events.announce("history", pair=t.pair, version=t.version)
    lineage = Lineage.from_report(report, target_hash=t.pv.target_weights_sha256, draft_hash=t.pv.draft_weights_sha256)
    settings, gate = judged_by(night, t.pv.tags, report)
    evidence = pipeline.record_evidence(night.db, report, job.key, lineage, claim=job.claim, alias=t.alias,  # 3, 4
                                        champion_version=t.champion_version, settings=settings,
                                        evidently_dir=job.report_dir / "evidently", extra_results=[gate])
    mlflow = log_night_to_mlflow(night, job, evidence.run_id, evidence.drift, evidence.evaluation.verdict)  # 5
    out = pipeline.alert_evidence(night.db, evidence, links=mlflow.links, settings=settings)                # 6
    if mlflow.run_id is not None:                                                                           # 7
        _describe(night, t, mlflow.run_id)
    return _result(job, report, out.evaluation, out.drift, mlflow, out.alert)


def judged_by(night: Night, pair_tags: dict, report):
    """(monitoring settings with the pair version's own floor, the gate's criteria beyond acceptance as a
    rule result): what tonight's one verdict word is judged by. The night's one gate (``night.gate``, of the
    tree's one policy) finds the floor once (:meth:`registry.gate.GateConfig.for_pair`: the version's tag
    ``acceptance_floor`` when set, else the policy's), and the drift rules judge by that floor; a malformed tag
    raises ``ValueError`` (the night records it as this version's error)."""
    from monitoring.rules import gate_result
    from registry.runs import judge_report

    judged = judge_report(report, pair_tags, night.gate)
    rules = night.settings.rules
    settings = night.settings.model_copy(update={"rules": rules.for_floor(judged.gate.floor)})
    word, reasons = judged.result.beyond_acceptance()
    return settings, gate_result(word, reasons, rules.acceptance_severity)


def _describe(night: Night, t: Target, mlflow_run_id: str) -> None:
    from registry import RegistryError

    try:  # what a person reads in the UI; the verdict is already recorded
        describe_version.fn(t.pair, t.version, mlflow_run_id, night.registry)
    except RegistryError as e:
        _logger().error("description of %s v%s not updated: %s: %s", t.pair, t.version, type(e).__name__, e)


def _result(job: Job, report, evaluation, drift, mlflow: MlflowOutcome, outcome) -> NightlyResult:
    t, o = job.target, report.overall
    return NightlyResult(
        pair=t.pair, alias=t.alias, version=t.version, status=evaluation.verdict, history_run_id=evaluation.run_id,
        mlflow_run_id=mlflow.run_id, acceptance_rate=o.acceptance_rate,
        acceptance_rate_ci=list(o.acceptance_rate_ci), per_token_acceptance=o.per_token_acceptance,
        per_token_acceptance_ci=list(o.per_token_acceptance_ci), num_speculative_tokens=o.num_speculative_tokens,
        alert_transition=outcome.transition,
        root_cause_hint=evaluation.root_cause_hint, report_dir=str(job.report_dir),
        evidently_html=str(drift.html_path) if drift is not None else None,
        message="; ".join(r.message for r in evaluation.firing) if evaluation.firing else "",
        speedup=_finite_or_none(o.speedup), speedup_ci=[x for x in o.speedup_ci if _finite_or_none(x) is not None],
    )


def _finite_or_none(x) -> float | None:
    import math

    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def _broken(night: Night, pair: str, alias: str, version: str | None, error: BaseException, what: str) -> NightlyResult:
    """One clear log line and one alert for a (pair, alias) that could not be validated."""
    from monitoring.pipeline import alert_broken

    msg = f"{pair}@{alias}" + (f" v{version}" if version else "") + f": {what}: {type(error).__name__}: {error}"
    _logger().error("%s (the other aliases are still validated)", msg)
    transition = None
    try:
        transition = alert_broken(night.db, pair, alias, msg, version=version, settings=night.settings).transition
    except Exception as e:  # noqa: BLE001 (the store or a channel failing here must not hide the original error or the other aliases)
        _logger().error("%s@%s: the alert for this error could not be queued: %s: %s", pair, alias, type(e).__name__, e)
    return NightlyResult(pair, alias, version, "error", message=msg, alert_transition=transition)


def open_night(job: NightlyJob, tree) -> Night:
    """The night's date, settings (the monitoring section of ``tree``, a :class:`flows.settings.Settings`),
    history store, MLflow service, lease (with this flow run's id), heartbeat, core section and gate (of
    ``tree.policy``)."""
    import monitoring
    from flows.recovery import Heartbeat, NightlyLease, crash_dead_claims, holder_dead
    from registry.gate import GateConfig
    from registry.service import Registry
    from specdec.validation.heldout import load_heldout

    settings = tree.monitoring
    db = monitoring.connect(settings)
    for run_id in crash_dead_claims(settings.home, db, stale_after_s=settings.claim_stale_after_s):
        _logger().warning("history run %d was left running by a nightly process that died: marked crashed", run_id)
    lease = NightlyLease.mine(settings.home)
    try:
        from prefect.runtime import flow_run

        lease.flow_run_id = flow_run.id
        lease.save()
    except Exception:  # noqa: BLE001 (outside a flow run prefect.runtime raises its own types; the lease works without the id)
        pass
    registry = Registry(tree.registry, check=False)  # no probe: resolving the aliases retries a server briefly down
    return Night(job.scheduled_date or scheduled_date_of_run(), settings, db, registry,
                 load_heldout(job.validation.heldout), lease, Heartbeat(db, settings.claim_stale_after_s / 10),
                 holder_dead(settings.home), tree.core, GateConfig.from_policy(tree.policy))


def check_ungated_pairs(night: Night, job: NightlyJob) -> dict[str, dict[str, Any]]:
    """Before validating: was ``@champion`` of each pair moved outside specdec (:mod:`flows.ungated`)?"""
    from mlflow.exceptions import MlflowException

    from registry import RegistryError, RegistryUnavailable

    ungated = {}
    for pair in job.pairs:
        try:
            ungated[pair] = check_ungated(pair, job.aliases, night.registry, night.gate)
        except RegistryUnavailable:
            raise
        except (RegistryError, MlflowException) as e:  # a broken alias is reported per alias by resolve_targets
            _logger().warning("%s: ungated-promotion check skipped: %s: %s", pair, type(e).__name__, e)
    return ungated


def resolve_targets(night: Night, job: NightlyJob) -> tuple[list[Target], list[NightlyResult]]:
    """Step 1: every (pair, alias), and each explicitly named version (as ``challenger``), resolved to
    a pair version; a version behind two aliases once. Broken references are alerted and reported.

    Raises:
        registry.RegistryUnavailable: MLflow is down (the whole night is retried, nothing is alerted).
    """
    from mlflow.exceptions import MlflowException

    from registry import RegistryError, RegistryUnavailable
    from registry.pairs import get_pair_version

    targets: list[Target] = []
    results: list[NightlyResult] = []
    seen: dict[tuple[str, str], str] = {}
    aliases = job.aliases
    for pair in job.pairs:
        try:
            champion = resolve_pair_version(pair, "champion", night.registry)
        except RegistryUnavailable:
            raise
        except (RegistryError, MlflowException) as e:  # a broken champion must not hide the challenger
            results.append(_broken(night, pair, "champion", None, e, "cannot resolve the alias"))
            champion, wanted = None, [a for a in aliases if a != "champion"]
        else:
            wanted = list(aliases)
        for alias, fixed in [(a, None) for a in wanted] + [("challenger", str(v)) for v in job.versions]:
            version = None
            try:
                version = fixed or (champion if alias == "champion" else resolve_pair_version(pair, alias, night.registry))
                if version is None:
                    results.append(NightlyResult(pair, alias, None, "skipped", message=f"no @{alias}"))
                    continue
                if (pair, version) in seen:
                    results.append(NightlyResult(pair, alias, version, "skipped",
                                                 message=f"same version as @{seen[(pair, version)]}"))
                    continue
                pv = get_pair_version(pair, version, download=False, registry=night.registry)
            except RegistryUnavailable:
                raise
            except (RegistryError, MlflowException, OSError, KeyError, ValueError) as e:  # one bad alias or pair.json: the rest go on
                results.append(_broken(night, pair, alias, version, e, "cannot resolve the pair version"))
                continue
            try:
                check_pair_tags(night, pv.tags)
            except ValueError as e:  # before any model is loaded: the version's tag, not the storage, is wrong
                results.append(_broken(night, pair, alias, version, e, "a tag of this pair version is malformed, "
                                       "nothing validated (set the tag right in MLflow, or delete it)"))
                continue
            seen[(pair, version)] = alias
            targets.append(Target(pair, alias, pv, champion))
    return targets, results


def check_pair_tags(night: Night, tags: dict | None) -> None:
    """Check the per-pair tags a verdict reads (the floor ``acceptance_floor`` of :func:`judged_by` and the gate)
    before any model is loaded, so a malformed one ends this version at once instead of after its validation.

    Raises:
        ValueError: a tag that does not parse (the message names the tag and its value).
    """
    night.gate.for_pair(tags)  # the pair's floor, as judged_by finds it (the rules take the gate's)


def claim_target(night: Night, target: Target, params: ValidationParams) -> Job | NightlyResult:
    """Claim tonight's history key of ``target`` and submit its validation (step 2); a key another
    live run holds gives an ``already-running`` result instead."""
    from flows.recovery import forget_claim
    from monitoring import history

    key = history.RunKey.build(target.pair, target.version, night.held.name, night.held.version,
                               params.run_config(target.pv), night.date, alias=target.alias)
    try:
        claim = history.claim_run(night.db, key, alias=target.alias,
                                  stale_after_s=night.settings.claim_stale_after_s, holder_dead=night.holder_dead)
    except history.RunAlreadyClaimed as e:
        _logger().warning("%s@%s v%s: %s; leaving it to that run", target.pair, target.alias, target.version, e)
        return NightlyResult(target.pair, target.alias, target.version, "already-running", message=str(e))
    if claim.previous_status and claim.previous_status.startswith("running"):
        _logger().warning("%s@%s v%s: took over history run %s (%s)", target.pair, target.alias, target.version,
                          claim.run_id, claim.previous_status)
    night.lease.add_claim(claim.run_id, claim.token)
    forget_claim(night.home, claim.run_id)
    night.beat.add(claim)
    out = report_dir_for(night.home, key)
    args = (target.pv, params, str(out))
    if params.shards > 1:
        from flows.sharding import submit_sharded

        fut = submit_sharded(args, _serial())
    else:
        fut = _Inline.run(run_validation, args) if _serial() else run_validation.submit(*args)
    return Job(target, key, claim, out, fut)


def finish_job(night: Night, job: Job) -> NightlyResult:
    """Wait for ``job``'s validation and record it (steps 3-7); a failed validation or recording is
    marked on the history row and alerted.

    The claim leaves this process's lease only once the row is recorded or marked ``error``: when the
    history store itself is down (neither can be written), the lease keeps naming the claim, so the
    next run sees a dead holder and takes the row over at once instead of waiting out the stale-claim
    window.
    """
    from monitoring.history import RunAlreadyClaimed

    t = job.target
    try:
        report = job.future.result()
    except Exception as e:  # noqa: BLE001 (model loading and decoding raise any type; record it, free the key, alert)
        night.beat.remove(job.claim.run_id)
        _free_claim(night, job, f"{type(e).__name__}: {e}")
        return _broken(night, t.pair, t.alias, t.version, e, "validation failed")
    night.beat.remove(job.claim.run_id)
    try:
        res = record_night(night, job, report)
    except RunAlreadyClaimed as e:  # taken over while we were slow: the other run records it
        night.lease.drop_claim(job.claim.run_id)
        _logger().warning("%s@%s v%s: %s", t.pair, t.alias, t.version, e)
        return NightlyResult(t.pair, t.alias, t.version, "already-running", message=str(e))
    except Exception as e:  # noqa: BLE001 (the history store or a channel failed: say so, go on with the other jobs)
        _free_claim(night, job, f"{type(e).__name__}: {e}")
        return _broken(night, t.pair, t.alias, t.version, e, "recording the validation failed")
    night.lease.drop_claim(job.claim.run_id)
    _logger().info("%s@%s v%s: %s, acceptance rate %.3f [%.3f, %.3f] at k=%s (per-token acceptance %.3f)%s", t.pair,
                   t.alias, t.version, res.status, res.acceptance_rate, *res.acceptance_rate_ci,
                   res.num_speculative_tokens, res.per_token_acceptance,
                   f", alert: {res.alert_transition}" if res.alert_transition else "")
    return res


def _free_claim(night: Night, job: Job, message: str) -> None:
    """Mark the claimed row ``error`` and drop the claim from the lease; where the history store
    cannot be written either, log it and keep the claim in the lease (taken over by the next run)."""
    from monitoring import history

    try:
        history.mark_error(night.db, job.claim, message)
    except Exception as e:  # noqa: BLE001 (the store is down: SQLAlchemy/driver errors of any type)
        _logger().error("history run %s could not be marked error (%s: %s); the next run takes it over",
                        job.claim.run_id, type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        return
    night.lease.drop_claim(job.claim.run_id)


def engine_checks(night: Night, targets: list[Target], params: ValidationParams) -> list[NightlyResult]:
    """Step 8: the engine check of each target whose pair version names an engine (flows.engine_check);
    one failure is logged and alerted as that target's error, the others still run."""
    from flows.engine_check import run_engine_check

    out = []
    for t in targets:
        try:
            res = run_engine_check(night, t, params)
        except Exception as e:  # noqa: BLE001 (a broken engine or store must not stop the other checks)
            res = _broken(night, t.pair, t.alias, t.version, e, "engine check failed")
        if res is not None:
            out.append(res)
    return out


@flow(name="nightly-validation", log_prints=True, task_runner=ThreadPoolTaskRunner(max_workers=1))
def nightly_validation_flow(
    *,
    pairs: list[str] = ["specdec-pair"],  # noqa: B006 (Prefect parameters must be JSON defaults)
    aliases: tuple[str, ...] = ("champion", "challenger"),
    heldout: str = "spec_bench",
    limit: int | None = 192,
    device: str = "auto",
    dtype: str = "auto",
    scheduled_date: dt.date | None = None,
    seed: int = 0,
    batch_size: int = 1,
    method: str = "both",
    decode_fraction: float = 0.25,
    versions: list[str] | None = None,
    revert_ungated: bool = False,
    fail_on_failure: bool = False,
    shards: int = 1,
    continuations: str = "core",
) -> list[NightlyResult]:
    """Validate every (pair, alias) and alert on drift. See the module docstring for the steps.

    Args:
        pairs: pair registered-model names.
        aliases: which aliases to validate; a version behind two aliases is validated once.
        heldout: held-out set name or JSONL path (:func:`specdec.validation.heldout.load_heldout`).
        limit: stratified subset size over all six Spec-Bench categories (None = the whole set); 192 by
            default: the replay makes every prompt cheap, and 25% of 192 are decoded (as many as the
            48-prompt decode-only nightly decoded).
        method: ``both`` (default: replay every prompt from the cached target continuation, decode a
            stratified ``decode_fraction`` subsample, compare them), ``replay`` or ``decode``
            (:func:`specdec.validation.validate`; docs/metrics.md "Replay").
        decode_fraction: share of the prompts decoded with ``method="both"`` (at least 2 per category).
        versions: pair versions to validate as well, by number (``specdec pair watch`` validates exactly
            the version a registry event named; recorded under the alias ``challenger``).
        revert_ungated: an ungated ``@champion`` that fails tonight is moved back to the last version
            that passed the gate (``specdec pair watch --revert``); the alert says so.
        fail_on_failure: the flow run fails (:class:`flows.summary.ValidationsFailed`) when a validation
            failed or could not run (deployments set it; a summary artifact is published either way).
        device / dtype: ``auto`` picks CUDA + bf16 where a GPU exists, else CPU + fp32.
        scheduled_date: the night this run belongs to (default: the flow run's scheduled date);
            part of the idempotency key, so a retry of the same night updates the same row.
        seed: subset and sampling seed.
        batch_size: prompts decoded together (>= 1); speed metrics are measured at this batch
            size, so a value other than 1 is part of the run's config hash (drift baselines
            compare runs with the same config).
        shards: split each pair version's replay over this many tasks (:mod:`flows.sharding`; with
            :func:`nightly_flow_for` ``parallel=True`` they run on different Dask workers); the report is
            the one-process report. Not part of the config hash.
        continuations: ``core`` (the target's greedy continuations from our core) or ``engine`` (from the
            engine the pair version names, tag ``engine_url``; ``method="replay"``; for model and n-gram
            drafters the target's weights are never loaded: docs/scale.md).
    Returns:
        one :class:`flows.tasks.NightlyResult` per (pair, alias).
    Raises:
        ValueError: ``batch_size`` < 1, or an alias not in ``SPECDEC_ALIASES``.
    """
    from flows.settings import for_this_run

    # `dt` named in this body: `flow.serve()` runs the flow in a spawned process with only the globals its
    # body names (cloudpickle), and the annotation `dt.date` must resolve there (tests/flows/test_served_flow.py)
    stopping.guard()  # a SIGTERM Prefect's handler would lose is remembered (specdec.stopping)
    tree = for_this_run()  # the flow is an entry point: its settings tree, read once
    job = NightlyJob(pairs=tuple(pairs), aliases=tuple(aliases), versions=tuple(str(v) for v in versions or ()),
                     validation=ValidationParams(heldout, limit, device, dtype, seed, batch_size, method, decode_fraction,
                                                 shards, continuations),
                     scheduled_date=scheduled_date, revert_ungated=revert_ungated,
                     fail_on_failure=fail_on_failure).check(date_type=dt.date, allowed_aliases=tree.registry.aliases)
    return run_night(job, tree)


def run_night(job: NightlyJob, tree) -> list[NightlyResult]:
    """The nightly's steps for ``job`` with the settings ``tree`` (:class:`flows.settings.Settings`), in the
    flow run of :func:`nightly_validation_flow`. See the module docstring."""
    from flows.summary import finish_run

    params = job.validation
    night = open_night(job, tree)
    retry_pending_mlflow_logging(night.db, night.home, night.registry, night.gate)
    ungated = check_ungated_pairs(night, job)
    targets, results = resolve_targets(night, job)                                      # 1. resolve aliases
    claimed = [claim_target(night, t, params) for t in targets]                         # 2. validate (submitted)
    results += [c for c in claimed if isinstance(c, NightlyResult)]
    with night.beat:
        for submitted in claimed:                                                       # 3-7. record_night
            if isinstance(submitted, Job):
                stopping.check()
                results.append(finish_job(night, submitted))
        results += engine_checks(night, targets, params)                                # 8. the serving engine
    report_ungated(night.db, ungated, results, registry=night.registry, settings=night.settings,  # tonight's verdict
                   gate=night.gate, revert=job.revert_ungated)
    return finish_run(results, job.fail_on_failure)                     # summary artifact; fails the run if asked


def _serial() -> bool:
    """True when the flow runs with its default one-worker thread pool: validations then run in the
    flow's own thread (the main thread of ``specdec nightly run``), since the speed it measures
    depends on it. bf16 matmuls (oneDNN) run about 2x slower from a worker thread's OpenMP team
    than from the main thread (docs/metrics.md, "Speed"), which would make a bf16 draft look far
    costlier than it serves."""
    try:
        from prefect.context import get_run_context

        return isinstance(get_run_context().task_runner, ThreadPoolTaskRunner)
    except Exception:  # noqa: BLE001 (outside a flow run: submit as usual)
        return False


class _Inline:
    """The outcome of a task called in the flow's thread, with the ``.result()`` of a future."""

    def __init__(self, value=None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error

    @classmethod
    def run(cls, task_obj, args) -> "_Inline":
        try:
            return cls(task_obj(*args))
        except Exception as e:  # noqa: BLE001 (re-raised by result(), as a future would)
            return cls(error=e)

    def result(self):
        if self.error is not None:
            raise self.error
        return self.value


def nightly_flow_for(parallel: bool = False, dask_workers: int = 2, dask_address: str | None = None,
                     ray_address: str | None = None):
    """The nightly flow with a task runner: threads (default, one at a time), Dask or Ray.

    ``parallel=True`` validates pair versions (and a sharded pair's shards, :mod:`flows.sharding`) concurrently
    on a Dask cluster through ``prefect-dask``: a local cluster of ``dask_workers`` single-threaded processes, or
    an existing scheduler at ``dask_address`` (e.g. one ``dask worker`` per GPU, each with its own
    ``CUDA_VISIBLE_DEVICES``). ``ray_address`` runs the same tasks on Ray through ``prefect-ray``'s
    ``RayTaskRunner`` instead (implies parallel): ``"local"`` starts a local Ray of ``dask_workers`` CPUs for
    the flow, ``"auto"`` joins the cluster this machine belongs to, ``ray://host:10001`` a remote one.

    Raises:
        ValueError: ``ray_address`` given without ``prefect-ray`` installed (``pip install 'specdec[ray]'``).
        flows.cluster.ClusterUnreachable: ``ray_address`` is ``auto`` and no Ray cluster runs here.
    """
    if ray_address:
        return nightly_validation_flow.with_options(task_runner=_ray_runner(ray_address, dask_workers))
    if not parallel:
        return nightly_validation_flow
    from prefect_dask import DaskTaskRunner

    if dask_address:
        runner = DaskTaskRunner(address=dask_address)
    else:
        runner = DaskTaskRunner(cluster_kwargs={"n_workers": dask_workers, "threads_per_worker": 1,
                                                "processes": True, "dashboard_address": None})
    return nightly_validation_flow.with_options(task_runner=runner)


def _ray_runner(address: str, workers: int):
    """``prefect-ray``'s runner for ``address`` (``"local"``: a Ray of ``workers`` CPUs started for the flow, no
    dashboard, a small object store: the tasks exchange per-prompt rows and counters, not tensors)."""
    try:
        from prefect_ray import RayTaskRunner
    except ImportError:
        raise ValueError("the Ray task runner needs prefect-ray: pip install 'specdec[ray]'") from None
    from flows.cluster import ray_cluster_address

    resolved = ray_cluster_address(address)  # "auto": the running cluster, never a local Ray started silently
    if resolved is None:
        return RayTaskRunner(init_kwargs={"num_cpus": workers, "include_dashboard": False,
                                          "object_store_memory": 256 << 20, "log_to_driver": False})
    return RayTaskRunner(address=resolved)
