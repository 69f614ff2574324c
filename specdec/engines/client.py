"""HTTP client of a running serving engine: one completion with the engine's own speculative counters.

llama.cpp (``llama-server``): ``POST /completion`` with the prompt as token ids (so the engine
decodes from exactly the prompt tokens the core decodes from: the chat template is applied once, by
the core), ``return_tokens`` for the generated ids, ``cache_prompt: false`` so no request reuses
another's KV, and the response's ``timings``: ``predicted_n``, ``predicted_ms``, ``prompt_ms``,
``draft_n`` (drafted tokens) and ``draft_n_accepted`` (accepted drafted tokens), present when the
request drafted at least once (``tools/server/server-common.cpp``). ``GET /props`` gives the build
(``build_info``), the target file (``model_path``, ``model_ftype``), ``n_ctx``, the slots and the
speculative types; ``GET /metrics`` the server-wide counters (``--metrics``).

Errors are one line (:class:`EngineRequestError`); URLs are shown without credentials.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from specdec.core.config import SamplingConfig

__all__ = ["EngineRequestError", "EngineCompletion", "EngineClient", "safe_url"]


class EngineRequestError(RuntimeError):
    """A request to the engine failed (unreachable, HTTP error, or an answer without what we need)."""


def safe_url(url: str) -> str:
    """``url`` without user:password (for messages and reports)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


@dataclass
class EngineCompletion:
    """One engine completion.

    Attributes:
        token_ids: the generated ids (a trailing stop token included when the engine stopped on one).
        text: the generated text.
        stop: why it stopped: ``eos``, ``limit`` (max tokens) or ``word``.
        num_draft_tokens / num_accepted_tokens: the engine's own counters for this request
            (``timings.draft_n`` / ``draft_n_accepted``; 0 when it never drafted).
        predicted_n, predicted_ms, prompt_ms: the engine's generation timings (tokens, ms).
        wall_seconds: the request's wall time seen by the client (s).
    """

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    stop: str = ""
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    predicted_n: int = 0
    predicted_ms: float = 0.0
    prompt_ms: float = 0.0
    wall_seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        """Generation throughput the engine measured (tokens/s; nan without timings)."""
        return self.predicted_n / (self.predicted_ms / 1e3) if self.predicted_ms > 0 else float("nan")


class EngineClient:
    """A client of one llama.cpp-compatible engine endpoint.

    Args:
        url: the server's base URL, e.g. ``http://127.0.0.1:8080``.
        api_key: sent as ``Authorization: Bearer`` when given (``llama-server --api-key``).
        timeout_s: per-request timeout (connect and read), seconds.
    """

    def __init__(self, url: str, *, api_key: str | None = None, timeout_s: float = 600.0) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def _get(self, path: str) -> httpx.Response:
        try:
            resp = self._http.get(path)
            resp.raise_for_status()
        except httpx.HTTPError as e:
            raise EngineRequestError(f"GET {safe_url(self.url)}{path} failed: {type(e).__name__}: "
                                     f"{getattr(e, 'response', None) and e.response.status_code or e}") from None
        return resp

    def props(self) -> dict[str, Any]:
        """``GET /props`` (llama.cpp): build, model file, context, slots."""
        return self._get("/props").json()

    def metrics_text(self) -> str:
        """``GET /metrics``: the Prometheus exposition (the server needs ``--metrics``)."""
        return self._get("/metrics").text

    def complete(self, prompt_ids: list[int], *, max_tokens: int, sampling: SamplingConfig,
                 seed: int | None = None) -> EngineCompletion:
        """One completion of ``prompt_ids`` (token ids of the target's vocabulary).

        Args:
            prompt_ids: the prompt, chat template already applied (>= 1 id).
            max_tokens: ``n_predict``.
            sampling: temperature / top-k / top-p as the pair was validated (greedy: temperature 0).
            seed: the engine's sampling seed (T > 0).
        Raises:
            EngineRequestError: the request failed or the answer has no tokens.
        """
        body: dict[str, Any] = {"prompt": list(prompt_ids), "n_predict": int(max_tokens), "return_tokens": True,
                                "cache_prompt": False, "stream": False, "temperature": float(sampling.temperature),
                                "top_k": int(sampling.top_k or 0), "top_p": float(sampling.top_p or 1.0),
                                "min_p": 0.0, "repeat_penalty": 1.0, "samplers": ["top_k", "top_p", "temperature"]}
        if seed is not None:
            body["seed"] = int(seed)
        t0 = time.perf_counter()
        try:
            resp = self._http.post("/completion", json=body)
            resp.raise_for_status()
            data = resp.json()
        except (httpx.HTTPError, ValueError) as e:
            detail = e.response.text[:200] if isinstance(e, httpx.HTTPStatusError) else str(e)
            raise EngineRequestError(f"POST {safe_url(self.url)}/completion failed: {type(e).__name__}: {detail}") from None
        return _completion(data, time.perf_counter() - t0)


def _completion(data: dict[str, Any], wall: float) -> EngineCompletion:
    """An :class:`EngineCompletion` from llama-server's ``/completion`` answer."""
    if "tokens" not in data:
        raise EngineRequestError("the engine's answer has no `tokens` (a llama-server that honours return_tokens "
                                 "is needed for the token-level comparison)")
    t = data.get("timings") or {}
    stop = "eos" if data.get("stop_type") == "eos" else ("limit" if data.get("stop_type") == "limit" else
                                                          str(data.get("stop_type") or ""))
    return EngineCompletion(
        token_ids=[int(x) for x in data["tokens"]], text=str(data.get("content", "")), stop=stop,
        num_draft_tokens=int(t.get("draft_n", 0) or 0), num_accepted_tokens=int(t.get("draft_n_accepted", 0) or 0),
        predicted_n=int(t.get("predicted_n", 0) or 0), predicted_ms=float(t.get("predicted_ms", 0.0) or 0.0),
        prompt_ms=float(t.get("prompt_ms", 0.0) or 0.0), wall_seconds=wall,
    )
