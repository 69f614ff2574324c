"""HTTP client of a running ``llama-server``: one completion with the engine's own speculative counters.

llama.cpp (``llama-server``): ``POST /completion`` with the prompt as token ids (so the engine
decodes from exactly the prompt tokens the core decodes from: the chat template is applied once, by
the core), ``return_tokens`` for the generated ids, ``cache_prompt: false`` so no request reuses
another's KV, and the response's ``timings``: ``predicted_n``, ``predicted_ms``, ``prompt_ms``,
``draft_n`` (drafted tokens) and ``draft_n_accepted`` (accepted drafted tokens), present when the
request drafted at least once (``tools/server/server-common.cpp``). ``GET /props`` gives the build
(``build_info``), the target file (``model_path``, ``model_ftype``), ``n_ctx``, the slots, the BOS/EOS
strings; ``GET /v1/models`` the vocabulary (``meta.n_vocab``); ``GET /metrics`` the server-wide
counters (``--metrics``).

Every request is read whole within one overall deadline (:func:`specdec.engines.http.read_within`);
errors are one line (:mod:`specdec.engines.errors`); URLs are shown without credentials. The
llama.cpp engine profile (:class:`specdec.engines.llamacpp.LlamaCppProfile`) asks through this client.
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from specdec.core.config import SamplingConfig
from specdec.engines.answers import EngineCompletion, count_of, token_ids_of
from specdec.engines.errors import EngineAnswerError, EngineDeadlineError, EngineRequestError
from specdec.engines.http import Deadline, engine_root, join_url, read_within
from specdec.engines.profile import DEFAULT_REQUEST_TIMEOUT_S

__all__ = ["EngineRequestError", "EngineCompletion", "EngineClient", "safe_url"]


def safe_url(url: str) -> str:
    """``url`` without user:password (for messages and reports); a URL that does not parse is shown as
    ``<unparsable URL>``."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port
    except ValueError:
        return "<unparsable URL>"
    netloc = (f"[{host}]" if ":" in host else host) + (f":{port}" if port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class EngineClient:
    """A client of one llama.cpp-compatible engine endpoint.

    Args:
        url: the server's base URL, e.g. ``http://127.0.0.1:8080`` or the OpenAI base URL ``http://host/v1``
            (:func:`~specdec.engines.http.engine_root`); each request's URL is joined to it as a URL.
        api_key: sent as ``Authorization: Bearer`` when given (``llama-server --api-key``).
        timeout_s: each request's overall deadline (connect to last byte), seconds.
    Raises:
        EngineRequestError: ``url`` is not a URL httpx accepts.
    """

    def __init__(self, url: str, *, api_key: str | None = None, timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S) -> None:
        self.timeout_s = float(timeout_s)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        try:
            self.url = engine_root(url)
            self._http = httpx.Client(headers=headers, timeout=self.timeout_s)
            self._http.build_request("GET", self.url)
        except (ValueError, TypeError, httpx.InvalidURL, httpx.UnsupportedProtocol) as e:
            raise EngineRequestError(f"bad engine URL {safe_url(url)}: {e}") from None

    def close(self) -> None:
        self._http.close()

    def _deadline(self, deadline: Deadline | None, path: str) -> Deadline:
        own = Deadline.after(self.timeout_s, f"the engine request {path} (SPECDEC_ENGINE_REQUEST_TIMEOUT_S)")
        return own if deadline is None or own.at < deadline.at else deadline

    def request(self, method: str, path: str, *, deadline: Deadline | None = None, body: Any = None) -> str:
        """The body text of ``method path`` (2xx), read whole by the deadline.

        Raises:
            EngineRequestError: unreachable, HTTP error (the status and the start of the body);
            EngineDeadlineError: not complete by the deadline.
        """
        dl = self._deadline(deadline, f"{method} {path}")
        url = join_url(self.url, path)
        where = f"{method} {safe_url(url)}"
        try:
            got = read_within(self._http, method, url, deadline=dl, **({"json": body} if body is not None else {}))
        except TimeoutError as e:
            raise EngineDeadlineError(f"{where}: {dl.message()} ({e})") from None
        except httpx.HTTPError as e:
            raise EngineRequestError(f"{where} failed: {type(e).__name__}: {e}") from None
        if got.status_code >= 400:
            raise EngineRequestError(f"{where} failed: HTTP {got.status_code}: {got.text[:200]}")
        return got.text

    def json(self, method: str, path: str, *, deadline: Deadline | None = None, body: Any = None) -> dict[str, Any]:
        """The JSON object ``method path`` answers.

        Raises:
            EngineAnswerError: not JSON, or JSON that is not an object (``null``, a list, a number).
        """
        text = self.request(method, path, deadline=deadline, body=body)
        where = f"{method} {safe_url(join_url(self.url, path))}"
        try:
            data = json.loads(text)
        except ValueError:
            raise EngineAnswerError(f"{where}: the answer is not JSON: {text[:80]!r}") from None
        if not isinstance(data, dict):
            kind = "null" if data is None else type(data).__name__.replace("list", "a list")
            raise EngineAnswerError(f"{where}: the answer is {kind}, not a JSON object")
        return data

    def props(self, deadline: Deadline | None = None) -> dict[str, Any]:
        """``GET /props`` (llama.cpp): build, model file, context, slots, BOS/EOS strings."""
        return self.json("GET", "/props", deadline=deadline)

    def models(self, deadline: Deadline | None = None) -> dict[str, Any]:
        """``GET /v1/models``: ``data[0].meta`` holds ``n_vocab``, ``n_params``, ``size``, ``ftype``."""
        return self.json("GET", "/v1/models", deadline=deadline)

    def metrics_text(self, deadline: Deadline | None = None) -> str:
        """``GET /metrics``: the Prometheus exposition (the server needs ``--metrics``)."""
        return self.request("GET", "/metrics", deadline=deadline)

    def complete(self, prompt_ids: list[int], *, max_tokens: int, sampling: SamplingConfig,
                 seed: int | None = None, deadline: Deadline | None = None) -> EngineCompletion:
        """One completion of ``prompt_ids`` (token ids of the target's vocabulary).

        Args:
            prompt_ids: the prompt, chat template already applied (>= 1 id).
            max_tokens: ``n_predict``.
            sampling: temperature / top-k / top-p as the pair was validated (greedy: temperature 0).
            seed: the engine's sampling seed (T > 0).
            deadline: the overall deadline (the earlier of it and this client's ``timeout_s``).
        Raises:
            EngineRequestError: the request failed; EngineAnswerError: the answer is malformed (one line
            naming what was wrong); EngineDeadlineError: not complete by the deadline.
        """
        body: dict[str, Any] = {"prompt": list(prompt_ids), "n_predict": int(max_tokens), "return_tokens": True,
                                "cache_prompt": False, "stream": False, "temperature": float(sampling.temperature),
                                "top_k": int(sampling.top_k or 0), "top_p": float(sampling.top_p or 1.0),
                                "min_p": 0.0, "repeat_penalty": 1.0, "samplers": ["top_k", "top_p", "temperature"]}
        if seed is not None:
            body["seed"] = int(seed)
        t0 = time.perf_counter()
        data = self.json("POST", "/completion", deadline=deadline, body=body)
        return completion_of(data, time.perf_counter() - t0)


def completion_of(data: dict[str, Any], wall: float) -> EngineCompletion:
    """An :class:`EngineCompletion` from llama-server's ``/completion`` answer (a JSON object).

    Raises:
        EngineAnswerError: no ``tokens``, tokens that are not non-negative integers, timings that are not
            an object or counters that are not non-negative integers.
    """
    if "tokens" not in data:
        raise EngineAnswerError("the engine's answer has no `tokens` (a llama-server that honours return_tokens "
                                "is needed for the token-level comparison)")
    ids = token_ids_of(data["tokens"], "the engine's `tokens`")
    t = data.get("timings") or {}
    if not isinstance(t, dict):
        raise EngineAnswerError(f"the engine's `timings` is {type(t).__name__}, not an object")
    st = data.get("stop_type")
    stop = st if st in ("eos", "limit") else str(st or "")
    try:
        ms = (float(t.get("predicted_ms", 0.0) or 0.0), float(t.get("prompt_ms", 0.0) or 0.0))
    except (TypeError, ValueError):
        raise EngineAnswerError("the engine's `timings` has a non-numeric predicted_ms / prompt_ms") from None
    return EngineCompletion(
        token_ids=ids, text=str(data.get("content", "")), stop=stop,
        num_draft_tokens=count_of(t.get("draft_n"), "the engine's timings.draft_n"),
        num_accepted_tokens=count_of(t.get("draft_n_accepted"), "the engine's timings.draft_n_accepted"),
        predicted_n=count_of(t.get("predicted_n"), "the engine's timings.predicted_n"),
        predicted_ms=ms[0], prompt_ms=ms[1], wall_seconds=wall,
    )
