"""Greedy target continuations from the engine that serves the target (docs/scale.md).

For a greedy night the expensive part of a replay, the target's continuation of each held-out prompt,
is what the serving engine produces fastest: through its engine profile (:mod:`specdec.engines.profile`,
:func:`specdec.engines.profiles.engine_profile`: llama.cpp's ``llama-server``, vLLM where its profile is
registered) the prompt's token ids go in (the chat template applied once, by the core's tokenizer),
temperature 0, ``max_new_tokens`` ids come out, each answer checked (ids in the vocabulary) and bounded by
the request deadline (``SPECDEC_ENGINE_REQUEST_TIMEOUT_S``). The core then replays the draft along
them (:mod:`specdec.validation.replay`): the nightly process holds the draft, never the target.

Each continuation is cached under the core's :class:`~specdec.validation.continuation_cache.ContinuationKey`
with ``engine`` = :attr:`EngineContinuations.digest` (the profile's base fingerprint: what the engine says
about itself, e.g. build, served file path and type, vocabulary, declared flags; no file hash, which would read
the target's weights here), so a changed
engine or served file never reuses another's continuations, and a night that stopped half-way resumes.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

from specdec.core.config import SamplingConfig

__all__ = ["EngineContinuations", "engine_tokens", "connect_engine"]

_GREEDY = SamplingConfig()


def engine_tokens(token_ids: list[int], stop: frozenset[int], max_new_tokens: int) -> list[int]:
    """An engine's output ids as the core's decoding emits them: at most ``max_new_tokens``, cut right
    after the first stop token (kept)."""
    y = list(token_ids[:max_new_tokens])
    for i, t in enumerate(y):
        if t in stop:
            return y[: i + 1]
    return y


@dataclass
class EngineContinuations:
    """A serving engine as the source of greedy target continuations.

    Attributes:
        session: an open :class:`~specdec.engines.profile.EngineSession` (token ids in, token ids out).
        fingerprint: what identifies the serving stack (JSON-ready dict; ``engine`` names its profile).
        limits: the request deadline (:class:`~specdec.engines.profile.EngineLimits`).
        requests / seconds / tokens: completions received, their wall seconds and new tokens (the night's
            engine throughput, for the scale model).
    """

    session: Any
    fingerprint: dict[str, Any]
    limits: Any
    requests: int = 0
    seconds: float = 0.0
    tokens: int = 0

    @property
    def digest(self) -> str:
        """sha256 hex of the canonical fingerprint (the cache key's ``engine`` field)."""
        return hashlib.sha256(json.dumps(self.fingerprint, sort_keys=True).encode()).hexdigest()

    @property
    def name(self) -> str:
        return str(self.fingerprint.get("engine", "engine"))

    def close(self) -> None:
        self.session.close()

    def continuation(self, prompt_ids: list[int], *, max_new_tokens: int, stop: frozenset[int],
                     vocab_size: int) -> list[int]:
        """The engine's greedy continuation of ``prompt_ids`` (ids of the target's vocabulary of ``vocab_size``),
        as :func:`engine_tokens` cuts it.

        Raises:
            specdec.engines.errors.EngineRequestError (or a subclass: deadline, malformed answer): the engine
            failed, answered ids outside the vocabulary, or stopped before ``max_new_tokens`` without a stop
            token (an engine-side stop the core would not make).
        """
        from specdec.engines.answers import check_completion
        from specdec.engines.errors import EngineAnswerError
        from specdec.engines.http import Deadline
        from specdec.engines.profile import CompletionParams

        deadline = Deadline.after(self.limits.request_timeout_s, "one continuation (SPECDEC_ENGINE_REQUEST_TIMEOUT_S)")
        t0 = time.perf_counter()
        c = self.session.complete(list(prompt_ids), CompletionParams(max_new_tokens, _GREEDY), deadline)
        check_completion(c, vocab_size=vocab_size, what="the engine's continuation")
        y = engine_tokens(c.token_ids, stop, max_new_tokens)
        if len(y) < max_new_tokens and (not y or y[-1] not in stop):
            raise EngineAnswerError(f"the engine's continuation ended after {len(y)} of {max_new_tokens} tokens "
                                    f"without a stop token (stop: {c.stop or 'unknown'})")
        self.requests, self.tokens = self.requests + 1, self.tokens + len(y)
        self.seconds += time.perf_counter() - t0
        return y


def connect_engine(endpoint: Any, limits: Any) -> EngineContinuations:
    """An :class:`EngineContinuations` over ``endpoint`` (a :class:`~specdec.engines.profile.EngineEndpoint`;
    ``limits``: :class:`~specdec.engines.profile.EngineLimits`, the core section's), its fingerprint read once:
    the profile's base fingerprint (the engine's self-description and declared flags), never a file hash.

    Raises:
        ValueError: the endpoint's engine has no profile that can be asked.
        specdec.engines.errors.EngineRequestError: the engine is unreachable.
    """
    from specdec.engines.http import Deadline
    from specdec.engines.profile import EngineProfile
    from specdec.engines.profiles import engine_profile

    profile = engine_profile(endpoint.engine)
    session = profile.connect(endpoint, limits)
    try:  # the base implementation: a profile's own may hash the served files, reading the target's weights
        fp = EngineProfile.fingerprint(profile, session, endpoint,
                                       Deadline.after(limits.request_timeout_s, "the engine's fingerprint"))
    except BaseException:
        session.close()
        raise
    return EngineContinuations(session, fp, limits)
