"""The "ungated promotion" alert kind: one message when noticed, a reminder at most daily, one resolve;
its own incident, separate from the alias's drift incident. Real webhook receiver, SQLite history."""

from __future__ import annotations

import datetime as dt

from monitoring.db import connect
from monitoring.promotion_alerts import alert_ungated_promotion, ungated_scope
from monitoring.settings import ChannelConfig, DeliverySettings, MonitoringSettings
from monitoring.receiver import WebhookReceiver

T0 = dt.datetime(2026, 11, 30, 2, 0, tzinfo=dt.timezone.utc)
MSG = ("specdec-pair@champion points at v2, moved outside specdec (MLflow UI or API; specdec last set v1). "
       "Its latest validation did not pass the gate (never validated: version 2 was never validated). "
       "Noticed 2026-11-30 02:00:00 UTC.")


def test_ungated_promotion_alert_lifecycle(tmp_path):
    from monitoring import alerts

    with WebhookReceiver() as receiver:
        s = MonitoringSettings(db_url=f"sqlite:///{tmp_path / 'history.db'}",
                               alert_channels=[ChannelConfig(type="webhook", url=receiver.url("/hook"))],
                               delivery=DeliverySettings(max_attempts=1, backoff_initial_s=0, timeout_s=5))
        db = connect(s)
        fire = alert_ungated_promotion(db, "specdec-pair", "champion", version="2", message=MSG, firing=True,
                                       settings=s, now=T0)
        assert fire.transition == "fire" and fire.all_delivered
        body = receiver.accepted[0].body
        assert body["title"] == "Ungated promotion: specdec-pair v2 (champion)"
        assert MSG in body["text"] and "specdec pair promote" in body["text"]
        assert alerts.open_incident(db, "specdec-pair", ungated_scope("champion")) is not None
        assert alerts.open_incident(db, "specdec-pair", "champion") is None  # not the drift incident

        same_night = alert_ungated_promotion(db, "specdec-pair", "champion", version="2", message=MSG, firing=True,
                                             settings=s, now=T0 + dt.timedelta(hours=1))
        assert same_night.transition is None and len(receiver.accepted) == 1
        next_day = alert_ungated_promotion(db, "specdec-pair", "champion", version="2", message=MSG, firing=True,
                                           settings=s, now=T0 + dt.timedelta(hours=25))
        assert next_day.transition == "remind-1"
        gated = alert_ungated_promotion(db, "specdec-pair", "champion", version="2", message="gated again",
                                        firing=False, settings=s, now=T0 + dt.timedelta(hours=49))
        assert gated.transition == "resolve" and [r.body["event"] for r in receiver.accepted] == ["fire", "remind-1", "resolve"]
        quiet = alert_ungated_promotion(db, "specdec-pair", "champion", version="2", message="gated", firing=False,
                                        settings=s, now=T0 + dt.timedelta(hours=73))
        assert quiet.transition is None and len(receiver.accepted) == 3
