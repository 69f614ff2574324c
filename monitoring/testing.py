"""Test helpers (no mocks): a real HTTP webhook receiver on 127.0.0.1 and report builders.

``WebhookReceiver`` is a ``ThreadingHTTPServer`` in a thread that records every POST (path,
headers, JSON body) and answers with scripted statuses (e.g. ``[500, 500]`` then 200). The flows'
drift-scenario tests and the demo can use it as the local alert receiver.
"""

from __future__ import annotations

import json
import random
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterable

from specdec.validation.report import GroupMetrics, PromptResult, ValidationReport


@dataclass(frozen=True)
class Reply:
    """A scripted answer: ``status`` with extra ``headers`` (e.g. ``{"Retry-After": "1"}``), sent
    after ``delay_s`` seconds (a delay longer than the client's timeout is a receiver that hangs:
    the request arrived and was recorded, the answer never reaches the client in time)."""

    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()
    delay_s: float = 0.0


@dataclass
class ReceivedRequest:
    """One POST the receiver got, and the status it answered."""

    path: str
    headers: dict[str, str]
    body: Any
    status: int


class WebhookReceiver:
    """A real webhook endpoint on ``127.0.0.1`` (threaded), for tests and the demo.

    Args:
        statuses: statuses (ints or :class:`Reply`) to answer, in order, before falling back to
            ``default_status``.
        default_status: status once the script is exhausted (200).
        port: 0 for an ephemeral port, or a fixed one (e.g. to come back up where a run failed).
    Use as a context manager; ``url(path)`` gives the endpoint, ``requests`` what arrived,
    ``accepted`` the bodies answered 2xx.
    """

    def __init__(self, statuses: Iterable[int | Reply] = (), default_status: int | Reply = 200,
                 port: int = 0) -> None:
        self._script = list(statuses)
        self.default_status = default_status
        self.requests: list[ReceivedRequest] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw or b"null")
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                with receiver._lock:
                    reply = receiver._script.pop(0) if receiver._script else receiver.default_status
                    reply = reply if isinstance(reply, Reply) else Reply(int(reply))
                    status = reply.status
                    receiver.requests.append(ReceivedRequest(self.path, dict(self.headers), body, status))
                if reply.delay_s:
                    receiver._stop.wait(reply.delay_s)
                payload = b"ok" if status < 400 else b"error"
                self.send_response(status)
                for name, value in reply.headers:
                    self.send_header(name, value)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                try:
                    self.wfile.write(payload)
                except OSError:  # the client gave up (timeout) before the answer
                    pass

            def log_message(self, *args) -> None:  # keep test output (and URLs) quiet
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread: threading.Thread | None = None

    def url(self, path: str = "/hook") -> str:
        """The endpoint URL for ``path``."""
        return f"http://127.0.0.1:{self.port}{path}"

    def script(self, statuses: Iterable[int | Reply]) -> None:
        """Queue statuses to answer next."""
        with self._lock:
            self._script.extend(statuses)

    @property
    def accepted(self) -> list[ReceivedRequest]:
        """Requests answered with a 2xx status."""
        with self._lock:
            return [r for r in self.requests if 200 <= r.status < 300]

    def start(self) -> "WebhookReceiver":
        """Serve in a daemon thread."""
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release the port."""
        self._stop.set()  # release handlers that are hanging on purpose
        if self._thread is not None:
            self.server.shutdown()
            self._thread.join(5)
            self._thread = None
        self.server.server_close()

    def __enter__(self) -> "WebhookReceiver":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    r = WebhookReceiver()
    port = r.port
    r.server.server_close()
    return port


def _group(acc: float, ci_half: float, n_tokens: int, k: int, *, alpha_tf: float | None = None,
           tf_half: float = 0.02, alpha_hat: float | None = None, hat_half: float = 0.02,
           tokens_per_step: float | None = None, prompts: int = 0) -> GroupMetrics:
    tps = float(k) if tokens_per_step is None else tokens_per_step
    drafts = max(int(round(n_tokens / tps)) if tps > 0 else n_tokens, 1)
    accepted = int(round(acc * n_tokens))
    a_tf = acc if alpha_tf is None else alpha_tf
    a_hat = acc if alpha_hat is None else alpha_hat
    return GroupMetrics(
        num_prompts=prompts, num_speculative_tokens=k, num_drafts=drafts, num_draft_tokens=n_tokens,
        num_accepted_tokens=accepted, accepted_per_position=[accepted // max(k, 1)] * k,
        num_emitted_tokens=accepted + drafts, acceptance_rate=acc,
        acceptance_rate_ci=[max(acc - ci_half, 0.0), min(acc + ci_half, 1.0)],
        mean_accepted_length=1 + accepted / drafts, draft_tokens_per_step=n_tokens / drafts,
        alpha_hat=a_hat, alpha_hat_ci=[max(a_hat - hat_half, 0.0), min(a_hat + hat_half, 1.0)],
        num_tf_positions=n_tokens, alpha_tf=a_tf,
        alpha_tf_ci=[max(a_tf - tf_half, 0.0), min(a_tf + tf_half, 1.0)],
        top1_agreement=min(a_tf + 0.05, 1.0), total_variation=1 - a_tf, kl_divergence=0.1,
        speedup=1.0 + acc, predicted_speedup=1.0 + acc,
    )


def make_report(
    acceptance: float = 0.63, *, ci_half: float = 0.03, num_draft_tokens: int = 2000, k: int = 4,
    categories: dict[str, float] | None = None, category_tokens: int = 500,
    num_prompts: int = 40, prompt_spread: float = 0.05, seed: int = 0,
    heldout_name: str = "spec-bench-mini", heldout_version: str = "1", code_version: str = "0.1.0",
    **group_kw,
) -> ValidationReport:
    """A consistent :class:`ValidationReport` built from the dataclasses (no models).

    Args:
        acceptance: pooled acceptance rate; CI is ``acceptance +- ci_half``.
        num_draft_tokens: evidence size overall (drafted tokens). k: num_speculative_tokens.
        categories: name -> acceptance rate per category (``category_tokens`` tokens each).
        num_prompts / prompt_spread / seed: per-prompt rows drawn around their category's rate.
        group_kw: ``alpha_tf``, ``alpha_hat``, ``tf_half``, ``hat_half``, ``tokens_per_step``.
    """
    categories = categories if categories is not None else {"chat": acceptance}
    rng = random.Random(seed)
    names = sorted(categories)
    prompts = []
    for i in range(num_prompts):
        cat = names[i % len(names)]
        base = categories[cat]
        acc = min(max(base + rng.uniform(-prompt_spread, prompt_spread), 0.0), 1.0)
        ndt = max(num_draft_tokens // max(num_prompts, 1), 1)
        prompts.append(PromptResult(
            prompt_id=f"p{i:03d}", category=cat, prompt_tokens=20, new_tokens=64, num_drafts=ndt // k or 1,
            num_draft_tokens=ndt, num_accepted_tokens=int(acc * ndt), acceptance_rate=acc,
            num_tf_positions=64, alpha_tf=min(acc + 0.02, 1.0), top1_agreement=min(acc + 0.05, 1.0),
            total_variation=1 - acc, kl_divergence=0.1, target_only_seconds=1.0, speculative_seconds=0.8,
            exact_match=True,
        ))
    per_cat = max(num_prompts // max(len(names), 1), 1)
    return ValidationReport(
        heldout_name=heldout_name, heldout_version=heldout_version, target_ref="tiny/target",
        drafter_kind="derived:int8", drafter_ref=None,
        config={"num_speculative_tokens": k, "max_new_tokens": 64, "temperature": 0.0, "top_k": None,
                "top_p": None, "seed": 0, "limit": num_prompts},
        device="cpu", dtype="float32", code_version=code_version, created_at="2026-11-29T02:00:00+00:00",
        overall=_group(acceptance, ci_half, num_draft_tokens, k, prompts=num_prompts, **group_kw),
        categories={c: _group(a, ci_half * 2, category_tokens, k, prompts=per_cat) for c, a in categories.items()},
        prompts=prompts, wall_seconds=12.5,
    )


__all__ = ["WebhookReceiver", "ReceivedRequest", "Reply", "free_port", "make_report"]
