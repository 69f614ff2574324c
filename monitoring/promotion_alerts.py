"""The "ungated promotion" alert: a gated alias (``champion``) was moved outside specdec to a version
the promotion gate never let through (see :mod:`registry.ungated`, which decides that; monitoring
never imports registry, the facts come in as plain strings).

It is an incident of scope ``ungated-promotion:<alias>`` with one rule, ``ungated_promotion``: sent
once when noticed, reminded at most daily while the alias stays ungated, resolved by the first check
that finds it gated again (the version passed a validation, or specdec moved the alias).
"""

from __future__ import annotations

import datetime as dt

import httpx

from monitoring import alerts, rules
from monitoring.db import Database
from monitoring.settings import MonitoringSettings

UNGATED_RULE = alerts.UNGATED_RULE


def ungated_scope(alias: str) -> str:
    """The incident scope of ungated promotions of ``alias``."""
    return f"ungated-promotion:{alias}"[:64]


def alert_ungated_promotion(
    db: Database, pair_name: str, alias: str, *, version: str | None, message: str, firing: bool,
    settings: MonitoringSettings, links: dict[str, str] | None = None,
    now: dt.datetime | None = None, client: httpx.Client | None = None,
) -> alerts.AlertOutcome:
    """Open, remind or resolve the ungated-promotion incident of ``pair_name@alias``.

    Args:
        version: the pair version the alias points at ("?" when unknown).
        message: what happened (which version, the gate's verdict, when it was noticed); no secrets.
        firing: True while the alias is ungated; False resolves an open incident (else does nothing).
        links: name -> URL/path shown in the message.
    Returns:
        :class:`monitoring.alerts.AlertOutcome` (``transition`` ``fire`` / ``remind-<n>`` /
        ``resolve`` / None). Delivery failures do not raise: the rows stay pending.
    """
    result = rules.RuleResult(rule=UNGATED_RULE, scope=rules.OVERALL, status=rules.FIRING if firing else rules.OK,
                              metric="reference", message=message)
    hint = (f"validate v{version} (the nightly does) and promote through the gate with `specdec pair promote`, "
            f"or move @{alias} back" if firing else None)
    ctx = alerts.AlertContext(pair_name=pair_name, pair_version=version or "?", scope=ungated_scope(alias),
                              alias=alias, root_cause_hint=hint, links=dict(links or {}))
    return alerts.process(db, ctx, [result], settings=settings, now=now, client=client)
