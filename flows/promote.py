"""``promote_flow``: run the promotion gate on the latest validation of a pair version, then move
the alias (``champion`` by default). ``force`` moves it anyway and records who and why."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE


@dataclass(frozen=True)
class AliasMove:
    """Which alias goes where, and (with ``force``) who moved it past a failed gate and why."""

    pair: str
    version: str
    alias: str = "champion"
    force: bool = False
    reason: str | None = None
    actor: str | None = None


@task(retries=2, retry_delay_seconds=[5, 20], task_run_name="gate {pair}@v{version}", cache_policy=NO_CACHE)
def check_promotion_gate(pair: str, version: str, registry, gate) -> dict:
    """The gate verdict of the latest validation run of ``models:/<pair>/<version>`` (``registry``: the flow
    run's :class:`registry.service.Registry`; ``gate``: its :class:`registry.gate.GateConfig`).

    Returns ``GateResult`` as a dict (``passed``, ``reasons``, ``run_id``, ...).
    """
    from registry import check_gate

    return asdict(check_gate(pair, version, gate=gate, registry=registry))


@task(task_run_name="move @{move.alias} -> {move.pair}@v{move.version}", cache_policy=NO_CACHE)
def move_alias(move: AliasMove, registry, gate) -> dict:
    """Move the alias through :func:`registry.promote` (which re-checks ``gate``).

    Raises:
        registry.PromotionRefused: the gate failed (or the version was never validated) without force.
    """
    from registry import promote

    return asdict(promote(move.pair, move.version, move.alias, force=move.force, reason=move.reason, actor=move.actor,
                          gate=gate, registry=registry))


@flow(name="promote-pair", log_prints=True)
def promote_flow(pair: str = "specdec-pair", version: str = "1", alias: str = "champion", *,
                 force: bool = False, reason: str | None = None, actor: str | None = None) -> dict:
    """Gate, then promote. Returns the promotion result as a dict.

    Raises:
        registry.PromotionRefused: with the gate's reasons, when it fails and ``force`` is False.
    """
    from flows.settings import for_this_run
    from registry.gate import GateConfig
    from registry.service import Registry

    tree = for_this_run()
    registry = Registry(tree.registry)  # this flow run's one MLflow service
    policy_gate = GateConfig.from_policy(tree.policy)
    gate = check_promotion_gate(pair, str(version), registry, policy_gate)
    get_run_logger().info("gate for %s v%s: %s", pair, version, "pass" if gate.get("passed") else gate.get("reasons"))
    return move_alias(AliasMove(pair, str(version), alias, force, reason, actor), registry, policy_gate)
