"""The nightly's check for ungated promotions (an alias moved outside specdec to a version the gate
never let through; :mod:`registry.ungated`) and its alert (:mod:`monitoring.promotion_alerts`).

Before validating, :func:`check_ungated` looks at ``@champion`` of each pair; the flow then validates
that version first (champion before challenger) and :func:`report_ungated` raises the alert with
tonight's verdict, or resolves an open one when the alias is gated again.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

log = logging.getLogger("flows.nightly")

GATED_ALIAS = "champion"


def check_ungated(pair: str, aliases: Sequence[str], registry, gate) -> dict[str, Any]:
    """Check ``pair@champion`` (only when the nightly validates ``champion``); ``registry``: the night's
    MLflow service (:class:`registry.service.Registry`); ``gate``: the night's :class:`registry.gate.GateConfig`.

    Returns:
        ``{"checked": bool, "finding": registry.ungated.UngatedPromotion | None}``; an MLflow error
        is logged and leaves ``checked`` False (no alert either way tonight).
    """
    if GATED_ALIAS not in aliases:
        return {"checked": False, "finding": None}
    from registry.ungated import check_alias

    try:
        finding = check_alias(pair, GATED_ALIAS, gate=gate, registry=registry)
    except Exception as e:  # noqa: BLE001 (the validation itself must still run)
        log.error("%s@%s: ungated-promotion check failed: %s: %s", pair, GATED_ALIAS, type(e).__name__, e)
        return {"checked": False, "finding": None}
    if finding is not None:
        log.warning("ungated promotion: %s", finding.message())
    return {"checked": True, "finding": finding}


def _tonight(result) -> str:
    if result is None:
        return "not validated tonight"
    if result.acceptance_rate is not None and result.status in ("passed", "failed", "inconclusive"):
        ci = result.acceptance_rate_ci
        shown = f" [{ci[0]:.3f}, {ci[1]:.3f}]" if len(ci) == 2 else ""
        return f"validated first tonight: {result.status}, acceptance {result.acceptance_rate:.3f}{shown}"
    return f"tonight's validation: {result.status}" + (f" ({result.message})" if result.message else "")


def _recheck(pair: str, f, registry, gate):
    """After tonight's validation of the ungated version: None when it now passes the gate (adopted)."""
    from registry.ungated import check_alias

    try:
        return check_alias(pair, GATED_ALIAS, gate=gate, registry=registry)
    except Exception as e:  # noqa: BLE001 (keep the finding made before validating)
        log.error("%s@%s: re-check after validation failed: %s: %s", pair, GATED_ALIAS, type(e).__name__, e)
        return f


def _revert(pair: str, version: str, registry, gate) -> str:
    """Move @champion back (``revert=True``); the sentence the alert adds."""
    from registry.ungated import revert_alias

    try:
        to = revert_alias(pair, GATED_ALIAS, version, gate=gate, registry=registry)
    except Exception as e:  # noqa: BLE001 (the alert still goes out)
        log.error("%s@%s: revert failed: %s: %s", pair, GATED_ALIAS, type(e).__name__, e)
        return f" Not moved back: {type(e).__name__}: {e}."
    if to is None:
        return f" Not moved back: no other version passed the gate (or @{GATED_ALIAS} moved again)."
    log.warning("%s@%s moved back from v%s to v%s (revert)", pair, GATED_ALIAS, version, to)
    return f" Moved @{GATED_ALIAS} back to v{to}, the last version that passed the gate (specdec pair watch --revert)."


def report_ungated(db, checks: dict[str, dict[str, Any]], results: list, *, registry, settings, gate,
                   revert: bool = False) -> None:
    """Raise (or resolve) the ungated-promotion alert of each checked pair, after validation.

    The message names the version, when it was noticed, the gate's reasons and tonight's verdict;
    the champion's :class:`flows.tasks.NightlyResult` gets ``ungated_promotion`` (the message) and
    ``ungated_alert`` (the transition). A version that passes the gate tonight is adopted (no alert).
    With ``revert``, a version still ungated after tonight's validation loses @champion to the last
    version that passed (:func:`registry.ungated.revert_alias`) and the alert says so. ``settings``: the
    monitoring section (:class:`monitoring.settings.MonitoringSettings`: channels, delivery); ``gate``: the
    :class:`registry.gate.GateConfig` the re-check and the revert judge by.
    """
    from monitoring.promotion_alerts import alert_ungated_promotion

    for pair, check in checks.items():
        if not check["checked"]:
            continue
        f = check["finding"]
        champ = next((r for r in results if r.pair == pair and r.alias == GATED_ALIAS), None)
        validated = champ
        if f is not None and champ is not None and champ.status == "skipped" and champ.version == f.version:
            validated = next((r for r in results if r.pair == pair and r.version == f.version and r is not champ), champ)
        if f is not None and validated is not None and validated.status in ("passed", "inconclusive"):
            f = _recheck(pair, f, registry, gate)
        message = f"{f.message()} {_tonight(validated).capitalize()}." if f is not None else f"{pair}@{GATED_ALIAS} is gated again"
        if f is not None and revert:
            message += _revert(pair, f.version, registry, gate)
        try:
            out = alert_ungated_promotion(db, pair, GATED_ALIAS, version=f.version if f else (champ.version if champ else None),
                                          message=message, firing=f is not None, links=_links(pair, f, registry.uri),
                                          settings=settings)
        except Exception as e:  # noqa: BLE001 (the store or a channel failing must not stop the other pairs' alerts)
            log.error("%s: ungated-promotion alert not queued: %s: %s", pair, type(e).__name__, e)
            continue
        if champ is not None and f is not None:
            champ.ungated_promotion, champ.ungated_alert = message, out.transition
        elif champ is not None and out.transition:
            champ.ungated_alert = out.transition


def version_link(pair: str, version: str, uri: str) -> str:
    """The pair version in the MLflow UI (an http server at tracking ``uri``), else its ``models:/`` URI (for alerts)."""
    return f"{uri.rstrip('/')}/#/models/{pair}/versions/{version}" if uri.startswith("http") else f"models:/{pair}/{version}"


def _links(pair: str, f, uri: str) -> dict[str, str]:
    """The ungated version's link (:func:`version_link`)."""
    if f is None:
        return {}
    try:
        return {"MLflow version": version_link(pair, f.version, uri)}
    except Exception:  # noqa: BLE001 (a link is a convenience)
        return {"MLflow version": f"models:/{pair}/{f.version}"}
