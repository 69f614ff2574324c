"""Ungated promotions: an alias (``champion``) moved outside specdec, e.g. by hand in the MLflow UI,
to a version whose latest validation did not pass the gate, or that was never validated.

MLflow keeps no history of alias moves, so :func:`registry.promotion.promote` records the version it
moved each alias to in the registered-model tag ``specdec.alias.<alias>``. :func:`check_alias` compares
that record with where the alias points now:

- same version: moved by specdec (gated, or forced with a recorded reason): nothing to say;
- another version whose latest validation passes the gate: a hand move that the gate would have
  allowed; the record is updated to it ("adopted"), nothing to say;
- another version that failed or was never validated: an :class:`UngatedPromotion`. Its version tag
  ``promotion`` becomes ``champion outside specdec, noticed <time>`` (the first time it is noticed;
  later checks keep that time) and its description says so. It stays ungated until a validation of
  that version passes (then it is adopted) or specdec moves the alias.

The nightly flow calls :func:`check_alias` before validating, validates that version first, and
raises an "ungated promotion" alert (:mod:`monitoring.promotion_alerts`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone

from registry.describe import ALIAS_RECORD_PREFIX, PROMOTION_TAG_KEY, refresh_description
from registry.gate import GateConfig
from registry.service import Registry, mlflow_errors
from registry.settings import VALIDATION_EXPERIMENT

_NOTICED = " outside specdec, noticed "


@dataclass
class UngatedPromotion:
    """An alias that points at a version the gate never let through.

    Attributes:
        pair, alias, version: where the alias points now.
        recorded_version: the version specdec last moved the alias to (None: never).
        gate_state: ``never validated`` or ``failed``.
        reasons: the gate's reasons (empty only if none were given).
        noticed_at: UTC time it was first noticed (ISO-8601, seconds).
    """

    pair: str
    alias: str
    version: str
    recorded_version: str | None
    gate_state: str
    reasons: list[str] = field(default_factory=list)
    noticed_at: str = ""

    def message(self) -> str:
        """One paragraph for the alert: which version, how it differs from the record, when noticed."""
        was = f"specdec last set v{self.recorded_version}" if self.recorded_version else "specdec never set it"
        why = "; ".join(self.reasons) or self.gate_state
        return (f"{self.pair}@{self.alias} points at v{self.version}, moved outside specdec (MLflow UI or API; {was}). "
                f"Its latest validation did not pass the gate ({self.gate_state}: {why}). "
                f"Noticed {self.noticed_at.replace('T', ' ').replace('+00:00', ' UTC')}.")


def _noticed_at(label: str | None, alias: str) -> str | None:
    prefix = alias + _NOTICED
    return label[len(prefix):] if label and label.startswith(prefix) else None


def check_alias(pair: str, alias: str = "champion", *, gate: GateConfig,
                experiment: str = VALIDATION_EXPERIMENT, now: datetime | None = None,
                registry: Registry) -> UngatedPromotion | None:
    """Is ``pair@alias`` an ungated promotion? (See the module docstring for the rules.)

    Args:
        pair: pair registered model. alias: the gated alias to check (default ``champion``).
        gate: the gate criteria (:meth:`GateConfig.from_policy`). now: injected clock (aware UTC).
    Returns:
        :class:`UngatedPromotion`, or None (alias unset, moved by specdec, or its version passes).
        Side effects in MLflow: the record is adopted, or the version's ``promotion`` tag and
        description say when the ungated move was noticed.
    Raises:
        PairNotFound: no such pair. RegistryUnavailable: server unreachable.
    """
    from registry.gate import GateResult, evaluate_gate
    from registry.pairs import pair_aliases
    from registry.promotion import clear_stale_promotions
    from registry.runs import client_latest_validation_run

    client = registry.client
    with mlflow_errors(client.tracking_uri):
        aliases = pair_aliases(client, pair)
        version = aliases.get(alias)
        if version is None:
            return None
        recorded = (client.get_registered_model(pair).tags or {}).get(ALIAS_RECORD_PREFIX + alias)
        if recorded == version:
            return None
        mv = client.get_model_version(pair, version)
        tags = dict(mv.tags or {})
        run = client_latest_validation_run(client, pair, version, experiment)
        verdict = (GateResult(passed=False, reasons=[f"version {version} was never validated"]) if run is None
                   else evaluate_gate(run.data.metrics, gate.for_pair(tags), run_id=run.info.run_id))
        if verdict.passed or tags.get("promotion.alias") == alias:  # passes, or promoted by an earlier specdec (promotion.* tags)
            client.set_registered_model_tag(pair, ALIAS_RECORD_PREFIX + alias, version)
            clear_stale_promotions(client, pair, alias, version, experiment)
            return None
        label = tags.get(PROMOTION_TAG_KEY)
        noticed = _noticed_at(label, alias)
        if noticed is None:
            noticed = (now or datetime.now(timezone.utc)).isoformat(timespec="seconds")
            client.set_model_version_tag(pair, version, PROMOTION_TAG_KEY, f"{alias}{_NOTICED}{noticed}")
            refresh_description(client, pair, version, run)
            clear_stale_promotions(client, pair, alias, version, experiment)
        state = "never validated" if verdict.run_id is None else "failed"
        return UngatedPromotion(pair=pair, alias=alias, version=version, recorded_version=recorded,
                                gate_state=state, reasons=list(verdict.reasons), noticed_at=noticed)


def last_passing_version(pair: str, alias: str = "champion", *, exclude: str | None = None,
                         gate: GateConfig, experiment: str = VALIDATION_EXPERIMENT,
                         registry: Registry) -> str | None:
    """The version to move ``alias`` back to: the one specdec last set it to, if its latest
    validation passes the gate, else the newest version whose latest validation passes (never
    ``exclude``). None when no version passes."""
    from registry.gate import evaluate_gate
    from registry.runs import client_latest_validation_run

    client = registry.client
    with mlflow_errors(client.tracking_uri):
        recorded = (client.get_registered_model(pair).tags or {}).get(ALIAS_RECORD_PREFIX + alias)
        versions = sorted({mv.version for mv in client.search_model_versions(f"name = '{pair}'")}, key=int, reverse=True)
        for v in dict.fromkeys([x for x in (recorded, *versions) if x and x != exclude]):
            run = client_latest_validation_run(client, pair, v, experiment)
            if run is not None and evaluate_gate(run.data.metrics, gate, run_id=run.info.run_id).passed:
                return v
    return None


def revert_alias(pair: str, alias: str, from_version: str, *, actor: str = "specdec pair watch --revert",
                 gate: GateConfig, registry: Registry) -> str | None:
    """Move ``pair@alias`` from the ungated ``from_version`` back to :func:`last_passing_version`.

    Only while the alias still points at ``from_version`` (a later move is left alone). The reverted
    version's ``promotion`` tag and description say ``<alias> reverted to v<N> by specdec <time>``.
    Returns:
        the version the alias now points at, or None (nothing passes, or the alias moved meanwhile).
    """
    from registry.pairs import pair_aliases
    from registry.promotion import promote
    from registry.runs import refresh_version

    client = registry.client
    with mlflow_errors(client.tracking_uri):
        if pair_aliases(client, pair).get(alias) != str(from_version):
            return None
    to = last_passing_version(pair, alias, exclude=str(from_version), gate=gate, registry=registry)
    if to is None:
        return None
    promote(pair, to, alias, actor=actor, reason=f"v{from_version} was made @{alias} outside specdec and failed the gate",
            gate=gate, registry=registry)
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    with mlflow_errors(client.tracking_uri):
        client.set_model_version_tag(pair, str(from_version), PROMOTION_TAG_KEY,
                                     f"{alias} reverted to v{to} by specdec {now[:16].replace('T', ' ')} UTC")
        refresh_version(client, pair, str(from_version))
    return to
