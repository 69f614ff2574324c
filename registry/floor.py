"""A pair version's own acceptance floor (tag ``acceptance_floor``) and what registration says about it.

The floor itself is the acceptance policy's (:func:`specdec.policy.floor_for`: the version's tag when set,
else ``SPECDEC_POLICY__THRESHOLD`` / 0.40). Here: setting the tag (``specdec pair register
--acceptance-floor``, or by hand in the MLflow UI), and, at registration, the warning when the pair's
validated acceptance rate at the chosen k is already below its floor, with the rate at smaller k
(from the latest validation run of the same target and draft: its per-position acceptance).
"""

from __future__ import annotations

from typing import Any, Mapping

from registry.service import Registry, mlflow_errors
from registry.settings import VALIDATION_EXPERIMENT
from specdec.policy import FLOOR_TAG, AcceptancePolicy, below_floor_note, floor_for, parse_floor, rates_by_k


def set_acceptance_floor(pair: str, version: str | int, floor: float | str, *, registry: Registry) -> float:
    """Tag pair version ``version`` with its own floor and refresh its description.

    Returns:
        the floor set (probability in [0, 1]).
    Raises:
        ValueError: not a number in [0, 1]; RegistryUnavailable / MlflowException: server or version missing.
    """
    from registry.runs import refresh_version

    value = parse_floor(floor)
    with mlflow_errors(registry.client.tracking_uri):
        registry.client.set_model_version_tag(pair, str(version), FLOOR_TAG, f"{value:g}")
        refresh_version(registry.client, pair, str(version))
    return value


def validated_rates(client, pair: str, target_uri: str, draft_uri: str | None,
                    experiment: str = VALIDATION_EXPERIMENT) -> dict[int, float]:
    """Acceptance rate by k (up to the k it ran at) of the latest finished validation run of ``pair`` with
    this target and draft (any version: e.g. the same models registered before at another k), from its
    per-position acceptance (:func:`specdec.policy.rates_by_k`); {} when there is none."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None or not draft_uri:
        return {}
    query = (f"tags.`specdec.pair` = '{pair}' and tags.`specdec.target` = '{target_uri}' and "
             f"tags.`specdec.draft` = '{draft_uri}' and attributes.status = 'FINISHED'")
    runs = client.search_runs([exp.experiment_id], query, order_by=["attributes.start_time DESC"], max_results=1)
    if not runs:
        return {}
    m = runs[0].data.metrics
    positions = []
    while f"acceptance_rate.pos_{len(positions)}" in m:
        positions.append(m[f"acceptance_rate.pos_{len(positions)}"])
    return rates_by_k(positions)


def registration_floor_note(pv: Any, *, policy: AcceptancePolicy, registry: Registry,
                            tags: Mapping[str, str] | None = None) -> str | None:
    """``acceptance rate 0.23 at k = 5 is already below floor 0.40 (policy default); at smaller k: ...`` when
    the pair version ``pv`` (a :class:`registry.PairVersion`) was registered at a k whose validated rate
    (:func:`validated_rates`) is below its floor (``policy``'s, or the version's own in ``tags``, default
    ``pv.tags``); None otherwise or when nothing was validated yet."""
    with mlflow_errors(registry.client.tracking_uri):
        rates = validated_rates(registry.client, pv.name, pv.target_uri, pv.draft_uri)
    floor = floor_for(policy, tags if tags is not None else pv.tags)
    return below_floor_note(rates, int(pv.config.num_speculative_tokens), floor)
