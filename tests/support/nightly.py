"""Run the real nightly flow on a tiny pair, as the flow tests do (not product code)."""

from __future__ import annotations

import datetime as dt


def nightly_by_alias(pair: str, heldout: str, day: dt.date) -> dict:
    """``nightly_validation_flow`` for ``pair`` on the held-out file ``heldout`` (every prompt, CPU, fp32) for
    the scheduled ``day``; returns ``{alias: NightlyResult}``."""
    from flows.nightly import nightly_validation_flow

    return {r.alias: r for r in nightly_validation_flow(pairs=[pair], heldout=heldout, limit=None,
                                                        device="cpu", dtype="float32", scheduled_date=day)}


def webhook_settings(db_path, hook_url: str):
    """:class:`~monitoring.settings.MonitoringSettings` with a SQLite history at ``db_path`` and one webhook
    channel at ``hook_url`` (quick retries: a test's receiver answers at once)."""
    from monitoring.settings import ChannelConfig, DeliverySettings, MonitoringSettings

    return MonitoringSettings(db_url=f"sqlite:///{db_path}", alert_channels=[ChannelConfig(type="webhook", url=hook_url)],
                              delivery=DeliverySettings(max_attempts=2, backoff_initial_s=0.01, backoff_max_s=0.05,
                                                        timeout_s=5))
