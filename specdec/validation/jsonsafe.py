"""JSON-safe values: :func:`nan_to_none` (a leaf module: the validation report and the engine check report
both serialize through it)."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["nan_to_none"]


def nan_to_none(x: Any) -> Any:
    """``x`` with every non-finite float (nan, inf) inside dicts, lists and tuples replaced by ``None``.

    JSON has no NaN or Infinity (Postgres JSON columns reject them); tuples come back as lists.
    """
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: nan_to_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [nan_to_none(v) for v in x]
    return x
