"""The alert about an alert channel that refuses messages for good.

When the receiver of one channel refuses an outbox row for good (a permanent 4xx, a redirect that
cannot be followed), every other configured channel gets one ``channel-health`` message naming the
channel and the error, through the same outbox (idempotency key
``channel-health:<failed row id>:<channel id>``), so the refusal cannot go unnoticed.
"""

from __future__ import annotations

import datetime as dt
from typing import Sequence

from sqlalchemy import select

from monitoring.db import PENDING, AlertDelivery, Database
from monitoring.settings import ChannelConfig

CHANNEL_HEALTH = "channel-health"  # transition of the alert about a refusing channel, sent on the others
REFUSED = "failed"  # outbox status: the receiver refused the row for good; it is not re-sent


def enqueue_channel_health(db: Database, failed, channels: Sequence[ChannelConfig],
                            now: dt.datetime) -> int:
    """Queue one alert about ``failed``'s channel on every other channel (idempotent per failed row).

    An alert about a channel-health alert is not raised (no ping-pong between two broken channels).
    Returns the number of rows queued.
    """
    if failed.transition.startswith(CHANNEL_HEALTH):
        return 0
    others = [c for c in channels if c.channel_id != failed.channel_id]
    title = f"Alert channel {failed.channel_id} refuses messages"
    payload = {"event": CHANNEL_HEALTH, "title": title,
               "text": f"{title}: the {failed.transition} message {failed.idempotency_key} was not delivered "
                       f"and will not be re-sent: {failed.last_error}. Fix the channel's URL.",
               "lines": [f"*{failed.channel_id}*: {failed.last_error}"], "facts": {"Channel": failed.channel_id},
               "incident_id": failed.incident_id, "created_at": now.isoformat()}
    added = 0
    with db.session() as s:
        for c in others:
            key = f"{CHANNEL_HEALTH}:{failed.id}:{c.channel_id}"
            if s.scalars(select(AlertDelivery.id).where(AlertDelivery.idempotency_key == key)).first() is None:
                s.add(AlertDelivery(incident_id=failed.incident_id, transition=CHANNEL_HEALTH, channel_id=c.channel_id,
                                    channel_type=c.type, idempotency_key=key, payload=payload, status=PENDING,
                                    attempts=0, created_at=now, updated_at=now))
                added += 1
    return added
