"""``promote_flow``: run the promotion gate on the latest validation of a pair version, then move
the alias (``champion`` by default). ``force`` moves it anyway and records who and why."""

from __future__ import annotations

from prefect import flow, get_run_logger, task


@task(retries=2, retry_delay_seconds=[5, 20], task_run_name="gate {pair}@v{version}")
def check_promotion_gate(pair: str, version: str) -> dict:
    """The gate verdict of the latest validation run of ``models:/<pair>/<version>``.

    Returns ``GateResult`` as a dict (``passed``, ``reasons``, ``run_id``, ...).
    """
    from dataclasses import asdict

    from registry import check_gate

    return asdict(check_gate(pair, version))


@task(task_run_name="move @{alias} -> {pair}@v{version}")
def move_alias(pair: str, version: str, alias: str, force: bool, reason: str | None, actor: str | None) -> dict:
    """Move ``alias`` through :func:`registry.promote` (which re-checks the gate).

    Raises:
        registry.PromotionRefused: the gate failed (or the version was never validated) without force.
    """
    from dataclasses import asdict

    from registry import promote

    return asdict(promote(pair, version, alias, force=force, reason=reason, actor=actor))


@flow(name="promote-pair", log_prints=True)
def promote_flow(pair: str = "specdec-pair", version: str = "1", alias: str = "champion",
                 force: bool = False, reason: str | None = None, actor: str | None = None) -> dict:
    """Gate, then promote. Returns the promotion result as a dict.

    Raises:
        registry.PromotionRefused: with the gate's reasons, when it fails and ``force`` is False.
    """
    gate = check_promotion_gate(pair, str(version))
    get_run_logger().info("gate for %s v%s: %s", pair, version, "pass" if gate.get("passed") else gate.get("reasons"))
    return move_alias(pair, str(version), alias, force, reason, actor)
