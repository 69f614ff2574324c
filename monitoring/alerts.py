"""Incident lifecycle and the persisted alert outbox.

One incident per (pair name, scope). The scope is a caller-chosen string, by default ``""`` (the
pair as a whole, across versions and aliases: pair v2 fires, pair v3 resolves); pass the alias
(``"challenger"``) to track aliases separately.

Transitions, decided from the drift-rule verdict (:func:`monitoring.rules.verdict`):

- OK -> firing (verdict ``failed``, no open incident): open the incident, notify (``fire``);
- still firing: a reminder (``remind-<n>``) at most every ``reminder_interval_hours`` (24 h);
- firing -> OK (verdict ``passed``): one ``resolve`` message, incident closed;
- verdict ``inconclusive`` (CI too wide, too few tokens): no transition either way.

Every message is first written to ``alert_deliveries`` (one row per transition and channel, unique
idempotency key ``incident-<id>:<transition>:<channel id>``) in the same transaction as the
transition, then sent. A send that still fails after its retries stays ``pending`` and is sent by
the next :func:`deliver_pending` (every :func:`process` call runs it first). A row is claimed
(``pending`` -> ``sending``) with a conditional UPDATE before its POST and marked ``delivered``
after the 2xx, so no message is lost and none is sent twice by concurrent runs.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import httpx
from sqlalchemy import or_, select, update
from sqlalchemy.exc import IntegrityError

from monitoring import channels as ch
from monitoring.actions import do_lines
from monitoring.channel_health import CHANNEL_HEALTH, REFUSED, enqueue_channel_health
from monitoring.db import DELIVERED, FIRING, PENDING, RESOLVED, SENDING, AlertDelivery, Database, Incident, utcnow
from monitoring.rules import (FAILED_VERDICT, PASSED_VERDICT, REPRESENTATIVENESS, RuleResult, change_since_baseline,
                              severity_of, verdict)
from monitoring.settings import ChannelConfig, MonitoringSettings
from specdec.validation.report import nan_to_none

log = logging.getLogger(__name__)


@dataclass
class AlertContext:
    """Plain facts for the message; nothing here is secret.

    Attributes:
        pair_name / pair_version: the pair validated. run_id: its history row.
        scope: incident scope (``""`` = the pair as a whole; or an alias).
        alias: alias the version was resolved through (shown in the message).
        heldout: ``"name@version"``. num_speculative_tokens: k.
        target_hash / draft_hash: weight hashes (shown shortened).
        target_ref / draft_ref: ``models:/name/version``, shown before the hash (findable from Slack).
        baseline: label of the baseline run (e.g. ``"specdec-pair v1 (run 3, 2026-11-28)"``).
        root_cause_hint: from :func:`monitoring.rules.root_cause_hint`.
        links: name -> URL or path (``{"MLflow run": "http://...", "Evidently report": "/..."}``).
        changed: what changed since the baseline run (``target`` | ``draft`` | ``both`` | None), for the
            floor's headline ("... after a target-only change: target changed, draft unchanged").
        drafter_kind: the drafter kind (``model``, ``ngram``, ``derived``, ``eagle3``, ``layerskip``): with
            ``draft_ref`` the drafter spec the alert names when the draft is no registered model.
    """

    pair_name: str
    pair_version: str
    run_id: int | None = None
    scope: str = ""
    alias: str | None = None
    heldout: str | None = None
    num_speculative_tokens: int | None = None
    target_hash: str | None = None
    draft_hash: str | None = None
    target_ref: str | None = None
    draft_ref: str | None = None
    baseline: str | None = None
    root_cause_hint: str | None = None
    links: dict[str, str] = field(default_factory=dict)
    changed: str | None = None
    drafter_kind: str | None = None


@dataclass
class Delivery:
    """One outbox row as plain data (no URL)."""

    id: int
    incident_id: int | None
    transition: str
    channel_id: str
    status: str
    attempts: int
    idempotency_key: str
    last_error: str | None = None
    response_status: int | None = None


@dataclass
class AlertOutcome:
    """What :func:`process` did: the transition taken (``fire``, ``remind-2``, ``resolve`` or
    ``None``), the incident id, and every delivery attempted in this call (old pending ones too)."""

    transition: str | None
    incident_id: int | None
    verdict: str
    deliveries: list[Delivery] = field(default_factory=list)

    @property
    def all_delivered(self) -> bool:
        """True when every delivery attempted in this call was delivered."""
        return all(d.status == DELIVERED for d in self.deliveries)


def _to_delivery(row: AlertDelivery) -> Delivery:
    return Delivery(row.id, row.incident_id, row.transition, row.channel_id, row.status,
                    row.attempts, row.idempotency_key, row.last_error, row.response_status)


def _draft_fact(ctx: AlertContext) -> str | None:
    """The alert's ``Draft``: the registered draft model (``models:/name/v (weights ...)``), else the drafter spec,
    kind and ref (``layerskip num_layers=8``, ``ngram max_ngram=3,min_ngram=1``), else the weights hash."""
    ref, kind, h = ctx.draft_ref, ctx.drafter_kind, ctx.draft_hash
    if (ref and ref.startswith("models:/")) or not (ref or kind):
        return _short(h, ref)
    spec = " ".join(x for x in (kind, ref) if x)
    return spec + (f" (weights {h[:12]})" if h else "")


def _short(h: str | None, ref: str | None = None) -> str | None:
    """``models:/tiny-target/2 (weights 328dcdfcabee)`` when ``ref`` is a registry name, else the hash's head."""
    return ref + (f" (weights {h[:12]})" if h else "") if ref and ref.startswith("models:/") else h[:12] if h else None


#: how an alert names the metric a rule judged (the rule result stores the field name)
METRIC_NAMES = {"per_token_acceptance": "per-token acceptance", "acceptance_rate": "acceptance rate"}
#: the floor headline's cause, by what changed since the baseline run
CHANGED_PHRASES = {"target": "after a target-only change: target changed, draft unchanged",
                   "draft": "after a draft-only change: draft changed, target unchanged",
                   "both": "after both target and draft changed"}


def floor_headline(overall: RuleResult | None, k: int | None, changed: str | None = None) -> str | None:
    """The alert's first line when the floor fires: ``acceptance rate 29.6% under the argmax rule < 40% at k = 4
    after a target-only change: target changed, draft unchanged (floor from policy default)`` (the rule where the
    run names the one it is served under); None otherwise."""
    if overall is None or not overall.firing or overall.value is None or overall.threshold is None:
        return None
    name = METRIC_NAMES.get(overall.metric, overall.metric)
    at = f" at k = {k}" if k else ""
    cause = f" {CHANGED_PHRASES[changed]}" if changed in CHANGED_PHRASES else ""
    m = re.search(r"floor [0-9.]+ \(([^)]*)\)", overall.message or "")
    source = f" (floor from {m.group(1)})" if m else ""
    served = re.search(r"judged under the (\w+) rule", overall.message or "")
    rule = f" under the {served.group(1)} rule" if served else ""
    return f"{name} {overall.value:.1%}{rule} < {overall.threshold:.0%}{at}{cause}{source}"


def _fmt_rule(r: RuleResult) -> str:
    if r.value is None and r.metric in ("reference", "gate"):  # a broken reference, the gate: its message says it
        return f"*{r.rule}*: {r.message}"
    val = "n/a" if r.value is None else f"{r.value:.3f}"
    ci = f" (95% CI {r.ci[0]:.3f}-{r.ci[1]:.3f})" if r.ci else ""
    thr = "" if r.threshold is None else f", threshold {r.threshold:.3f}"
    base = "" if r.baseline is None else f", baseline {r.baseline:.3f}"
    scope = "" if r.scope == "overall" else f" [{r.scope}]"
    sev = f" ({r.severity})" if r.severity else ""
    if r.rule == "speed":
        return f"*{r.rule}*{sev}: {r.message}"
    name = METRIC_NAMES.get(r.metric, r.metric)
    msg = r.message or ""
    beside = msg[msg.index("; "):] if r.rule in ("absolute", "relative") and "; " in msg else ""
    m = re.search(r"floor [0-9.]+ \(([^)]*)\)", msg) if r.rule == "absolute" else None
    if m and r.threshold is not None:
        thr = f", floor {r.threshold:.3f} ({m.group(1)})"
    return f"*{r.rule}*{scope}{sev}: {name} {val}{ci}{thr}{base}{beside}"


def _facts(ctx: AlertContext, who: str, results: Sequence[RuleResult], overall: RuleResult | None,
           kind: str) -> dict[str, Any]:
    """The message's label -> value facts: pair, held-out, k, models, baseline, the floor's metric with its
    floor and source (the other metric beside it), speedup, severity and the run's verdict word."""
    facts: dict[str, Any] = {
        "Pair": who, "Held-out": ctx.heldout, "k": ctx.num_speculative_tokens,
        "Target": _short(ctx.target_hash, ctx.target_ref), "Draft": _draft_fact(ctx),
        "Baseline": ctx.baseline,
    }
    if overall is not None and overall.value is not None:
        ci = f" (95% CI {overall.ci[0]:.3f}-{overall.ci[1]:.3f})" if overall.ci else ""
        label = "Per-token acceptance" if overall.metric == "per_token_acceptance" else "Acceptance rate"
        m = re.search(r"floor [0-9.]+ \(([^)]*)\)", overall.message or "")
        beside = overall.message[overall.message.index("; "):] if "; " in (overall.message or "") else ""
        facts[label] = (f"{overall.value:.3f}{ci}, floor {overall.threshold:.2f}"
                        + (f" ({m.group(1)})" if m else "") + beside.replace(";", ",", 1))
    speed = next((r for r in results if r.rule == "speed"), None)
    if speed is not None and speed.value is not None:
        ci = f" (95% CI {speed.ci[0]:.2f}-{speed.ci[1]:.2f}x)" if speed.ci else ""
        facts["Speedup"] = f"{speed.value:.2f}x{ci}" + (" [speed-inconclusive: machine overloaded]"
                                                        if speed.status == "inconclusive" else "")
    severity = severity_of([r for r in results if r.firing])
    if severity:
        facts["Severity"] = severity
    if kind in ("fire", "remind", "resolve"):
        facts["Verdict"] = verdict(results)  # the run's one word (specdec.policy.VERDICTS), as everywhere else
    return facts


def build_message(event: str, ctx: AlertContext, results: Sequence[RuleResult], *,
                  incident: Incident | None = None, now: dt.datetime | None = None) -> dict[str, Any]:
    """The channel-neutral message (stored in the outbox, rendered per channel at send time).

    Args:
        event: ``fire`` | ``remind-<n>`` | ``resolve`` | ``test``.
        ctx: facts about the pair and links. results: this run's rule results.
    Returns:
        JSON-ready dict with ``event``, ``title``, ``text`` (plain summary), ``facts`` (label ->
        value), ``lines`` (one per firing rule, fallen categories, hint), ``links``, ``rules``
        (firing rule dicts), ``categories_fell``, ``root_cause_hint``, pair fields and ids.
    """
    now = now or utcnow()
    firing = [r for r in results if r.firing]
    fell = [r for r in firing if r.rule == "absolute" and r.scope != "overall"]
    overall = next((r for r in results if r.rule == "absolute" and r.scope == "overall"), None)
    kind = event.split("-")[0]
    who = f"{ctx.pair_name} v{ctx.pair_version}" + (f" ({ctx.alias})" if ctx.alias else "")
    if kind == "resolve":
        title = f"Resolved: {who} is healthy again"
    elif kind == "remind":
        since = incident.opened_at.strftime("%Y-%m-%d %H:%M UTC") if incident else "?"
        title = f"Still firing since {since}: {who}"
    elif kind == "test":
        title = "specdec alert channel test"
    elif any(r.rule == "ungated_promotion" for r in firing):  # monitoring.promotion_alerts
        title = f"Ungated promotion: {who}"
    else:
        title = f"Speculative-decoding drift: {who}"
    facts = _facts(ctx, who, results, overall, kind)
    lines = [_fmt_rule(r) for r in firing if r not in fell]
    change = change_since_baseline(results)
    if change:
        lines.insert(0, change)
    headline = floor_headline(overall, ctx.num_speculative_tokens, ctx.changed) if kind in ("fire", "remind") else None
    if headline:  # the floor first, then the relative rule and speed
        lines.insert(0, headline)
    if fell:
        what = " (per-token acceptance)" if fell[0].metric == "per_token_acceptance" else ""
        lines.append(f"Categories that fell{what}: " + ", ".join(
            f"{r.scope} {r.value:.3f} < {r.threshold:.2f}" for r in fell if r.value is not None))
    if ctx.root_cause_hint and kind != "resolve":
        lines.append(f"Likely cause: {ctx.root_cause_hint}")
    actions = do_lines(firing, ctx.changed) if kind in ("fire", "remind") else []
    lines += actions
    if incident is not None and kind == "resolve":
        lines.append(f"Incident {incident.id} open since {incident.opened_at:%Y-%m-%d %H:%M} UTC, "
                     f"resolved by run {ctx.run_id}.")
    text_parts = [title] + [ln.replace("*", "") for ln in lines]
    text_parts += [f"{k}: {v}" for k, v in ctx.links.items() if v]
    return nan_to_none({
        "event": event, "title": title, "text": "\n".join(text_parts), "facts": {k: (None if v is None else str(v)) for k, v in facts.items()},
        "lines": lines, "links": {k: v for k, v in ctx.links.items() if v},
        "rules": [r.to_dict() for r in firing], "categories_fell": [r.scope for r in fell],
        "root_cause_hint": ctx.root_cause_hint, "actions": actions, "pair_name": ctx.pair_name,
        "pair_version": ctx.pair_version, "alias": ctx.alias, "run_id": ctx.run_id,
        "incident_id": incident.id if incident is not None else None, "created_at": now.isoformat(),
    })


def _enqueue(s, incident: Incident, transition: str, payload: dict[str, Any],
             channels: Iterable[ChannelConfig], now: dt.datetime) -> None:
    for c in channels:
        s.add(AlertDelivery(
            incident_id=incident.id, transition=transition, channel_id=c.channel_id,
            channel_type=c.type, idempotency_key=f"incident-{incident.id}:{transition}:{c.channel_id}",
            payload=payload, status=PENDING, attempts=0, created_at=now, updated_at=now,
        ))


#: an incident's summary key: the id of the incident whose message already told this night about the same version
QUIET = "alerted_with_incident"
#: the rule of an alert about an act, not a measurement (@champion moved by hand past the gate,
#: :mod:`monitoring.promotion_alerts`): it always speaks, even when the version already failed tonight
UNGATED_RULE = "ungated_promotion"
#: rules whose incidents always speak for themselves: an act (an ungated promotion) or traffic unlike the held-out
#: set are not the pair's acceptance measured again, so "one alert per version per night" never folds them
SPEAKS_ALONE = frozenset({UNGATED_RULE, REPRESENTATIVENESS})


def _twin(s, ctx: AlertContext, inc_id: int, now: dt.datetime, settings: MonitoringSettings) -> Incident | None:
    """Another firing incident of this pair that sent a message about the same version within the reminder
    interval (another alias or source failing the same version tonight), else None."""
    since = now - dt.timedelta(hours=settings.reminder_interval_hours)
    rows = s.scalars(select(Incident).where(Incident.pair_name == ctx.pair_name, Incident.status == FIRING,
                                            Incident.id != inc_id)).all()
    return next((i for i in rows if (i.summary or {}).get("pair_version") == ctx.pair_version
                 and not (i.summary or {}).get(QUIET) and i.last_notified_at >= since
                 and not SPEAKS_ALONE & {r.get("rule") for r in (i.summary or {}).get("rules") or []}), None)


def _fire(s, ctx: AlertContext, results: Sequence[RuleResult], *, summary: dict, settings: MonitoringSettings,
          now: dt.datetime) -> tuple[str | None, int]:
    """Open an incident and queue its message, unless this version was alerted tonight already (:func:`_twin`):
    then the incident is tracked quietly (no fire, reminder or resolve message of its own)."""
    inc = Incident(pair_name=ctx.pair_name, scope=ctx.scope, status=FIRING, opened_at=now, last_notified_at=now,
                   reminder_count=0, opened_run_id=ctx.run_id, last_run_id=ctx.run_id, summary=nan_to_none(summary))
    s.add(inc)
    s.flush()
    alone = bool(SPEAKS_ALONE & {r.rule for r in results if r.firing})
    twin = None if alone else _twin(s, ctx, inc.id, now, settings)
    if twin is not None:
        inc.summary = nan_to_none({**summary, QUIET: twin.id})
        log.info("%s v%s (%s) failed again tonight: incident %d opened quietly, incident %d already alerted",
                 ctx.pair_name, ctx.pair_version, ctx.scope or "pair", inc.id, twin.id)
        return None, inc.id
    _enqueue(s, inc, "fire", build_message("fire", ctx, results, incident=inc, now=now), settings.alert_channels, now)
    return "fire", inc.id


def _remind(s, inc: Incident, ctx: AlertContext, results: Sequence[RuleResult], *, summary: dict,
            settings: MonitoringSettings, now: dt.datetime) -> tuple[str | None, int]:
    """A firing incident failed again: a reminder once the interval passed (none for a quiet one while the incident
    that alerted for it still fires)."""
    quiet = (inc.summary or {}).get(QUIET)
    twin = s.get(Incident, quiet) if quiet else None
    quiet = quiet if twin is not None and twin.status == FIRING else None  # its twin resolved: it speaks again
    inc.last_run_id, inc.summary = ctx.run_id, nan_to_none({**summary, **({QUIET: quiet} if quiet else {})})
    if quiet or now < inc.last_notified_at + dt.timedelta(hours=settings.reminder_interval_hours):
        return None, inc.id
    inc.reminder_count += 1
    inc.last_notified_at = now
    name = f"remind-{inc.reminder_count}"
    _enqueue(s, inc, name, build_message(name, ctx, results, incident=inc, now=now), settings.alert_channels, now)
    return name, inc.id


def _transition(db: Database, ctx: AlertContext, results: Sequence[RuleResult], verdict_: str,
                settings: MonitoringSettings, now: dt.datetime) -> tuple[str | None, int | None]:
    """The incident transition of one evaluated run (fire, remind-<n>, resolve or none) and the incident id.
    One message per failing version per night: a second incident of the same version is quiet (:func:`_fire`)."""
    summary = {"verdict": verdict_, "run_id": ctx.run_id, "pair_version": ctx.pair_version,
               "rules": [r.to_dict() for r in results if r.firing], "root_cause_hint": ctx.root_cause_hint}
    with db.session() as s:
        inc = s.scalars(select(Incident).where(
            Incident.pair_name == ctx.pair_name, Incident.scope == ctx.scope, Incident.status == FIRING,
        ).with_for_update()).one_or_none()
        if verdict_ == FAILED_VERDICT:
            step = dict(summary=summary, settings=settings, now=now)
            return _fire(s, ctx, results, **step) if inc is None else _remind(s, inc, ctx, results, **step)
        if verdict_ == PASSED_VERDICT and inc is not None:
            inc.status, inc.resolved_at, inc.resolved_run_id = RESOLVED, now, ctx.run_id
            inc.last_run_id = ctx.run_id
            if (inc.summary or {}).get(QUIET):
                return None, inc.id
            _enqueue(s, inc, "resolve", build_message("resolve", ctx, results, incident=inc, now=now),
                     settings.alert_channels, now)
            return "resolve", inc.id
        if inc is not None:
            inc.last_run_id = ctx.run_id
        return None, inc.id if inc is not None else None


def process(
    db: Database, ctx: AlertContext, results: Sequence[RuleResult], *,
    settings: MonitoringSettings, now: dt.datetime | None = None,
    deliver: bool = True, client: httpx.Client | None = None,
) -> AlertOutcome:
    """Apply the incident lifecycle to one evaluated run and send what is due.

    Args:
        db: history store. ctx: pair facts and links. results: :func:`monitoring.rules.evaluate`.
        settings: channels, reminder interval, delivery retries (the caller's section).
        now: injected clock (aware UTC). deliver: send now (else only enqueue).
        client: optional ``httpx.Client`` reused for all sends.
    Returns:
        :class:`AlertOutcome`. Delivery failures do not raise: the rows stay pending.
    """
    now = now or utcnow()
    v = verdict(results)
    if not settings.alert_channels:
        log.warning("no alert channels configured (SPECDEC_ALERT_CHANNELS): incident state is "
                    "tracked but nobody is notified")
    for attempt in range(2):
        try:
            transition, incident_id = _transition(db, ctx, results, v, settings, now)
            break
        except IntegrityError:  # a concurrent process opened the incident first (Postgres)
            if attempt:
                raise
    if transition:
        log.info("incident %s of %s: %s", incident_id, ctx.pair_name, transition)
    deliveries = deliver_pending(db, settings=settings, now=now, client=client) if deliver else []
    return AlertOutcome(transition, incident_id, v, deliveries)


def _claim(db: Database, ids: list[int], now: dt.datetime, stale: dt.datetime) -> list[AlertDelivery]:
    claimed = []
    with db.session() as s:
        for i in ids:
            res = s.execute(
                update(AlertDelivery)
                .where(AlertDelivery.id == i, or_(
                    AlertDelivery.status == PENDING,
                    (AlertDelivery.status == SENDING) & (AlertDelivery.updated_at < stale)))
                .values(status=SENDING, updated_at=now)
            )
            if res.rowcount == 1:
                claimed.append(i)
        rows = list(s.scalars(select(AlertDelivery).where(AlertDelivery.id.in_(claimed)).order_by(AlertDelivery.id)))
    return rows


UNCONFIRMED = "unconfirmed"  # sent twice without an answer: not sent again (at most one duplicate)


def _maybe_before(row: AlertDelivery, stale_sending: bool) -> bool:
    """Whether a copy of this row may already be at the receiver: an earlier attempt got no answer,
    or a process crashed while the row was ``sending``."""
    return stale_sending or (row.last_error or "").startswith(ch.MAYBE_DELIVERED)


def _finish(db: Database, row_id: int, result: ch.SendResult, now: dt.datetime, maybe_before: bool) -> Delivery:
    with db.session() as s:
        row = s.get(AlertDelivery, row_id, with_for_update=True)
        row.attempts = (row.attempts or 0) + result.attempts
        row.response_status = result.status_code
        row.updated_at = now
        if result.ok:
            row.status, row.delivered_at, row.last_error = DELIVERED, utcnow(), None
        elif result.permanent:
            row.status, row.last_error = REFUSED, result.error
            log.error("alert %s to %s FAILED for good, not re-sent: %s", row.idempotency_key, row.channel_id, result.error)
        elif maybe_before and result.maybe_delivered:
            row.status = UNCONFIRMED
            row.last_error = (f"{ch.MAYBE_DELIVERED} (twice without an answer); not sent again so the "
                              f"receiver gets at most one duplicate: {result.error}")
            log.error("alert %s (%s) to %s: no answer twice; it may have arrived, it is not sent again",
                      row.transition, row.idempotency_key, row.channel_id)
        elif maybe_before or result.maybe_delivered:  # the one duplicate is still allowed
            error = result.error or ""
            row.status = PENDING
            row.last_error = error if error.startswith(ch.MAYBE_DELIVERED) else f"{ch.MAYBE_DELIVERED} once; now: {error}"
        else:
            row.status, row.last_error = PENDING, result.error
        return _to_delivery(row)


def deliver_pending(
    db: Database, *, settings: MonitoringSettings, now: dt.datetime | None = None,
    client: httpx.Client | None = None, transition: str | None = None,
) -> list[Delivery]:
    """Send every pending outbox row (oldest first; of ``transition`` only, if given) to its channel.

    Rows for channels no longer configured stay pending (logged). Within one channel, rows are sent
    in order and a failure holds back the later rows of that channel (a ``resolve`` never arrives
    before its ``fire``). Rows left ``sending`` by a crashed process are retried after
    ``delivery.stale_sending_s`` (the longest a live sender can take, plus 30 s).

    At most two copies of a row ever reach a receiver: a request that was sent but not answered
    (timeout after sending) or a row a crashed process left ``sending`` may have arrived, so the
    row gets one more attempt; if that one is unanswered too, the row becomes ``unconfirmed`` and
    is not sent again (logged as an error; :func:`pending_deliveries` lists it).
    Any exception while sending leaves the row ``pending`` (retried on the next run). A row refused
    for good (``SendResult.permanent``) becomes ``failed`` once (logged, not re-sent) and a
    ``channel-health`` alert goes to the other channels (:mod:`monitoring.channel_health`).

    Returns:
        The deliveries attempted in this call, with their new status (``delivered``, ``pending``,
        ``unconfirmed`` or ``failed``), channel-health alerts included.
    """
    now = now or utcnow()
    by_id = {c.channel_id: c for c in settings.alert_channels}
    stale = now - dt.timedelta(seconds=settings.delivery.stale_sending_s)
    with db.session() as s:
        candidates = list(s.scalars(select(AlertDelivery).where(or_(
            AlertDelivery.status == PENDING,
            (AlertDelivery.status == SENDING) & (AlertDelivery.updated_at < stale),
        )).order_by(AlertDelivery.id)))
    candidates = [r for r in candidates if transition in (None, r.transition)]
    unknown = sorted({r.channel_id for r in candidates if r.channel_id not in by_id})
    if unknown:
        log.warning("pending alerts for unconfigured channel(s) %s stay pending", ", ".join(unknown))
    was_sending = {r.id for r in candidates if r.status == SENDING}
    rows = _claim(db, [r.id for r in candidates if r.channel_id in by_id], now, stale)
    out: list[Delivery] = []
    blocked: set[str] = set()
    done: set[int] = set()
    in_flight: int | None = None
    own, health = client is None, 0
    client = client or httpx.Client(timeout=settings.delivery.timeout_s)
    try:
        for row in rows:
            channel = by_id[row.channel_id]
            if row.channel_id in blocked:
                with db.session() as s:
                    r = s.get(AlertDelivery, row.id)
                    r.status, r.updated_at = PENDING, now
                    out.append(_to_delivery(r))
                done.add(row.id)
                continue
            maybe = _maybe_before(row, row.id in was_sending)
            in_flight = row.id
            try:
                result = ch.send(channel, row.payload, row.idempotency_key, settings.delivery, client=client)
            except Exception as exc:  # noqa: BLE001 (send never raises by contract; belt and braces)
                result = ch.SendResult(False, None, 0, f"{type(exc).__name__} at send time")
            d = _finish(db, row.id, result, now, maybe)
            in_flight = None
            done.add(row.id)
            if not result.ok:
                blocked.add(row.channel_id)
            if d.status == REFUSED:
                health += enqueue_channel_health(db, d, settings.alert_channels, now)
            out.append(d)
    finally:
        if own:
            client.close()
        left = [r.id for r in rows if r.id not in done and r.id != in_flight]
        if left:  # interrupted: rows never sent go back to pending at once (the in-flight one goes stale)
            with db.session() as s:
                s.execute(update(AlertDelivery).where(AlertDelivery.id.in_(left), AlertDelivery.status == SENDING)
                          .values(status=PENDING))
    if health:  # tell the other channels now, not on the next run
        out += deliver_pending(db, settings=settings, now=now, client=None if own else client, transition=CHANNEL_HEALTH)
    return out


def pending_deliveries(db: Database) -> list[Delivery]:
    """Outbox rows not delivered (pending, sending, unconfirmed or failed), oldest first."""
    with db.session() as s:
        rows = s.scalars(select(AlertDelivery).where(AlertDelivery.status != DELIVERED).order_by(AlertDelivery.id))
        return [_to_delivery(r) for r in rows]


def open_incident(db: Database, pair_name: str, scope: str = "") -> Incident | None:
    """The firing incident of ``(pair_name, scope)`` (detached) or ``None``."""
    with db.session() as s:
        return s.scalars(select(Incident).where(
            Incident.pair_name == pair_name, Incident.scope == scope, Incident.status == FIRING)).one_or_none()


def send_test(settings: MonitoringSettings, *, client: httpx.Client | None = None,
              now: dt.datetime | None = None) -> list[tuple[ChannelConfig, ch.SendResult]]:
    """Send a test message to every configured channel (not through the outbox).

    Returns:
        ``(channel, result)`` per channel; print ``channel.display`` (never the URL).
    """
    now = now or utcnow()
    ctx = AlertContext(pair_name="(test)", pair_version="-",
                       root_cause_hint="this is a test message from `specdec alerts test`")
    payload = build_message("test", ctx, [], now=now)
    out = []
    for c in settings.alert_channels:
        key = f"test:{c.channel_id}:{now.isoformat()}"
        out.append((c, ch.send(c, payload, key, settings.delivery, client=client)))
    return out
