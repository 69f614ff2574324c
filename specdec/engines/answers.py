"""What an engine answers, checked before anything uses it: one completion with its own counters
(:class:`EngineCompletion`) and the server-wide speculative counters (:class:`EngineCounters`).

Every check here raises :class:`~specdec.engines.errors.EngineAnswerError` with one line naming what
was wrong; a malformed or impossible answer is never stored (docs/engine-check.md, "Refused answers").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from specdec.engines.errors import EngineAnswerError

__all__ = ["EngineCompletion", "EngineCounters", "token_ids_of", "count_of", "check_completion"]


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def token_ids_of(value: Any, what: str) -> list[int]:
    """``value`` as a list of token ids (ints >= 0; JSON integers only: no strings, floats, booleans).

    Raises:
        EngineAnswerError: not a list, or an element that is not a non-negative integer (the first one named).
    """
    if not isinstance(value, list):
        raise EngineAnswerError(f"{what} is {_kind(value)}, not a list of token ids")
    for i, x in enumerate(value):
        if not _is_int(x):
            raise EngineAnswerError(f"{what}[{i}] is {_kind(x)} {str(x)[:40]!r}, not an integer token id")
        if x < 0:
            raise EngineAnswerError(f"{what}[{i}] is the negative token id {x}")
    return list(value)


def count_of(value: Any, what: str) -> int:
    """A counter value: a non-negative integer (a float with an integral value is accepted: JSON/Prometheus).

    Raises:
        EngineAnswerError: negative, non-finite, fractional or not a number.
    """
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise EngineAnswerError(f"{what} is {_kind(value)} {str(value)[:40]!r}, not a count")
    if not math.isfinite(value) or value < 0 or value != int(value):
        raise EngineAnswerError(f"{what} is {value!r}, not a non-negative integer count")
    return int(value)


def _kind(x: Any) -> str:
    return {type(None): "null", dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            float: "a number"}.get(type(x), type(x).__name__)


@dataclass
class EngineCompletion:
    """One engine completion (what :meth:`specdec.engines.profile.EngineSession.complete` returns).

    Attributes:
        token_ids: the generated ids (a trailing stop token included when the engine stopped on one).
        text: the generated text.
        stop: why it stopped: ``eos``, ``limit`` (max tokens) or ``word``.
        num_draft_tokens / num_accepted_tokens: the engine's own counters for this request (llama.cpp
            ``timings.draft_n`` / ``draft_n_accepted``; 0 when it never drafted).
        num_drafts: the request's verification steps that drafted, when the engine reports them per
            request (vLLM per-request speculative metrics), else None.
        accepted_per_position: the request's accepted tokens per draft position (0-based), when the
            engine reports them per request, else None.
        predicted_n, predicted_ms, prompt_ms: the engine's generation timings (tokens, ms; 0 when unknown).
        wall_seconds: the request's wall time seen by the client (s).
    """

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    stop: str = ""
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_drafts: int | None = None
    accepted_per_position: list[int] | None = None
    predicted_n: int = 0
    predicted_ms: float = 0.0
    prompt_ms: float = 0.0
    wall_seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        """Generation throughput the engine measured (tokens/s; nan without timings)."""
        return self.predicted_n / (self.predicted_ms / 1e3) if self.predicted_ms > 0 else float("nan")


def check_completion(c: EngineCompletion, *, vocab_size: int, what: str = "the engine's answer") -> EngineCompletion:
    """``c`` itself when it is possible: every token id in ``[0, vocab_size)``, accepted <= drafted, the
    per-position counts summing to the accepted ones and never rising with the position, drafts <= drafted.

    Raises:
        EngineAnswerError: the first thing wrong, in one line (``what`` names the request).
    """
    for i, t in enumerate(c.token_ids):
        if not 0 <= t < vocab_size:
            raise EngineAnswerError(f"{what}: token id {t} at output position {i} is outside the pair's vocabulary "
                                    f"[0, {vocab_size}): the engine serves another model or answers garbage")
    EngineCounters(drafts=c.num_drafts, draft_tokens=c.num_draft_tokens, accepted=c.num_accepted_tokens,
                   per_position=c.accepted_per_position).check(what)
    return c


@dataclass(frozen=True)
class EngineCounters:
    """Speculative counters (cumulative server-wide from ``/metrics``, a delta of two, or one request's).

    Attributes (vLLM's names): drafts (verification steps that drafted; None: not exported),
    draft_tokens, accepted, per_position (accepted tokens per 0-based draft position; None: not exported).
    """

    drafts: int | None = None
    draft_tokens: int = 0
    accepted: int = 0
    per_position: list[int] | None = None

    def minus(self, before: "EngineCounters") -> "EngineCounters":
        """The delta ``self - before`` (positions missing on one side count 0).

        Raises:
            EngineAnswerError: a counter went down (the engine restarted during the run, or lies).
        """
        def sub(a, b, name):
            if a is None or b is None:
                return None
            if a < b:
                raise EngineAnswerError(f"the engine's {name} counter went down during the run ({b} -> {a}): it "
                                        "restarted or its counters are not cumulative")
            return a - b

        pp = None
        if self.per_position is not None:
            old = list(before.per_position or [])
            pp = [sub(a, old[i] if i < len(old) else 0, f"per-position[{i}]") for i, a in enumerate(self.per_position)]
        return EngineCounters(drafts=sub(self.drafts, before.drafts, "drafts"),
                              draft_tokens=sub(self.draft_tokens, before.draft_tokens, "draft tokens"),
                              accepted=sub(self.accepted, before.accepted, "accepted tokens"), per_position=pp)

    def check(self, what: str = "the engine's counters") -> "EngineCounters":
        """``self`` when possible; impossible counters are refused, never stored.

        Raises:
            EngineAnswerError: negative values, accepted > drafted tokens, more drafts than drafted tokens,
                per-position counts that rise with the position or do not sum to the accepted tokens.
        """
        for name, v in (("drafts", self.drafts), ("draft tokens", self.draft_tokens), ("accepted", self.accepted)):
            if v is not None and v < 0:
                raise EngineAnswerError(f"{what}: {name} is negative ({v})")
        if self.accepted > self.draft_tokens:
            raise EngineAnswerError(f"{what}: impossible counters, {self.accepted} accepted of {self.draft_tokens} "
                                    "drafted tokens (accepted > drafted): refused, not stored")
        if self.drafts is not None and self.drafts > self.draft_tokens:
            raise EngineAnswerError(f"{what}: impossible counters, {self.drafts} drafts but {self.draft_tokens} "
                                    "drafted tokens (every draft proposes at least one)")
        pp = self.per_position
        if pp:
            if any(b > a for a, b in zip(pp, pp[1:])) or any(x < 0 for x in pp):
                raise EngineAnswerError(f"{what}: impossible per-position counts {pp} (a later position cannot accept "
                                        "more than an earlier one)")
            if sum(pp) != self.accepted:
                raise EngineAnswerError(f"{what}: per-position counts {pp} sum to {sum(pp)}, not to the {self.accepted} "
                                        "accepted tokens")
        return self
