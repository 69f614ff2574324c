"""The llama.cpp engine profile: ``llama-server`` built here (:mod:`.llamacpp_build`), started with the
pair's flags (:mod:`.llama_server`), asked through its native ``/completion`` (:mod:`.client`).

Proposal rule (``common/speculative.cpp``, ``draft-simple``; :mod:`.llama_server` has the details):
greedy drafts of at most ``--spec-draft-n-max`` tokens (default 3), stopped before a token below
``--spec-draft-p-min``, dropped when shorter than ``--spec-draft-n-min``; a drafted stop token does not
end the block; the first token after the prompt comes from the prefill alone. llama-server does not
expose its speculative flags over HTTP: the served rule is read from the flags the deployment declares
(``specdec pair engine --flags``), and ``/slots`` says whether a slot can speculate at all.
Synthetic acceptance (``--spec-synth-len``, ``--spec-synth-rates``: "benchmarking only, generated
output is not valid") is refused.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from specdec.engines.answers import EngineCompletion, EngineCounters
from specdec.engines.client import EngineClient, safe_url
from specdec.engines.errors import EngineAnswerError, EngineRequestError
from specdec.engines.http import Deadline, join_url
from specdec.engines.metrics import LLAMACPP_METRICS
from specdec.engines.profile import (CompletionParams, EngineEndpoint, EngineLimits, EngineProfile, EngineSession,
                                     ProposalRule, Refusal)
from specdec.kinds import DERIVED, EAGLE3, LAYERSKIP, MODEL, NGRAM, DrafterKind, KindTable, ServingRequest

__all__ = ["LlamaCppProfile", "LlamaCppSession", "LLAMACPP_SERVING", "flag_value", "lora_files"]

#: llama-server's default ``--spec-draft-n-max`` (``common/common.h``)
DEFAULT_N_MAX = 3


def flag_value(flags: list[str] | tuple[str, ...], *names: str) -> str | None:
    """The value of the last of ``names`` in a command line (``--x v`` or ``--x=v``), None when absent."""
    found = None
    for i, a in enumerate(flags):
        key, eq, val = str(a).partition("=")
        if key in names:
            found = val if eq else (str(flags[i + 1]) if i + 1 < len(flags) else "")
    return found


def _llama_server(kind: DrafterKind, req: ServingRequest) -> dict[str, Any]:
    """``args`` / ``command`` of ``llama-server`` for a draft of GGUF files (the rule the core validated: fixed k,
    argmax drafts, no threshold), with ``--lora FILE`` for a target adapter (the draft stays unadapted).
    Raises ValueError: a target/draft/adapter reference that is not a ``.gguf`` file."""
    from specdec.engines.llama_server import LlamaServerFlags

    for what, ref in (("target", req.target), ("draft", req.draft)):
        if not ref or not str(ref).endswith(".gguf"):
            raise ValueError(f"llama.cpp serves GGUF files: the {what} reference is {ref!r}, not a .gguf file")
    lora = lora_files(req.target_adapter)
    args = LlamaServerFlags(model=str(req.target), draft=str(req.draft), n_max=req.k, lora=lora).args()
    return {"args": args, "command": shlex.join(["llama-server", *args])}


def lora_files(adapter: str | None) -> tuple[str, ...]:
    """``(adapter,)`` for a GGUF LoRA file, ``()`` for none. Raises ValueError: a PEFT directory (llama.cpp loads
    GGUF adapters only)."""
    if adapter is None:
        return ()
    if not str(adapter).endswith(".gguf"):
        raise ValueError(f"llama.cpp loads a LoRA adapter as GGUF: the target adapter is {adapter!r}; convert it with "
                         "llama.cpp's convert_lora_to_gguf.py --base <target checkpoint> --outfile <adapter>.gguf <adapter>")
    return (str(adapter),)


def _served_differently(kind: DrafterKind, req: ServingRequest) -> str:
    return (f"llama.cpp serves a {req.label} drafter differently from how the core validated it: register the draft as "
            "a GGUF model (a derived copy: `llama-quantize` the target GGUF, e.g. Q8_0 for int8, Q4_0 for int4) and "
            "validate that pair")


_REFUSED = Refusal(_served_differently)
#: llama-server's flags of each drafter kind: ``draft-simple`` serves a GGUF draft model as validated; its n-gram
#: types are lookups of its own, and it has no head or early-exit drafter
LLAMACPP_SERVING: KindTable = KindTable("the llama.cpp serving table", {
    NGRAM: _REFUSED, DERIVED: _REFUSED, EAGLE3: _REFUSED, LAYERSKIP: _REFUSED, MODEL: _llama_server})


class LlamaCppSession(EngineSession):
    """Asks one ``llama-server`` (:class:`~specdec.engines.client.EngineClient`)."""

    counters_source = "per-request timings"

    def __init__(self, endpoint: EngineEndpoint, limits: EngineLimits) -> None:
        if not endpoint.url:
            raise EngineRequestError("the llama.cpp engine check needs the server's URL")
        self.client = EngineClient(endpoint.url, api_key=endpoint.api_key, timeout_s=limits.request_timeout_s)

    def describe(self, deadline: Deadline | None = None) -> dict[str, Any]:
        """``/props`` (build, model file/type, context, slots, BOS/EOS), ``/v1/models`` (vocabulary) and
        ``/slots`` (whether the slots speculate; absent when the endpoint is off)."""
        props = self.client.props(deadline)
        out: dict[str, Any] = {"build_info": props.get("build_info"), "model_path": props.get("model_path"),
                               "model_ftype": props.get("model_ftype"),
                               "n_ctx": (props.get("default_generation_settings") or {}).get("n_ctx"),
                               "total_slots": props.get("total_slots"), "bos_token": props.get("bos_token"),
                               "eos_token": props.get("eos_token")}
        out["vocab_size"] = self._vocab(deadline)
        out["speculative"] = self._speculates(deadline)
        return out

    def _vocab(self, deadline: Deadline | None) -> int | None:
        try:
            data = (self.client.models(deadline).get("data") or [{}])[0]
        except (EngineRequestError, IndexError, AttributeError):
            return None
        n = (data.get("meta") or {}).get("n_vocab") if isinstance(data, dict) else None
        return n if isinstance(n, int) and not isinstance(n, bool) else None

    def _speculates(self, deadline: Deadline | None) -> bool | None:
        try:
            text = self.client.request("GET", "/slots", deadline=deadline)
            import json

            slots = json.loads(text)
        except (EngineRequestError, ValueError):
            return None
        flags = [s.get("speculative") for s in slots if isinstance(s, dict)] if isinstance(slots, list) else []
        return any(flags) if flags and all(isinstance(f, bool) for f in flags) else None

    def complete(self, prompt_ids: list[int], params: CompletionParams, deadline: Deadline) -> EngineCompletion:
        return self.client.complete(prompt_ids, max_tokens=params.max_tokens, sampling=params.sampling,
                                    seed=params.seed, deadline=deadline)

    def counters(self, deadline: Deadline) -> EngineCounters | None:
        from specdec.engines.metrics import counters_of

        try:
            return counters_of(self.client.metrics_text(deadline), LLAMACPP_METRICS)
        except ValueError as e:
            raise EngineAnswerError(f"GET {safe_url(join_url(self.client.url, '/metrics'))}: malformed exposition: {e}") from None

    def close(self) -> None:
        self.client.close()


class LlamaCppProfile(EngineProfile):
    """llama.cpp's ``llama-server`` (module docstring)."""

    name = "llamacpp"
    title = "llama.cpp"
    aliases = ("llama.cpp", "llama-server")
    draft_sampling = "argmax"
    metrics = LLAMACPP_METRICS
    checkable = True
    serving_table = LLAMACPP_SERVING
    serves_target_adapter = True
    synthetic_flags = ("--spec-synth-len", "--spec-synth-rates", "--spec-synthetic-acceptance-length",
                       "--spec-synthetic-acceptance-rates")
    fingerprint_fields = ("draft_sha256", "model_sha256", "flags", "build_info", "model_ftype", "model_path",
                          "n_ctx", "total_slots")

    def validated_rule(self, num_speculative_tokens: int, *, draft_sampling: str | None = None,
                       ngram: tuple[int, int] | None = None) -> ProposalRule:
        return ProposalRule(num_speculative_tokens=int(num_speculative_tokens), draft_sampling=draft_sampling or "argmax",
                            ngram=ngram, first_token_from_prefill=True, drafts_past_stop=True)

    def served_rule(self, fingerprint: dict[str, Any], validated: ProposalRule) -> ProposalRule | None:
        """The rule the declared flags give (llama.cpp's defaults for flags not given); ``/slots`` saying no
        slot speculates means drafting is off. None when neither is known."""
        flags = [str(f) for f in fingerprint.get("flags") or []]
        if not flags:
            return ProposalRule(0, drafts_past_stop=True) if fingerprint.get("speculative") is False else None
        spec_type = flag_value(flags, "--spec-type")
        draft = flag_value(flags, "--spec-draft-model", "-md", "--model-draft")
        off = (spec_type or ("draft-simple" if draft else "none")) == "none" or fingerprint.get("speculative") is False
        try:
            k = int(flag_value(flags, "--spec-draft-n-max") or DEFAULT_N_MAX)
            n_min = int(flag_value(flags, "--spec-draft-n-min") or 0)
            p_min = float(flag_value(flags, "--spec-draft-p-min", "--draft-p-min") or 0.0)
        except ValueError:
            return None
        sampling = "sampled" if flag_value(flags, "--spec-draft-sampling") == "probabilistic" else "argmax"
        synth = next((f"{f} {flag_value(flags, f)}" for f in self.synthetic_flags if flag_value(flags, f) is not None), None)
        return ProposalRule(num_speculative_tokens=0 if off else k, draft_sampling=sampling, min_draft_tokens=n_min,
                            p_min=p_min, drafts_past_stop=True, synthetic=synth)

    def start(self, config: dict[str, Any], log_path: Path, settings: Any) -> Any:
        """A :class:`~specdec.engines.llama_server.LlamaServer` (not started: use it as a context manager) running
        ``config["args"]`` with the llama-server built under ``settings.engines_dir``
        (:func:`~specdec.engines.llamacpp_build.ensure_llama_cpp`)."""
        from specdec.engines.llama_server import LlamaServer
        from specdec.engines.llamacpp_build import ensure_llama_cpp

        return LlamaServer(ensure_llama_cpp(settings).server, tuple(config["args"]), log_path)

    def connect(self, endpoint: EngineEndpoint, limits: EngineLimits) -> LlamaCppSession:
        return LlamaCppSession(endpoint, limits)

    def fingerprint(self, session: EngineSession, endpoint: EngineEndpoint,
                    deadline: Deadline | None = None) -> dict[str, Any]:
        """The base fingerprint plus ``draft_path`` from the declared flags and the sha256 of the target and
        draft files where they are readable here (llama-server does not expose its draft file over HTTP)."""
        from specdec.models.hashes import file_sha256

        out = super().fingerprint(session, endpoint, deadline)
        draft = flag_value(list(endpoint.flags or ()), "--spec-draft-model", "-md", "--model-draft")
        if draft:
            out["draft_path"] = draft
        for key, path in (("model_sha256", out.get("model_path")), ("draft_sha256", draft)):
            if path and Path(path).is_file():
                out[key] = file_sha256(path)
        return out
