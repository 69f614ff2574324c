"""The engine check's errors: each is one line for the user (no traceback), and none carries a credential.

* :class:`EngineRequestError`: the engine could not be asked (unreachable, HTTP error, a dead worker).
* :class:`EngineDeadlineError`: a request or the whole check ran past its overall deadline (a dripping
  or hanging engine); the message names the deadline and the setting that sets it.
* :class:`EngineAnswerError`: the engine answered, but the answer is malformed or impossible (a JSON
  ``null`` body, a list, token ids outside ``[0, vocab)``, negative or non-integer ids, accepted >
  drafted counters); the message names what was wrong. Such an answer is never stored.
* :class:`EngineRefusedError`: the engine is not measured at all (a synthetic-acceptance mode is on:
  its counters would be a number someone typed in).

All derive from :class:`EngineRequestError`, so a caller that ends the check on any of them catches one type.
"""

from __future__ import annotations

__all__ = ["EngineRequestError", "EngineDeadlineError", "EngineAnswerError", "EngineRefusedError"]


class EngineRequestError(RuntimeError):
    """A request to the engine failed (unreachable, HTTP error, or an answer without what we need)."""


class EngineDeadlineError(EngineRequestError):
    """A request or the whole engine check did not finish within its overall deadline."""


class EngineAnswerError(EngineRequestError):
    """The engine's answer is malformed or impossible (the message names what was wrong)."""


class EngineRefusedError(EngineRequestError):
    """The engine check refuses to measure this engine (e.g. a synthetic-acceptance mode is on)."""
