"""Greedy target continuations from the engine that serves the target (docs/scale.md).

For a greedy night the expensive part of a replay, the target's continuation of each held-out prompt,
is what the serving engine (llama.cpp's ``llama-server``, vLLM's OpenAI server with ``return_tokens``-
style token ids) produces fastest: the prompt's token ids go in (the chat template applied once, by the
core's tokenizer), temperature 0, ``max_new_tokens`` ids come out. The core then replays the draft along
them (:mod:`specdec.validation.replay`): the nightly process holds the draft, never the target.

Each continuation is cached under the core's :class:`~specdec.validation.continuation_cache.ContinuationKey`
with ``engine`` = :attr:`EngineContinuations.digest` (the engine's fingerprint: build, served file path and
type, context, declared flags; no file hash, which would read the target's weights here), so a changed
engine or served file never reuses another's continuations, and a night that stopped half-way resumes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from specdec.core.config import SamplingConfig

__all__ = ["EngineContinuations", "TokenEngine", "engine_tokens", "connect_engine"]

_GREEDY = SamplingConfig()


class TokenEngine(Protocol):
    """What a continuation source needs of an engine client (:class:`specdec.engines.client.EngineClient`)."""

    def complete(self, prompt_ids: list[int], *, max_tokens: int, sampling: SamplingConfig,
                 seed: int | None = None) -> Any: ...  # an EngineCompletion: .token_ids, .stop


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
        client: a :class:`TokenEngine` (token ids in, token ids out).
        fingerprint: what identifies the serving stack (JSON-ready dict; ``engine`` names its profile).
        requests / seconds: completions asked and their wall seconds (the night's engine throughput).
    """

    client: TokenEngine
    fingerprint: dict[str, Any]
    requests: int = 0
    seconds: float = 0.0
    tokens: int = field(default=0)

    @property
    def digest(self) -> str:
        """sha256 hex of the canonical fingerprint (the cache key's ``engine`` field)."""
        return hashlib.sha256(json.dumps(self.fingerprint, sort_keys=True).encode()).hexdigest()

    @property
    def name(self) -> str:
        return str(self.fingerprint.get("engine", "engine"))

    def close(self) -> None:
        """Close the client's connections (when it has any)."""
        close = getattr(self.client, "close", None)
        if close is not None:
            close()

    def continuation(self, prompt_ids: list[int], *, max_new_tokens: int, stop: frozenset[int]) -> list[int]:
        """The engine's greedy continuation of ``prompt_ids`` (ids of the target's vocabulary), as
        :func:`engine_tokens` cuts it.

        Raises:
            specdec.engines.client.EngineRequestError: the engine failed, or its output ended before
            ``max_new_tokens`` without a stop token (an engine-side stop the core would not make).
        """
        from specdec.engines.client import EngineRequestError

        c = self.client.complete(list(prompt_ids), max_tokens=max_new_tokens, sampling=_GREEDY)
        y = engine_tokens(c.token_ids, stop, max_new_tokens)
        if len(y) < max_new_tokens and (not y or y[-1] not in stop):
            raise EngineRequestError(f"the engine's continuation ended after {len(y)} of {max_new_tokens} tokens "
                                     f"without a stop token (stop: {c.stop or 'unknown'})")
        self.requests += 1
        self.seconds += float(getattr(c, "wall_seconds", 0.0) or 0.0)
        self.tokens += len(y)
        return y


def connect_engine(url: str, *, engine: str = "llamacpp", api_key: str | None = None,
                   flags: tuple[str, ...] | None = None, timeout_s: float = 600.0) -> EngineContinuations:
    """An :class:`EngineContinuations` over the llama.cpp-compatible endpoint ``url`` (its fingerprint read
    once, from ``/props``; no file is hashed).

    Raises:
        specdec.engines.client.EngineRequestError: the engine is unreachable.
    """
    from specdec.engines.client import EngineClient
    from specdec.validation.engine_check import EngineEndpoint, engine_fingerprint

    client = EngineClient(url, api_key=api_key, timeout_s=timeout_s)
    endpoint = EngineEndpoint(url=url, engine=engine, api_key=api_key, flags=flags)
    return EngineContinuations(client, engine_fingerprint(client, endpoint, hash_files=False))
