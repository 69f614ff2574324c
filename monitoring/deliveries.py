"""Idempotency of MLflow webhook deliveries (table ``webhook_deliveries``, :class:`monitoring.db.WebhookDelivery`).

:func:`record_delivery` stores a delivery once (unique MLflow delivery id) together with the action
it causes; a second delivery with the same id, or a different delivery whose ``trigger_key`` (e.g.
``validate:<pair>:<version>``) was already taken, is recorded as nothing to do. Both checks are
unique constraints in SQL, so two receivers sharing a database cannot both act.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from monitoring.db import Database, WebhookDelivery, utcnow


@dataclass(frozen=True)
class DeliveryRecord:
    """What :func:`record_delivery` decided: ``new`` (act on it), ``duplicate`` (this delivery id
    was seen), or ``already`` (another delivery already triggered ``trigger_key``)."""

    outcome: str
    row_id: int | None = None


def _insert(db: Database, row: WebhookDelivery) -> int | None:
    try:
        with db.session() as s:
            s.add(row)
            s.flush()
            return row.id
    except IntegrityError:
        return None


def _seen(db: Database, delivery_id: str) -> bool:
    with db.session() as s:
        return s.scalar(select(WebhookDelivery.id).where(WebhookDelivery.delivery_id == delivery_id)) is not None


def record_delivery(db: Database, delivery_id: str, *, event: str, model_name: str, version: str | None,
                    action: str, trigger_key: str | None) -> DeliveryRecord:
    """Record a verified delivery and say whether to act on it.

    Args:
        delivery_id: MLflow's ``X-MLflow-Delivery-Id``. event: ``entity.action``.
        action: what the delivery asks for (``validate``, ``gate-champion``, or ``ignored: ...``).
        trigger_key: unique key of the effect (None: no effect, just recorded).
    Returns:
        :class:`DeliveryRecord` (``new`` / ``duplicate`` / ``already``).
    """
    if _seen(db, delivery_id):
        return DeliveryRecord("duplicate")
    row = dict(delivery_id=delivery_id, received_at=utcnow(), event=event[:64], model_name=model_name[:200],
               version=version, action=action[:200])
    rid = _insert(db, WebhookDelivery(**row, trigger_key=trigger_key))
    if rid is not None:
        return DeliveryRecord("new", rid)
    if _seen(db, delivery_id):  # a concurrent copy of the same delivery won
        return DeliveryRecord("duplicate")
    rid = _insert(db, WebhookDelivery(**{**row, "action": f"ignored: {trigger_key} already triggered"[:200]}))
    return DeliveryRecord("already" if rid is not None else "duplicate", rid)


def set_flow_run(db: Database, row_id: int, flow_run_id: str) -> None:
    """Remember the Prefect flow run a delivery started."""
    with db.session() as s:
        s.execute(update(WebhookDelivery).where(WebhookDelivery.id == row_id).values(flow_run_id=flow_run_id))


def release_trigger(db: Database, row_id: int, why: str) -> None:
    """Free a delivery's ``trigger_key`` when starting its effect failed, so a retry can act."""
    with db.session() as s:
        s.execute(update(WebhookDelivery).where(WebhookDelivery.id == row_id)
                  .values(trigger_key=None, action=f"failed: {why}"[:200]))


def deliveries(db: Database) -> list[WebhookDelivery]:
    """Every recorded delivery, oldest first."""
    with db.session() as s:
        return list(s.scalars(select(WebhookDelivery).order_by(WebhookDelivery.id)))
