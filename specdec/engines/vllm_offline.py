"""vLLM offline: the product starts ``vllm.LLM`` in the engine's own venv as a worker process and talks JSON
lines to it (:mod:`specdec.engines.vllm_worker` holds the protocol): token ids in, output token ids and the
integer ``LLM.get_metrics()`` deltas of each request out.

The worker runs with vLLM's compile caches under the engines directory (:func:`specdec.engines.vllm_install.vllm_env`),
so the first start of a model and config pays torch.compile (about 200 s on 2 cores) and later ones do not;
``enforce_eager`` skips compilation altogether (the CUDA-graph/compile settings change speed, not tokens).
"""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specdec import processes
from specdec.engines.errors import EngineRequestError
from specdec.engines.vllm_install import installed_python, vllm_env

__all__ = ["VllmEngineArgs", "VllmOutput", "VllmOffline", "VllmWorkerError", "WORKER_SCRIPT"]

WORKER_SCRIPT = Path(__file__).with_name("vllm_worker.py")


class VllmWorkerError(EngineRequestError):
    """The vLLM worker could not start or answer; the message is one line (the log file holds the rest)."""


@dataclass(frozen=True)
class VllmEngineArgs:
    """What ``vllm.LLM`` is built with (``vllm serve`` flags of the same names).

    Attributes:
        model: the target checkpoint directory (HF format) or Hub id.
        speculative_config: vLLM's ``speculative_config`` dict (None: no speculation); the caller sets
            ``draft_sample_method`` for a draft model.
        dtype: ``float32``, ``bfloat16`` or ``auto``.
        seed: the engine seed.
        max_model_len: context length (tokens).
        enforce_eager: no torch.compile / CUDA graphs (faster start, same tokens).
        max_num_seqs: at most this many requests in a batch.
        kv_cache_memory_bytes: the KV cache (CPU: bytes of host memory; vLLM's default reserves 92% of the
            machine's memory and refuses to start when that much is not free).
        tokenizer: the tokenizer, when not the model's.
    """

    model: str
    speculative_config: dict[str, Any] | None = None
    dtype: str = "float32"
    seed: int = 0
    max_model_len: int = 2048
    enforce_eager: bool = False
    max_num_seqs: int = 4
    kv_cache_memory_bytes: int = 1 << 30
    tokenizer: str | None = None

    def serve_args(self) -> list[str]:
        """The same engine as ``vllm serve MODEL <args>`` (no host/port)."""
        out = [self.model, "--dtype", self.dtype, "--seed", str(self.seed), "--max-model-len", str(self.max_model_len),
               "--max-num-seqs", str(self.max_num_seqs), "--kv-cache-memory-bytes", str(self.kv_cache_memory_bytes)]
        if self.enforce_eager:
            out.append("--enforce-eager")
        if self.speculative_config is not None:
            out += ["--speculative-config", json.dumps(self.speculative_config, separators=(",", ":")),
                    "--per-request-spec-decode-metrics", "detailed"]
        return out


@dataclass
class VllmOutput:
    """One request's answer: ``token_ids`` (the stop token included when it stopped on one), ``finish_reason``
    (``stop`` | ``length``), ``seconds`` (wall time of the request in the worker), ``counters``
    (``{"drafts", "draft_tokens", "accepted", "per_position"}``: this request's ``get_metrics()`` deltas) and
    ``per_request`` (vLLM's per-request ``spec_decode_metrics``, detailed; None where the build has none)."""

    token_ids: list[int]
    finish_reason: str | None
    seconds: float
    counters: dict[str, Any] = field(default_factory=dict)
    per_request: dict[str, Any] | None = None


class VllmOffline:
    """A running offline vLLM worker (a context manager).

    Args:
        args: :class:`VllmEngineArgs`.
        log_path: the worker's stderr (vLLM's logs, tracebacks).
        engines_dir: where the engines built here live (``CoreSettings.engines_dir``): the installed vLLM venv and
            its compile caches (:func:`~specdec.engines.vllm_install.vllm_env`).
        python: the python of a venv with vLLM (default: the one :mod:`specdec.engines.vllm_install` installed).
        startup_timeout: seconds to wait for the engine to be ready (first start compiles: minutes).
    Raises:
        VllmWorkerError: (on ``start``) no vLLM installed, the worker exited, or it was not ready in time.
    """

    def __init__(self, args: VllmEngineArgs, log_path: str | Path, *, engines_dir: Path,
                 python: str | Path | None = None, startup_timeout: float = 1200.0) -> None:
        self.args, self.log_path, self.startup_timeout = args, Path(log_path), startup_timeout
        self.engines_dir = Path(engines_dir)
        self.python = Path(python) if python else None
        self.proc: subprocess.Popen | None = None
        self.fingerprint: dict[str, Any] = {}
        self.start_seconds = float("nan")
        self._lines: queue.Queue[str | None] = queue.Queue()

    def start(self) -> "VllmOffline":
        python = self.python or installed_python(self.engines_dir, VllmWorkerError)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        self.proc = processes.spawn([str(python), str(WORKER_SCRIPT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=log, text=True, env=vllm_env(self.engines_dir), bufsize=1)
        log.close()
        threading.Thread(target=self._pump, daemon=True).start()
        self._send({k: v for k, v in asdict(self.args).items()})
        ready = self._receive(self.startup_timeout)
        if not ready.get("ready"):
            self.stop()
            raise VllmWorkerError(f"{ready.get('error', 'the vLLM worker did not start')} (log: {self.log_path})")
        self.fingerprint, self.start_seconds = ready["fingerprint"], float(ready["start_seconds"])
        return self

    def generate(self, prompts: list[list[int]], *, max_tokens: int, temperature: float, top_k: int = 0,
                 top_p: float = 1.0, seed: int | None = None, timeout_s: float = 3600.0) -> list[VllmOutput]:
        """Each prompt (token ids) alone through the engine; one :class:`VllmOutput` per prompt, in order.

        Raises:
            VllmWorkerError: the worker failed or died.
        """
        self._send({"op": "generate", "prompts": [list(map(int, p)) for p in prompts], "max_tokens": int(max_tokens),
                    "sampling": {"temperature": float(temperature), "top_k": int(top_k), "top_p": float(top_p),
                                 "seed": seed}})
        got = self._receive(timeout_s)
        if "outputs" not in got:
            raise VllmWorkerError(f"vLLM worker: {got.get('error', 'no outputs')} (log: {self.log_path})")
        return [VllmOutput(o["token_ids"], o["finish_reason"], float(o["seconds"]), o["counters"], o.get("per_request"))
                for o in got["outputs"]]

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _send(self, obj: dict[str, Any]) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(obj) + "\n")
            self.proc.stdin.flush()
        except OSError:
            raise VllmWorkerError(f"the vLLM worker has exited ({self.proc.poll()}); log: {self.log_path}") from None

    def _receive(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self._lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise VllmWorkerError(f"the vLLM worker did not answer within {timeout_s:.0f} s (log: {self.log_path})") from None
            if line is None:
                raise VllmWorkerError(f"the vLLM worker exited ({self.proc and self.proc.wait()}): {_tail(self.log_path)}")
            if line.strip():
                return json.loads(line)

    def stop(self) -> None:
        """Ask the worker to quit (30 s), then stop its process group (:func:`specdec.processes.stop`, 15 s)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self._send({"op": "quit"})
                self.proc.stdin.close()  # type: ignore[union-attr]
                self.proc.wait(30)
            except (VllmWorkerError, OSError, subprocess.TimeoutExpired):
                pass
        processes.stop(self.proc, grace_s=15)
        self.proc = None

    def __enter__(self) -> "VllmOffline":
        return self if self.proc is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _tail(path: Path) -> str:
    try:
        lines = [x for x in path.read_text(errors="replace").strip().splitlines() if x.strip()]
    except OSError:
        return "(no log)"
    return " | ".join(lines[-3:])[-400:]
