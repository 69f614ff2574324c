"""``vllm serve`` on 127.0.0.1 (started from the engine venv) and a client of any running vLLM server.

The client speaks vLLM's OpenAI-compatible API: ``POST /v1/completions`` with the prompt as token ids
(``prompt: [ids]``, so the engine decodes from exactly the tokens the core decodes from), ``return_token_ids``
for the generated ids, the sampling settings set explicitly (``temperature``, ``top_k``, ``top_p``, ``min_p`` 0,
``repetition_penalty`` 1, ``seed``); ``GET /metrics`` (the ``vllm:spec_decode_*`` counters), ``GET /version``,
``GET /v1/models`` (served model, ``max_model_len``) and, when the server runs with ``VLLM_SERVER_DEV_MODE=1``
(the servers started here do), ``GET /server_info?config_format=json`` (the whole ``vllm_config``: speculative
and compilation config, dtype, model runner). vLLM 0.32 returns no per-request speculative counters on
``/v1/completions``: the per-request figures are ``/metrics`` deltas around each request (sent one at a time).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from specdec import processes
from specdec.engines.client import EngineRequestError, safe_url
from specdec.engines.http import engine_root, join_url
from specdec.engines.vllm_install import installed_python, vllm_env
from specdec.engines.vllm_offline import VllmEngineArgs, VllmOutput

__all__ = ["VllmServer", "VllmClient", "VllmStartError"]


class VllmStartError(EngineRequestError):
    """``vllm serve`` exited or did not answer ``/health`` in time (one line; the log holds the rest)."""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmServer:
    """A ``vllm serve`` process on 127.0.0.1, as a context manager.

    Args:
        args: :class:`VllmEngineArgs` (the model, ``--speculative-config``, dtype, ...).
        log_path: the server's stdout/stderr.
        engines_dir: where the engines built here live (``CoreSettings.engines_dir``): the installed vLLM venv
            and its compile caches (:func:`~specdec.engines.vllm_install.vllm_env`).
        python: the python of a venv with vLLM (default: the installed engine's).
        port: default a free port.
        startup_timeout: seconds to wait for ``/health`` (a first start compiles: minutes).
        served_model_name: ``--served-model-name`` (the ``model_name`` label of its metrics).
        cwd: the server's working directory (relative model paths resolve against it).
    """

    def __init__(self, args: VllmEngineArgs, log_path: str | Path, *, engines_dir: Path, python: str | Path | None = None,
                 port: int | None = None, startup_timeout: float = 1200.0, served_model_name: str = "target",
                 cwd: str | Path | None = None) -> None:
        self.args, self.log_path, self.cwd, self.engines_dir = args, Path(log_path), cwd, Path(engines_dir)
        self.python = Path(python) if python else None
        self.port = port or _free_port()
        self.startup_timeout, self.served_model_name = startup_timeout, served_model_name
        self.proc: subprocess.Popen | None = None
        self.start_seconds = float("nan")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def command(self) -> list[str]:
        python = self.python or installed_python(self.engines_dir, VllmStartError)
        return [str(python), "-m", "vllm.entrypoints.cli.main", "serve", *self.args.serve_args(), "--host", "127.0.0.1",
                "--port", str(self.port), "--served-model-name", self.served_model_name]

    def start(self) -> "VllmServer":
        """Start the process and wait until ``/health`` answers 200."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        env = {**vllm_env(self.engines_dir), "VLLM_SERVER_DEV_MODE": "1"}
        t0 = time.monotonic()
        self.proc = processes.spawn(self.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, cwd=self.cwd)
        log.close()
        while time.monotonic() < t0 + self.startup_timeout:
            if self.proc.poll() is not None:
                raise VllmStartError(f"vllm serve exited {self.proc.returncode} at startup: {self._log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    self.start_seconds = time.monotonic() - t0
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        self.stop()
        raise VllmStartError(f"vllm serve did not answer /health within {self.startup_timeout:.0f} s: {self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            lines = [x for x in self.log_path.read_text(errors="replace").strip().splitlines() if x.strip()]
        except OSError:
            return "(no log)"
        err = [x for x in lines if "Error" in x or "error" in x]
        return " | ".join((err[-2:] or lines[-3:]))[-500:]

    def stop(self) -> None:
        """Stop the server's process group (its engine core is a child): :func:`specdec.processes.stop`, 20 s."""
        processes.stop(self.proc, grace_s=20)
        self.proc = None

    def __enter__(self) -> "VllmServer":
        return self if self.proc is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class VllmClient:
    """A client of one running vLLM server (``vllm serve``).

    Args:
        url: base URL, e.g. ``http://127.0.0.1:8000`` or the OpenAI base URL ``http://127.0.0.1:8000/v1``
            (:func:`~specdec.engines.http.engine_root`); each request's URL is joined to it as a URL.
        api_key: ``Authorization: Bearer`` (``vllm serve --api-key``).
        timeout_s: per-request timeout, seconds.
        model: the served model name requests name (default: the first of ``/v1/models``).
    Raises:
        EngineRequestError: ``url`` does not parse.
    """

    def __init__(self, url: str, *, api_key: str | None = None, timeout_s: float = 600.0,
                 model: str | None = None) -> None:
        try:
            self.url = engine_root(url)
        except ValueError as e:
            raise EngineRequestError(f"bad engine URL {safe_url(url)}: {e}") from None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(headers=headers, timeout=timeout_s)
        self._model = model

    def close(self) -> None:
        self._http.close()

    def _get(self, path: str, *, optional: bool = False) -> httpx.Response | None:
        try:
            resp = self._http.get(join_url(self.url, path))
            if optional and resp.status_code == 404:
                return None
            resp.raise_for_status()
        except httpx.HTTPError as e:
            raise EngineRequestError(f"GET {safe_url(join_url(self.url, path))} failed: {type(e).__name__}: "
                                     f"{getattr(e, 'response', None) and e.response.status_code or e}") from None
        return resp

    def metrics_text(self) -> str:
        return self._get("/metrics").text  # type: ignore[union-attr]

    def version(self) -> str:
        return str(self._get("/version").json().get("version", ""))  # type: ignore[union-attr]

    def models(self) -> list[dict[str, Any]]:
        return list(self._get("/v1/models").json().get("data", []))  # type: ignore[union-attr]

    def server_info(self) -> dict[str, Any] | None:
        """``/server_info?config_format=json`` (``VLLM_SERVER_DEV_MODE=1`` servers), else None."""
        resp = self._get("/server_info?config_format=json", optional=True)
        return None if resp is None else resp.json()

    def model_name(self) -> str:
        if self._model is None:
            models = self.models()
            if not models:
                raise EngineRequestError(f"{safe_url(join_url(self.url, '/v1/models'))} lists no model")
            self._model = str(models[0]["id"])
        return self._model

    def complete(self, prompt_ids: list[int], *, max_tokens: int, temperature: float, top_k: int = 0,
                 top_p: float = 1.0, seed: int | None = None) -> VllmOutput:
        """One completion of ``prompt_ids``: its :class:`VllmOutput` (``counters`` left empty: ``/metrics`` is
        the caller's; ``per_request`` is the answer's ``metrics.speculative_decoding`` where the server runs
        with ``--per-request-spec-decode-metrics``).

        Raises:
            EngineRequestError: the request failed or the answer has no ``token_ids``.
        """
        body: dict[str, Any] = {"model": self.model_name(), "prompt": list(map(int, prompt_ids)),
                                "max_tokens": int(max_tokens), "temperature": float(temperature),
                                "top_k": int(top_k) if top_k else -1, "top_p": float(top_p), "min_p": 0.0,
                                "repetition_penalty": 1.0, "return_token_ids": True, "stream": False}
        if seed is not None:
            body["seed"] = int(seed)
        t0 = time.perf_counter()
        try:
            resp = self._http.post(join_url(self.url, "/v1/completions"), json=body)
            resp.raise_for_status()
            data = resp.json()
            choice = data["choices"][0]
        except (httpx.HTTPError, ValueError, KeyError, IndexError) as e:
            detail = e.response.text[:200] if isinstance(e, httpx.HTTPStatusError) else str(e)
            raise EngineRequestError(f"POST {safe_url(join_url(self.url, '/v1/completions'))} failed: {type(e).__name__}: {detail}") from None
        if choice.get("token_ids") is None:
            raise EngineRequestError("the vLLM answer has no `token_ids` (a vLLM that honours return_token_ids, "
                                     "0.10.2 or later, is needed for the token-level comparison)")
        per_request = (data.get("metrics") or choice.get("metrics") or {}).get("speculative_decoding")
        return VllmOutput([int(t) for t in choice["token_ids"]], choice.get("finish_reason"), time.perf_counter() - t0,
                          {}, per_request)
