"""Run the real nightly flow on a tiny pair, as the flow tests do (not product code)."""

from __future__ import annotations

import datetime as dt


def nightly_by_alias(pair: str, heldout: str, day: dt.date) -> dict:
    """``nightly_validation_flow`` for ``pair`` on the held-out file ``heldout`` (every prompt, CPU, fp32) for
    the scheduled ``day``; returns ``{alias: NightlyResult}``."""
    from flows.nightly import nightly_validation_flow

    return {r.alias: r for r in nightly_validation_flow(pairs=[pair], heldout=heldout, limit=None,
                                                        device="cpu", dtype="float32", scheduled_date=day)}
