"""Promotion: move a pair alias (``champion`` / ``challenger``) only through the gate.

``promote`` judges the **latest finished validation run of that exact pair version** with
:func:`registry.gate.evaluate_gate`. Aliases live only in MLflow and are read back on every call, so a
promotion done by hand in the MLflow UI is what the nightly job sees next.

Written on a promotion: the version tag ``promotion`` (``champion 2026-11-30 by alice (gate passed)``,
or ``..., forced: <reason>``; :func:`registry.describe.promotion_label`), the registered-model tag
``specdec.alias.<alias>`` = the version (so :mod:`registry.ungated` can tell a move made outside
specdec, e.g. in the MLflow UI), and the one-line descriptions of the promoted version and of the
version that held the alias before.
"""

from __future__ import annotations

import getpass
from dataclasses import dataclass, field
from datetime import datetime, timezone

from registry.describe import ALIAS_RECORD_PREFIX, PROMOTION_TAG_KEY, promotion_label
from registry.errors import PromotionRefused
from registry.gate import GateConfig, GateResult, evaluate_gate
from registry.pairs import client_resolve_alias, get_pair_model_version, pair_aliases
from registry.runs import client_latest_validation_run, refresh_version
from registry.service import Registry, mlflow_errors
from registry.settings import VALIDATION_EXPERIMENT

ALIASES = ("champion", "challenger")


@dataclass
class PromotionResult:
    """What :func:`promote` did.

    Attributes:
        pair, version, alias: the alias now pointing at ``version``.
        previous_version: where the alias pointed before (None if unset).
        forced: True if the gate failed (or was never run) and ``force`` moved the alias anyway.
        gate: the gate verdict (``gate.run_id`` is the validation run judged, None if never validated).
        actor, reason: who promoted and why (reason only when given).
    """

    pair: str
    version: str
    alias: str
    previous_version: str | None
    forced: bool
    gate: GateResult
    actor: str
    reason: str | None = None
    reasons_overridden: list[str] = field(default_factory=list)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name and no passwd entry (containers with an arbitrary uid)
        return "unknown"


def check_alias_name(alias: str, allowed: list[str]) -> str:
    """``alias`` if it is in ``allowed`` (the registry section's ``aliases``: ``SPECDEC_ALIASES``, default
    champion / challenger).

    Raises:
        ValueError: a typo such as ``champoin`` (one line naming the allowed aliases).
    """
    if alias not in allowed:
        raise ValueError(f"unknown alias {alias!r}: use one of {', '.join(allowed)} "
                         "(other aliases must be listed in SPECDEC_ALIASES)")
    return alias


def clear_stale_promotions(client, pair: str, alias: str, holder: str | None,
                           experiment: str = VALIDATION_EXPERIMENT) -> list[str]:
    """Prefix ``was`` to the ``promotion`` tag (``"<alias> <date> by ..."``) of every version but
    ``holder``, so a version that lost ``alias`` shows ``promotion: was champion 2026-11-30 by alice``
    in the MLflow UI instead of a stale ``promotion: champion``; rewrite their descriptions.
    Returns the versions changed."""

    changed = []
    for mv in client.search_model_versions(f"name = '{pair}'"):
        label = (mv.tags or {}).get(PROMOTION_TAG_KEY, "")
        if str(mv.version) != str(holder) and label.split(" ", 1)[0] == alias and " reverted to " not in label:
            client.set_model_version_tag(pair, str(mv.version), PROMOTION_TAG_KEY, f"was {label}"[:500])
            refresh_version(client, pair, str(mv.version), experiment)
            changed.append(str(mv.version))
    return changed


def client_check_gate(client, pair: str, version: str | int, gate: GateConfig, experiment: str) -> GateResult:
    """Judge the latest finished validation run of ``pair`` version ``version`` by ``gate`` with the
    version's own floor when it has one (tag ``acceptance_floor``): a :class:`GateResult`;
    ``passed=False`` with the reason "never validated" and ``run_id=None`` when there is none."""
    run = client_latest_validation_run(client, pair, version, experiment)
    if run is None:
        return GateResult(passed=False, reasons=[f"version {version} was never validated (no finished validation run)"])
    tags = dict(client.get_model_version(pair, str(version)).tags or {})
    return evaluate_gate(run.data.metrics, gate.for_pair(tags), run_id=run.info.run_id)


def promote(
    pair: str,
    version: str | int,
    alias: str = "champion",
    *,
    force: bool = False,
    reason: str | None = None,
    actor: str | None = None,
    gate: GateConfig,
    experiment: str = VALIDATION_EXPERIMENT,
    registry: Registry,
) -> PromotionResult:
    """Point ``alias`` of ``pair`` at ``version`` if the latest validation of that exact version passes.

    Args:
        pair: pair registered model name.
        version: pair version to promote.
        alias: ``champion`` (gated by default), ``challenger`` (not gated by default) or another alias;
            ``gate.gated_aliases`` decides which aliases need a passing gate.
        force: move the alias even if the gate fails or the version was never validated. Requires
            ``reason``; the ``promotion`` version tag and the description then say who forced it and why.
        reason: why (required with ``force``; recorded whenever given).
        actor: who promotes (default: the OS user from ``getpass.getuser()``).
        gate: the gate criteria.
    Returns:
        :class:`PromotionResult`.
    Raises:
        PromotionRefused: the gate failed (``.reasons`` lists each failed criterion) and not ``force``.
        PairNotFound: no such pair or version. ValueError: ``force`` without ``reason``, or an alias
            not in ``SPECDEC_ALIASES`` (:func:`check_alias_name`).
        RegistryUnavailable: server unreachable.
    """
    version = str(version)
    if force and not (reason and reason.strip()):
        raise ValueError("a forced promotion needs a reason (--reason)")
    actor = actor or _user()
    check_alias_name(alias, registry.settings.aliases)
    client = registry.client
    uri = client.tracking_uri
    with mlflow_errors(uri):
        get_pair_model_version(client, pair, version)
        gated = alias in gate.gated_aliases
        verdict = client_check_gate(client, pair, version, gate, experiment)
        if gated and not verdict.passed and not force:
            raise PromotionRefused(pair, version, alias, verdict.reasons)
        previous = pair_aliases(client, pair).get(alias)
        forced = gated and not verdict.passed
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        label = promotion_label(alias, now, actor, gated=gated, passed=verdict.passed, forced=forced, reason=reason)
        client.set_registered_model_alias(pair, alias, version)
        client.set_registered_model_tag(pair, ALIAS_RECORD_PREFIX + alias, version)
        client.set_model_version_tag(pair, version, PROMOTION_TAG_KEY, label)
        stale = clear_stale_promotions(client, pair, alias, version)
        for v in dict.fromkeys(x for x in (version, previous) if x and x not in stale):  # new holder, old one
            refresh_version(client, pair, v, experiment)
    return PromotionResult(pair=pair, version=version, alias=alias, previous_version=previous, forced=forced,
                           gate=verdict, actor=actor, reason=reason,
                           reasons_overridden=list(verdict.reasons) if forced else [])


def demote(pair: str, alias: str, *, registry: Registry) -> None:
    """Remove ``alias`` from ``pair`` (e.g. retire a challenger).

    Raises:
        PairNotFound / AliasNotFound: nothing to remove.
    """
    client = registry.client
    with mlflow_errors(client.tracking_uri):
        version = client_resolve_alias(client, pair, alias)
        client.delete_registered_model_alias(pair, alias)
        refresh_version(client, pair, version)


def check_gate(pair: str, version: str | int, *, gate: GateConfig,
               experiment: str = VALIDATION_EXPERIMENT, registry: Registry) -> GateResult:
    """The gate's verdict on the latest finished validation run of ``pair`` v``version``
    (``passed=False``, "never validated", when there is none)."""
    with registry.errors():
        return client_check_gate(registry.client, pair, version, gate, experiment)
