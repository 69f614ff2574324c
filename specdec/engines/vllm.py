"""The vLLM engine profile: a running ``vllm serve`` (a URL) or, offline, ``vllm.LLM`` started by the product in
the engine's own venv (:mod:`.vllm_offline`, installed by :mod:`.vllm_install`).

Proposal rule (vLLM 0.32, ``vllm/v1/spec_decode``): a fixed ``num_speculative_tokens`` k per step, the first
output token from the prefill alone; ``draft_model`` drafts the argmax (``draft_sample_method="greedy"``, the
default and what the product sets) or samples from q (``"probabilistic"``); ``ngram`` proposes the tokens after
the *earliest* occurrence of the longest suffix match of ``prompt_lookup_max`` .. ``prompt_lookup_min`` tokens,
k of them or as many as follow. At the end of an output vLLM still drafts a full k (its scheduler does not trim
drafts to ``max_tokens``) and counts what the target accepts there before the output is cut at the budget or a stop
token: up to about one draft per request more than the core's replay inside the output, accepted at the same rate
(measured: the rate difference CI contains 0). Counters: vLLM's per-request ``spec_decode_metrics`` where the build has them
(``--per-request-spec-decode-metrics``, 0.32: the answer's ``metrics.speculative_decoding``; offline the
``RequestOutput``), else ``/metrics`` deltas around each request (``get_metrics()`` deltas offline), sent one at
a time; the report's ``counters_source`` says which. ``rejection_sample_method="synthetic"`` (acceptance typed in)
is refused.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from specdec.engines.answers import EngineCompletion, EngineCounters, count_of, token_ids_of
from specdec.engines.client import safe_url
from specdec.engines.errors import EngineAnswerError, EngineDeadlineError, EngineRequestError
from specdec.engines.http import Deadline, join_url
from specdec.engines.metrics import VLLM_METRICS
from specdec.engines.profile import (CompletionParams, EngineEndpoint, EngineLimits, EngineProfile, EngineSession,
                                     ProposalRule, Refusal, draft_of, no_early_exit)
from specdec.kinds import DERIVED, EAGLE3, LAYERSKIP, MODEL, NGRAM, DrafterKind, KindTable, ServingRequest

__all__ = ["VllmProfile", "VllmServeSession", "VllmOfflineSession", "DRAFT_SAMPLE_METHOD", "VLLM_SERVING",
           "per_position_of"]

#: the product's proposal rule names -> vLLM's ``draft_sample_method``
DRAFT_SAMPLE_METHOD = {"argmax": "greedy", "sampled": "probabilistic"}
PER_REQUEST = "per-request metrics (vLLM spec_decode_metrics)"
METRICS_DELTAS = "/metrics deltas around each request (one at a time, no other traffic)"
GET_METRICS_DELTAS = "LLM.get_metrics() deltas around each request"


def _spec_args(spec: dict[str, Any]) -> dict[str, Any]:
    """``{"speculative_config": spec, "args": ["--speculative-config", <compact json>]}``."""
    return {"speculative_config": spec, "args": ["--speculative-config", json.dumps(spec, separators=(",", ":"))]}


def _draft_model(kind: DrafterKind, req: ServingRequest) -> dict[str, Any]:
    """A drafter with a model vLLM loads: ``method`` the kind's ``vllm_method``, ``model`` the draft, k.
    Raises ValueError: no draft reference."""
    return _spec_args({"method": kind.vllm_method, "model": draft_of(req), "num_speculative_tokens": req.k})


def _ngram(kind: DrafterKind, req: ServingRequest) -> dict[str, Any]:
    """vLLM's n-gram lookup with the validated sizes (``prompt_lookup_max``/``min``). Raises DrafterSpecError: bad recipe."""
    max_n, min_n = kind.sizes_of(req.recipe)
    return _spec_args({"method": kind.vllm_method, "num_speculative_tokens": req.k,
                       "prompt_lookup_max": max_n, "prompt_lookup_min": min_n})


#: vLLM's ``--speculative-config`` of each drafter kind (draft_sample_method is added by the profile)
VLLM_SERVING: KindTable = KindTable("the vLLM serving table", {
    NGRAM: _ngram, DERIVED: _draft_model, EAGLE3: _draft_model, LAYERSKIP: Refusal(no_early_exit),
    MODEL: _draft_model})


def per_position_of(histogram: list[int]) -> list[int]:
    """Accepted tokens per draft position from vLLM's per-request ``acceptance_histogram`` (``hist[j]``: steps
    that accepted ``j`` drafts): position ``i`` is accepted in every step with ``j > i``."""
    return [sum(histogram[i + 1:]) for i in range(max(len(histogram) - 1, 0))]


def _completion(out: Any, counters: EngineCounters | None, what: str) -> EngineCompletion:
    """An :class:`EngineCompletion` from a :class:`~specdec.engines.vllm_offline.VllmOutput` and this request's
    counters (its per-request record first, else ``counters``)."""
    ids = token_ids_of(out.token_ids, f"{what}: token_ids")
    pr = out.per_request
    if pr:
        hist = [count_of(x, f"{what}: acceptance_histogram") for x in pr.get("acceptance_histogram") or []]
        drafts, pp = sum(hist), per_position_of(hist)
        drafted, accepted = count_of(pr.get("num_draft_tokens"), f"{what}: num_draft_tokens"), sum(pp)
    elif counters is not None:
        drafts, drafted, accepted, pp = counters.drafts, counters.draft_tokens, counters.accepted, counters.per_position
    else:
        drafts, drafted, accepted, pp = None, 0, 0, None
    stop = {"stop": "eos", "length": "limit"}.get(str(out.finish_reason), str(out.finish_reason or ""))
    ms = float(out.seconds) * 1e3
    return EngineCompletion(token_ids=ids, stop=stop, num_draft_tokens=drafted, num_accepted_tokens=accepted,
                            num_drafts=drafts, accepted_per_position=list(pp) if pp is not None else None,
                            predicted_n=len(ids), predicted_ms=ms, wall_seconds=float(out.seconds))


def _check_deadline(deadline: Deadline) -> float:
    left = deadline.remaining()
    if left <= 0:
        raise EngineDeadlineError(deadline.message())
    return left


class VllmServeSession(EngineSession):
    """Asks one running ``vllm serve`` (:class:`~specdec.engines.vllm_server.VllmClient`)."""

    counters_source = PER_REQUEST

    def __init__(self, endpoint: EngineEndpoint, limits: EngineLimits) -> None:
        from specdec.engines.vllm_server import VllmClient

        if not endpoint.url:
            raise EngineRequestError("a vLLM server check needs the server's URL")
        self.client = VllmClient(endpoint.url, api_key=endpoint.api_key, timeout_s=limits.request_timeout_s,
                                 model=endpoint.served_model)
        self._lock = threading.Lock()

    def describe(self, deadline: Deadline | None = None) -> dict[str, Any]:
        """``/version``, ``/v1/models`` (served model, its path, ``max_model_len``) and, from a
        ``VLLM_SERVER_DEV_MODE=1`` server, ``/server_info`` (speculative/compilation config, dtype, runner)."""
        models = self.client.models()
        m = models[0] if models else {}
        out: dict[str, Any] = {"vllm_version": self.client.version(), "served_model": m.get("id"),
                               "model_path": m.get("root"), "max_model_len": m.get("max_model_len")}
        info = self.client.server_info()
        if info and isinstance(info.get("vllm_config"), dict):
            out.update(_config_fingerprint(info["vllm_config"]))
        else:
            out["config_note"] = ("the server does not expose its config (/server_info needs VLLM_SERVER_DEV_MODE=1): "
                                  "declare its flags to record the speculative config")
        return out

    def complete(self, prompt_ids: list[int], params: CompletionParams, deadline: Deadline) -> EngineCompletion:
        _check_deadline(deadline)
        s = params.sampling
        with self._lock:  # one request at a time: a /metrics delta is this request's alone
            before = self.counters(deadline)
            out = self.client.complete(prompt_ids, max_tokens=params.max_tokens, temperature=s.temperature,
                                       top_k=s.top_k or 0, top_p=s.top_p or 1.0, seed=params.seed)
            delta = None if out.per_request else self.counters(deadline).minus(before)  # type: ignore[union-attr]
        if not out.per_request:
            self.counters_source = METRICS_DELTAS
        return _completion(out, delta, "the vLLM answer")

    def counters(self, deadline: Deadline) -> EngineCounters | None:
        from specdec.engines.metrics import counters_of

        try:
            return counters_of(self.client.metrics_text(), VLLM_METRICS)
        except ValueError as e:
            raise EngineAnswerError(f"GET {safe_url(join_url(self.client.url, '/metrics'))}: malformed exposition: {e}") from None

    def close(self) -> None:
        self.client.close()


class VllmOfflineSession(EngineSession):
    """Runs ``vllm.LLM`` in a worker process (:class:`~specdec.engines.vllm_offline.VllmOffline`) for one check.

    ``endpoint.options``: ``model`` (the target checkpoint the engine loads), ``speculative_config`` (JSON; its
    ``draft_sample_method`` is set from the validated rule when absent), optional ``python`` (a venv with vLLM),
    ``dtype`` (default float32), ``enforce_eager`` (``1``), ``max_model_len``, ``kv_cache_memory_bytes``, ``log``
    (the worker's log file), ``engines_dir`` (the installed vLLM venv and its compile caches: the entry point's
    ``CoreSettings.engines_dir``; required).
    """

    counters_source = PER_REQUEST

    def __init__(self, endpoint: EngineEndpoint, limits: EngineLimits, draft_sampling: str) -> None:
        from specdec.engines.vllm_offline import VllmEngineArgs, VllmOffline

        opts = dict(endpoint.options)
        if not opts.get("model"):
            raise EngineRequestError("an offline vLLM check needs the target checkpoint (option model)")
        if not opts.get("engines_dir"):
            raise EngineRequestError("an offline vLLM check needs the engines directory (option engines_dir)")
        spec = json.loads(opts["speculative_config"]) if opts.get("speculative_config") else None
        if spec is not None and spec.get("model"):  # a draft model or head (the n-gram lookup has none)
            spec.setdefault("draft_sample_method", DRAFT_SAMPLE_METHOD[draft_sampling])
        args = VllmEngineArgs(model=opts["model"], speculative_config=spec, dtype=opts.get("dtype", "float32"),
                              max_model_len=int(opts.get("max_model_len", 2048)),
                              enforce_eager=opts.get("enforce_eager", "0") == "1",
                              kv_cache_memory_bytes=int(opts.get("kv_cache_memory_bytes", 1 << 30)))
        log = Path(opts.get("log") or Path(opts["model"]).parent / "vllm-worker.log")
        self.worker = VllmOffline(args, log, engines_dir=Path(opts["engines_dir"]), python=opts.get("python"),
                                  startup_timeout=limits.check_timeout_s)
        self.worker.start()

    def describe(self, deadline: Deadline | None = None) -> dict[str, Any]:
        fp = dict(self.worker.fingerprint)
        fp.pop("requested", None)
        fp["model_path"] = self.worker.args.model
        return fp

    def complete(self, prompt_ids: list[int], params: CompletionParams, deadline: Deadline) -> EngineCompletion:
        return self.complete_all([prompt_ids], params, concurrency=1, deadline=deadline)[0]

    def complete_all(self, prompts: list[list[int]], params: CompletionParams, *, concurrency: int,
                     deadline: Deadline, progress: Any = None, accept: Any = None) -> list[EngineCompletion]:
        """The prompts to the worker as one batch (each run alone inside it, so each has its own counters);
        ``accept(i, answer)`` checks each answer in prompt order (it raises on a bad one)."""
        s = params.sampling
        outs = self.worker.generate(prompts, max_tokens=params.max_tokens, temperature=s.temperature,
                                    top_k=s.top_k or 0, top_p=s.top_p or 1.0, seed=params.seed,
                                    timeout_s=_check_deadline(deadline))
        answers = []
        for i, o in enumerate(outs):
            c = o.counters
            counters = EngineCounters(drafts=c.get("drafts"), draft_tokens=c.get("draft_tokens", 0),
                                      accepted=c.get("accepted", 0), per_position=c.get("per_position"))
            if not o.per_request:
                self.counters_source = GET_METRICS_DELTAS
            c = _completion(o, counters, f"the vLLM answer to prompt {i}")
            answers.append(accept(i, c) if accept is not None else c)
            if progress is not None:
                progress(i + 1, len(prompts))
        return answers

    def close(self) -> None:
        self.worker.stop()


def _config_fingerprint(cfg: dict[str, Any]) -> dict[str, Any]:
    """The fingerprint fields from a ``vllm_config`` (``/server_info`` JSON)."""
    spec = cfg.get("speculative_config") or None
    keys = ("method", "model", "num_speculative_tokens", "draft_sample_method", "rejection_sample_method",
            "prompt_lookup_max", "prompt_lookup_min", "quantization")
    comp = cfg.get("compilation_config") or {}
    model = cfg.get("model_config") or {}
    return {"speculative_config": {k: spec.get(k) for k in keys} if isinstance(spec, dict) else None,
            "compilation_config": {"mode": comp.get("mode"), "backend": comp.get("backend"),
                                   "enforce_eager": model.get("enforce_eager")},
            "dtype": str(model.get("dtype", "")).removeprefix("torch.") or None,
            "model_runner": "v2" if cfg.get("use_v2_model_runner") else "v1"}


def _checkpoint_identity(path: Path, side: str) -> dict[str, str]:
    """``{<side>_weights_sha256, <side>_sha256}`` of a checkpoint directory (its ``source.json``'s GGUF hash when
    it was converted from one)."""
    from specdec.models.hashes import weights_sha256

    weights = weights_sha256(path)
    try:
        source = json.loads((path / "source.json").read_text())
    except (OSError, ValueError):
        source = {}
    return {f"{side}_weights_sha256": weights, f"{side}_sha256": str(source.get("gguf_sha256") or weights)}


class VllmProfile(EngineProfile):
    """vLLM (module docstring): ``vllm serve`` at a URL, or ``LLM`` offline in the engine venv."""

    name = "vllm"
    title = "vLLM"
    draft_sampling = "argmax"
    metrics = VLLM_METRICS
    checkable = True
    offline = True
    serves_lookup = True
    serving_table = VLLM_SERVING
    fingerprint_fields = ("speculative_config", "vllm_version", "model_runner", "draft_sha256", "model_sha256",
                          "draft_weights_sha256", "model_weights_sha256", "compilation_config", "dtype", "draft_path",
                          "model_path")

    def validated_rule(self, num_speculative_tokens: int, *, draft_sampling: str | None = None,
                       ngram: tuple[int, int] | None = None) -> ProposalRule:
        return ProposalRule(num_speculative_tokens=int(num_speculative_tokens),
                            draft_sampling=draft_sampling or self.draft_sampling, ngram=ngram,
                            first_token_from_prefill=True, drafts_past_stop=False)

    def served_rule(self, fingerprint: dict[str, Any], validated: ProposalRule) -> ProposalRule | None:
        """The rule the engine's ``speculative_config`` declares (None where the server does not expose it)."""
        if "speculative_config" not in fingerprint:
            return None
        spec = fingerprint.get("speculative_config")
        if not spec:
            return ProposalRule(0)
        ngram = None
        if spec.get("prompt_lookup_max"):  # the n-gram lookup's sizes (0 / absent for a draft model)
            ngram = (int(spec["prompt_lookup_max"]), int(spec.get("prompt_lookup_min") or spec["prompt_lookup_max"]))
        synth = "rejection_sample_method=synthetic" if spec.get("rejection_sample_method") == "synthetic" else None
        return ProposalRule(num_speculative_tokens=int(spec.get("num_speculative_tokens") or 0),
                            draft_sampling="sampled" if spec.get("draft_sample_method") == "probabilistic" else "argmax",
                            ngram=ngram, first_token_from_prefill=True, synthetic=synth)

    def serving_config(self, kind: DrafterKind, req: ServingRequest) -> dict[str, Any]:
        """The kind's ``--speculative-config`` (:data:`VLLM_SERVING`) plus ``draft_sample_method`` set explicitly for
        a draft model (the validated argmax rule: ``greedy``; a config that leaves it out changes meaning when vLLM's
        default does). Raises ValueError: as the table's entry does."""
        out = super().serving_config(kind, req)
        spec = out.get("speculative_config")
        if spec is not None and not kind.model_free:
            spec = {**spec, "draft_sample_method": DRAFT_SAMPLE_METHOD[self.draft_sampling]}
            out = {**out, "speculative_config": spec,
                   "args": ["--speculative-config", json.dumps(spec, separators=(",", ":"))]}
        return out

    def start(self, config: dict[str, Any], log_path: Path, settings: Any) -> Any:
        """A :class:`~specdec.engines.vllm_server.VllmServer` (use it as a context manager) running ``vllm serve``
        with ``config["target"]`` and ``config["speculative_config"]`` in the installed engine venv."""
        from specdec.engines.vllm_offline import VllmEngineArgs
        from specdec.engines.vllm_server import VllmServer

        args = VllmEngineArgs(model=str(config["target"]), speculative_config=config.get("speculative_config"),
                              dtype=config.get("dtype", "float32"), enforce_eager=bool(config.get("enforce_eager")),
                              max_model_len=int(config.get("max_model_len", 2048)))
        return VllmServer(args, log_path, engines_dir=settings.engines_dir)

    def connect(self, endpoint: EngineEndpoint, limits: EngineLimits) -> EngineSession:
        if endpoint.url:
            return VllmServeSession(endpoint, limits)
        return VllmOfflineSession(endpoint, limits, self.draft_sampling)

    def fingerprint(self, session: EngineSession, endpoint: EngineEndpoint,
                    deadline: Deadline | None = None) -> dict[str, Any]:
        """The base fingerprint, ``draft_path`` from the speculative config, and, where the checkpoints are readable
        here, ``<side>_weights_sha256`` (their safetensors weights) and ``<side>_sha256`` (what the pair's identity
        names: a checkpoint converted from a GGUF file is that file's sha256, its lineage; else the weights')."""
        from specdec.models.hashes import file_sha256

        out = super().fingerprint(session, endpoint, deadline)
        spec = out.get("speculative_config") or {}
        if spec.get("model") and not spec.get("prompt_lookup_max"):  # vLLM names the n-gram lookup's model "ngram"
            out["draft_path"] = spec["model"]
        for side, path in (("model", out.get("model_path")), ("draft", out.get("draft_path"))):
            p = Path(str(path)) if path else None
            if p is not None and p.is_dir() and any(p.glob("*.safetensors")):
                out.update(_checkpoint_identity(p, side))
            elif p is not None and p.is_file():
                out[f"{side}_sha256"] = file_sha256(p)
        return out

    def refusal(self, fingerprint: dict[str, Any]) -> str | None:
        spec = fingerprint.get("speculative_config") or {}
        if spec.get("rejection_sample_method") == "synthetic":
            return ("the engine runs with rejection_sample_method=synthetic (synthetic acceptance, benchmarking only): "
                    "its acceptance is a number someone typed in, not the pair's; restart it without it")
        return super().refusal(fingerprint)

    def replay_drafter(self, draft: Any) -> Any:
        """vLLM's n-gram lookup continues the earliest occurrence of the longest match and proposes k tokens after
        any match: the core's n-gram drafter with those settings; a draft model as it is."""
        from specdec.core.drafters import NgramDrafter

        if isinstance(draft, NgramDrafter):
            return NgramDrafter(draft.max_ngram, draft.min_ngram, match_tokens=(), first_occurrence=True)
        return draft
