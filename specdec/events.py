"""Step events: a long job announces the step it is at; observers subscribe.

The nightly announces ``validation`` (after each prompt or replay phase), ``history`` (before it writes
the history row) and the registry ``mlflow`` (a validation's MLflow run exists, still ``RUNNING``,
before its metrics and artifacts are logged). Each event goes to the ``specdec.events`` logger at
DEBUG (``--debug`` shows where a run was) and to every subscriber, in the announcing thread, in the
order they subscribed.

The product subscribes nothing here; an entry point may (the fault tests' entry point,
``tests/support/held_nightly.py``, pauses a live nightly at a step). A subscriber that raises stops
the announcing job, as any error at that step would.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepEvent:
    """One announcement. ``name``: the step (``validation``, ``history``, ``mlflow``); ``detail``:
    plain facts of it (``pair``, ``version``, ``done``/``total``, ``run_id``)."""

    name: str
    detail: dict[str, Any] = field(default_factory=dict)


Subscriber = Callable[[StepEvent], None]
_subscribers: list[Subscriber] = []


def subscribe(fn: Subscriber) -> Callable[[], None]:
    """Call ``fn`` with every :class:`StepEvent` from now on; returns the function that unsubscribes."""
    _subscribers.append(fn)
    return lambda: _subscribers.remove(fn) if fn in _subscribers else None


def announce(name: str, **detail: Any) -> None:
    """Announce step ``name`` (logged at DEBUG, then handed to each subscriber)."""
    event = StepEvent(name, detail)
    log.debug("step %s %s", name, detail)
    for fn in list(_subscribers):
        fn(event)
