"""The engine-profile interface: everything the product knows about one serving engine, in one class.

An :class:`EngineProfile` says, for one engine (llama.cpp, vLLM, SGLang, transformers):

* **its proposal rule** (:class:`ProposalRule`): what it drafts per step, so the core replays exactly
  that rule on the engine's own output tokens (k, the proposal sampling, llama.cpp's ``p_min`` /
  ``n_min``, the n-gram sizes, the bookkeeping of the first token and of drafts past a stop token);
* **its serving config** for a validated pair (:meth:`EngineProfile.serving_config`: vLLM's
  ``--speculative-config``, llama.cpp's flags, SGLang's arguments, transformers' ``generate`` keywords),
  from its **serving table** (:attr:`EngineProfile.serving_table`): a module-level
  :class:`~specdec.kinds.KindTable` mapping every drafter kind to the function that builds its settings on
  this engine, or to a :class:`Refusal` for a kind the engine cannot serve as the core validated it;
* **how to start it here** (:meth:`EngineProfile.start`, optional: llama.cpp starts ``llama-server``);
* **how to ask it** (:meth:`EngineProfile.connect` returns an :class:`EngineSession`: prompts as token ids
  in, output token ids and per-request counters out, each request within an overall deadline);
* **how to read its counters** (:attr:`EngineProfile.metrics`, the ``/metrics`` names by role;
  :meth:`EngineSession.counters`, the cumulative server-wide counters);
* **its fingerprint** (:meth:`EngineProfile.fingerprint`: build, model files and hashes, vocabulary,
  BOS/EOS, declared flags), compared with the registered pair before any number
  (:meth:`EngineProfile.identity_mismatches`), the rule it declares it serves
  (:meth:`EngineProfile.served_rule`) and a synthetic-acceptance mode (:meth:`EngineProfile.refusal`).

A new engine is one subclass (with its serving table) and one registration (:mod:`specdec.engines.profiles`). The engine check
(:func:`specdec.validation.engine_check.measure_engine`, the engine measurement of
:func:`specdec.validation.validate`) only talks to these objects.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar

from specdec.core.config import SamplingConfig
from specdec.engines.answers import EngineCompletion, EngineCounters
from specdec.engines.http import Deadline
from specdec.engines.metrics import EngineMetrics

__all__ = ["ProposalRule", "EngineEndpoint", "EngineLimits", "PairIdentity", "PairFiles", "CompletionParams", "EngineSession",
           "EngineProfile", "Refusal", "ServingFn", "draft_of", "no_early_exit", "DEFAULT_REQUEST_TIMEOUT_S",
           "DEFAULT_CHECK_TIMEOUT_S"]

#: default overall deadline of one engine request (s; ``SPECDEC_ENGINE_REQUEST_TIMEOUT_S``)
DEFAULT_REQUEST_TIMEOUT_S = 600.0
#: default overall deadline of one whole engine check (s; ``SPECDEC_ENGINE_CHECK_TIMEOUT_S``)
DEFAULT_CHECK_TIMEOUT_S = 7200.0

#: a serving-table entry: ``(DrafterKind, ServingRequest) -> the engine's settings``; raises ValueError (one line)
#: when it cannot. (This module imports no :mod:`specdec.kinds`: the settings import it, and the kinds the settings.)
ServingFn = Callable[[Any, Any], dict[str, Any]]


def draft_of(req: Any) -> str:
    """The draft reference an engine loads. Raises ValueError: the request has none."""
    if not req.draft:
        raise ValueError(f"a {req.label} drafter needs its draft model reference")
    return req.draft


def no_early_exit(kind: Any, req: Any) -> str:
    """The refusal of an engine with no early-exit (layer-skip) method (a :class:`Refusal`'s ``why``)."""
    return (f"{req.engine} has no early-exit (layer-skip) speculative method: serve this pair with transformers "
            "(assistant_early_exit), or validate another drafter for this engine")


class Refusal:
    """The serving-table entry of a kind an engine cannot serve as the core validated it: calling it runs
    ``checks`` (each ``(kind, req)``, raising first where the engine checked that before refusing) and then
    raises ``ValueError(why(kind, req))``, one line saying what to do instead."""

    def __init__(self, why: Callable[[Any, Any], str], *checks: Callable[..., Any]) -> None:
        self.why = why
        self.checks = checks

    def __call__(self, kind: Any, req: Any) -> dict[str, Any]:
        """Raises ValueError, always (a check's own, else the refusal)."""
        for check in self.checks:
            check(kind, req)
        raise ValueError(self.why(kind, req))


@dataclass(frozen=True)
class ProposalRule:
    """What an engine drafts per verification step, as the core replays it (docs/engine-check.md).

    Attributes:
        num_speculative_tokens: k, the most tokens drafted per step (llama.cpp ``--spec-draft-n-max``,
            vLLM ``num_speculative_tokens``); 0: drafting is off.
        draft_sampling: ``argmax`` (x = argmax q, verified by sample-and-match) or ``sampled`` (x ~ q,
            rejection sampling); :data:`specdec.core.config.DRAFT_SAMPLING_RULES`.
        min_draft_tokens: a draft shorter than this is dropped (llama.cpp ``--spec-draft-n-min``; 0: never).
        p_min: drafting stops before a token whose draft probability is below it (llama.cpp
            ``--spec-draft-p-min``; 0: never).
        ngram: ``(max, min)`` n-gram sizes of a prompt-lookup drafter (vLLM ``prompt_lookup_max/min``), else None.
        first_token_from_prefill: the first output token comes from the target's prefill alone (no draft).
        drafts_past_stop: a drafted stop token does not end the block; drafts past the end of the output
            count as drafted and never accepted (llama.cpp ``draft-simple``).
        synthetic: a synthetic-acceptance mode is on (what it is, e.g. ``--spec-synth-len 3``): the
            engine accepts at a typed-in rate; None: off or unknown.
    """

    num_speculative_tokens: int
    draft_sampling: str = "argmax"
    min_draft_tokens: int = 0
    p_min: float = 0.0
    ngram: tuple[int, int] | None = None
    first_token_from_prefill: bool = True
    drafts_past_stop: bool = False
    synthetic: str | None = None

    def drafts_less_than(self, validated: "ProposalRule") -> list[str]:
        """Why this (served) rule drafts less than ``validated`` (empty: it does not), one phrase each:
        drafting off, a smaller k, a larger ``p_min`` or ``n_min``, a larger minimum n-gram."""
        out = []
        if self.num_speculative_tokens == 0 < validated.num_speculative_tokens:
            return ["drafting is off"]
        if self.num_speculative_tokens < validated.num_speculative_tokens:
            out.append(f"k {self.num_speculative_tokens} < the validated {validated.num_speculative_tokens}")
        if self.p_min > validated.p_min:
            out.append(f"a drafting threshold p_min {self.p_min:g} > the validated {validated.p_min:g}")
        if self.min_draft_tokens > validated.min_draft_tokens:
            out.append(f"a minimum draft n_min {self.min_draft_tokens} > the validated {validated.min_draft_tokens}")
        if self.ngram and validated.ngram and self.ngram[1] > validated.ngram[1]:
            out.append(f"a minimum n-gram {self.ngram[1]} > the validated {validated.ngram[1]}")
        return out


@dataclass(frozen=True)
class EngineEndpoint:
    """A running engine that serves the pair (or, for an offline engine, how to run it).

    Attributes:
        url: base URL (``http://host:port``); credentials in it are never shown. None for an offline
            engine the profile runs itself (``options`` say how).
        engine: the profile name or one of its aliases (:func:`specdec.engines.profiles.engine_profile`); None:
            the default engine (:data:`specdec.engines.profiles.DEFAULT_ENGINE`).
        api_key: ``Authorization: Bearer`` token, if the server needs one (never shown or stored).
        baseline_url: the same target served without speculation (for the speedup), optional.
        flags: the command line the engine runs with, when the deployment declares it (recorded in the
            fingerprint, parsed for the served rule; a change between nights is named as the likely cause).
        served_model: the model name an OpenAI-compatible server expects in requests (vLLM
            ``--served-model-name``); None: the profile asks the server.
        options: engine-specific settings as strings (e.g. an offline engine's python), recorded as given.
    """

    url: str | None
    engine: str | None = None
    api_key: str | None = None
    baseline_url: str | None = None
    flags: tuple[str, ...] | None = None
    served_model: str | None = None
    options: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class EngineLimits:
    """The overall deadlines of the engine check (settings ``engine_request_timeout_s`` /
    ``engine_check_timeout_s``; printed by ``validate --engine-url``).

    Attributes:
        request_timeout_s: one request, connect to last byte (> 0).
        check_timeout_s: the whole check: fingerprint, every request, the counters (> 0).
    Raises:
        ValueError: a budget that is not a finite number > 0.
    """

    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    check_timeout_s: float = DEFAULT_CHECK_TIMEOUT_S

    def __post_init__(self) -> None:
        for name in ("request_timeout_s", "check_timeout_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be a finite number of seconds > 0, got {v!r}")

    @classmethod
    def of(cls, core: Any) -> "EngineLimits":
        """The limits a :class:`specdec.settings.CoreSettings` sets (``engine_request_timeout_s``,
        ``engine_check_timeout_s``). Raises ValueError: as the constructor."""
        return cls(core.engine_request_timeout_s, core.engine_check_timeout_s)

    def describe(self) -> str:
        """``deadline 600 s per request, 7200 s per check``."""
        return f"deadline {self.request_timeout_s:g} s per request, {self.check_timeout_s:g} s per check"


@dataclass(frozen=True)
class PairIdentity:
    """What the registered pair says the engine must serve (compared with the engine's fingerprint).

    Every field is optional: None means "not known here" and is not compared.

    Attributes:
        target_file / draft_file: the file names (basename) the pair was registered with.
        target_sha256 / draft_sha256: their sha256.
        vocab_size: the target tokenizer's vocabulary (ids are ``[0, vocab_size)``); model_vocab_size:
            the target's output rows (may be padded beyond the tokenizer).
        bos_token / eos_token: the tokenizer's BOS / EOS strings.
        rule: the :class:`ProposalRule` the pair was validated with.
    """

    target_file: str | None = None
    target_sha256: str | None = None
    draft_file: str | None = None
    draft_sha256: str | None = None
    vocab_size: int | None = None
    model_vocab_size: int | None = None
    bos_token: str | None = None
    eos_token: str | None = None
    rule: ProposalRule | None = None

    @classmethod
    def of_loaded(cls, tokenizer, model, files: "PairFiles", rule: ProposalRule | None = None) -> "PairIdentity":
        """The identity of a pair whose target is loaded here: ``files`` (names and sha256 as the caller knows
        them: from the run's refs, or from a registered version's tags), the target ``tokenizer``'s vocabulary
        and BOS/EOS strings, and the ``model``'s output rows."""
        rows = model.get_output_embeddings().weight.shape[0]
        return cls(target_file=files.target_file, target_sha256=files.target_sha256, draft_file=files.draft_file,
                   draft_sha256=files.draft_sha256, vocab_size=len(tokenizer), model_vocab_size=int(rows),
                   bos_token=getattr(tokenizer, "bos_token", None), eos_token=getattr(tokenizer, "eos_token", None),
                   rule=rule)


@dataclass(frozen=True)
class PairFiles:
    """The files of a pair as the caller knows them (basename and sha256 per side; None: not known here)."""

    target_file: str | None = None
    target_sha256: str | None = None
    draft_file: str | None = None
    draft_sha256: str | None = None


@dataclass(frozen=True)
class CompletionParams:
    """What every request of a check asks for: ``max_tokens`` new tokens, the pair's ``sampling``, a
    ``seed`` (T > 0), and the validated rule's ``draft_sampling`` (vLLM ``draft_sample_method``, always set)."""

    max_tokens: int
    sampling: SamplingConfig
    seed: int | None = None
    draft_sampling: str = "argmax"


class EngineSession(ABC):
    """A connection to one engine (:meth:`EngineProfile.connect`); a context manager.

    Attributes:
        counters_source: where per-request counters come from, said in the report
            (``per-request timings``, ``per-request metrics``, ``/metrics deltas``).
    """

    counters_source: ClassVar[str] = "per-request timings"

    @abstractmethod
    def describe(self, deadline: Deadline | None = None) -> dict[str, Any]:
        """What the engine says about itself (raw: llama.cpp ``/props`` + ``/v1/models``; vLLM ``/version``,
        ``/v1/models``, the worker's config), for :meth:`EngineProfile.fingerprint`.

        Raises:
            EngineRequestError / EngineAnswerError / EngineDeadlineError: one line.
        """

    @abstractmethod
    def complete(self, prompt_ids: list[int], params: CompletionParams, deadline: Deadline) -> EngineCompletion:
        """One completion of ``prompt_ids`` (target vocabulary ids, chat template applied, >= 1 id), finished by
        ``deadline``; token ids and counters as the engine gave them (the check validates them).

        Raises:
            EngineRequestError: unreachable / HTTP error; EngineAnswerError: malformed answer (one line naming
            what was wrong); EngineDeadlineError: not done by the deadline.
        """

    def complete_all(self, prompts: list[list[int]], params: CompletionParams, *, concurrency: int,
                     deadline: Deadline, progress: Callable[[int, int], None] | None = None,
                     accept: Callable[[int, EngineCompletion], EngineCompletion] | None = None) -> list[EngineCompletion]:
        """Every prompt, ``concurrency`` at a time (threads over :meth:`complete`), answers in prompt order.
        ``accept(i, answer)`` checks each answer as it arrives (it raises on a bad one, which ends the run before
        more requests go out). An offline engine overrides this to send one batch. The first error is raised as is."""
        out: list[EngineCompletion | None] = [None] * len(prompts)

        def one(i: int) -> None:
            c = self.complete(prompts[i], params, deadline)
            out[i] = accept(i, c) if accept is not None else c

        if concurrency <= 1:
            for i in range(len(prompts)):
                one(i)
                if progress is not None:
                    progress(i + 1, len(prompts))
            return out  # type: ignore[return-value]
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            for n, _ in enumerate(pool.map(one, range(len(prompts))), 1):
                if progress is not None:
                    progress(n, len(prompts))
        return out  # type: ignore[return-value]

    def counters(self, deadline: Deadline) -> EngineCounters | None:
        """The server-wide cumulative speculative counters now (``/metrics``), None when not exported.

        Raises:
            EngineRequestError / EngineAnswerError / EngineDeadlineError: one line.
        """
        return None

    def close(self) -> None:
        """Release the connection (and stop a worker the session started)."""

    def __enter__(self) -> "EngineSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EngineProfile(ABC):
    """One serving engine (module docstring). Subclass it, set the class attributes, implement
    :meth:`connect` (when the engine check can ask it) and register the class in
    :data:`specdec.engines.profiles.PROFILE_CLASSES`.

    Class attributes:
        name: the profile name (tags ``engine``, ``--engine``, history source ``engine:<name>``).
        title: how users write it (``llama.cpp``, ``vLLM``).
        aliases: other names ``--engine`` and the ``engine`` tag accept for it (``llama.cpp``, ``llama-server``).
        draft_sampling: the proposal rule it applies to model drafters (``argmax`` | ``sampled``).
        metrics: its ``/metrics`` names by role (:class:`~specdec.engines.metrics.EngineMetrics`), None without.
        checkable: the engine check can ask it (:meth:`connect` is implemented); the CLI reads it.
        offline: the product can run it here without a URL (:meth:`connect` with ``endpoint.url`` None: vLLM's
            ``LLM`` in the engine venv); else the engine check needs the URL of a running server.
        synthetic_flags: command-line flags that switch on a synthetic-acceptance mode (refused).
        serves_target_adapter: whether :meth:`serving_config` carries a target LoRA adapter (``target_adapter``).
        serves_lookup: it runs the n-gram prompt lookup the core replays (a model-free drafter can be checked).
        fingerprint_fields: fingerprint keys whose change between nights is named as a likely cause, in order.
        serving_table: its module-level :class:`~specdec.kinds.KindTable` of :data:`ServingFn` (a
            :class:`Refusal` for a kind it cannot serve): every kind has an entry (the table's exhaustiveness test).
    """

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    draft_sampling: ClassVar[str] = "argmax"
    metrics: ClassVar[EngineMetrics | None] = None
    checkable: ClassVar[bool] = False
    offline: ClassVar[bool] = False
    synthetic_flags: ClassVar[tuple[str, ...]] = ()
    serves_target_adapter: ClassVar[bool] = False
    serves_lookup: ClassVar[bool] = False
    fingerprint_fields: ClassVar[tuple[str, ...]] = ("draft_sha256", "model_sha256", "flags", "build_info")
    serving_table: ClassVar[Any]  # a specdec.kinds.KindTable of ServingFn

    # ---- the proposal rule -----------------------------------------------------------------
    def validated_rule(self, num_speculative_tokens: int, *, draft_sampling: str | None = None,
                       ngram: tuple[int, int] | None = None) -> ProposalRule:
        """The rule this engine applies when served with the pair's serving config (k, no threshold): what
        the core replays on the engine's tokens."""
        return ProposalRule(num_speculative_tokens=int(num_speculative_tokens),
                            draft_sampling=draft_sampling or self.draft_sampling, ngram=ngram)

    def served_rule(self, fingerprint: dict[str, Any], validated: ProposalRule) -> ProposalRule | None:
        """The rule the engine declares it serves (from its declared flags / speculative config in the
        fingerprint); None when it declares nothing. Default: nothing declared."""
        return None

    def replay_drafter(self, draft: Any) -> Any:
        """The drafter the core replays for this engine (default ``draft`` itself; vLLM's n-gram lookup takes the
        earliest occurrence of a match, so its profile returns the core's n-gram drafter set that way)."""
        return draft

    # ---- the serving config ----------------------------------------------------------------
    def serving_config(self, kind: Any, req: Any) -> dict[str, Any]:
        """The engine's settings for a validated pair (``speculative_config``/``args``/``command``/``generate_kwargs``):
        the entry of ``kind`` in :attr:`serving_table` applied to ``req``.

        Args:
            kind: the :class:`~specdec.kinds.DrafterKind`; req: the :class:`~specdec.kinds.ServingRequest`.
        Raises:
            ValueError: the engine cannot serve this kind as validated, or a reference is missing.
            MissingKindEntry: the kind has no entry in this engine's serving table.
        """
        return self.serving_table[kind](kind, req)

    def serves(self, kind: Any) -> bool:
        """Whether this engine serves ``kind`` as the core validated it (its entry is not a :class:`Refusal`).

        Raises:
            MissingKindEntry: the kind has no entry in this engine's serving table.
        """
        return not isinstance(self.serving_table[kind], Refusal)

    def tau_applies(self, kind: Any) -> bool:
        """Whether this engine's settings carry the validated confidence threshold for ``kind`` (default: no)."""
        return False

    # ---- running and asking ----------------------------------------------------------------
    def start(self, config: dict[str, Any], log_path: Path, settings: Any) -> Any:
        """Start the engine here with a :meth:`serving_config` (a context manager with ``.url``), where the
        product can; ``settings``: the core section (:class:`specdec.settings.CoreSettings`: where the engines
        built here live). Raises NotImplementedError where it cannot (the message says what to run instead)."""
        raise NotImplementedError(f"the product does not start {self.title or self.name} here: start it yourself and "
                                  "give its URL")

    def connect(self, endpoint: EngineEndpoint, limits: EngineLimits) -> EngineSession:
        """An :class:`EngineSession` to ``endpoint``. Raises ValueError where the engine check cannot ask this engine."""
        raise ValueError(f"the engine check cannot ask {self.title or self.name} (no client for it): use an engine "
                         "whose profile is checkable")

    # ---- its identity -----------------------------------------------------------------------
    def fingerprint(self, session: EngineSession, endpoint: EngineEndpoint,
                    deadline: Deadline | None = None) -> dict[str, Any]:
        """What identifies the serving stack (plain JSON values; keys with unknown values left out).
        Common keys: ``engine``, ``build_info``, ``model_path``, ``model_sha256``, ``draft_path``,
        ``draft_sha256``, ``vocab_size``, ``bos_token``, ``eos_token``, ``flags``; an engine adds its own
        (vLLM: ``vllm_version``, ``model_runner``, ``speculative_config``, ``compilation_config``, ``dtype``)."""
        out = {"engine": self.name, **{k: v for k, v in session.describe(deadline).items() if v is not None}}
        if endpoint.flags:
            out["flags"] = list(endpoint.flags)
        return out

    def refusal(self, fingerprint: dict[str, Any]) -> str | None:
        """Why this engine must not be measured (a synthetic-acceptance mode is on), or None."""
        flags = fingerprint.get("flags") or []
        on = [f for f in flags if str(f).split("=", 1)[0] in self.synthetic_flags]
        if on:
            return (f"the engine runs with {on[0]} (synthetic acceptance, benchmarking only): its acceptance is a "
                    "number someone typed in, not the pair's; restart it without it")
        return None

    def identity_mismatches(self, fingerprint: dict[str, Any], pair: PairIdentity) -> dict[str, str]:
        """``{field: "the engine serves X, the pair's Y is Z"}`` for each fingerprint field that contradicts the
        registered pair (fields ``target``, ``draft``: file hash, else file name; ``vocab_size``; ``bos_token``,
        ``eos_token``: the strings); empty when nothing does."""
        return identity_mismatches(fingerprint, pair)


def identity_mismatches(fp: dict[str, Any], pair: PairIdentity) -> dict[str, str]:
    """The default comparison behind :meth:`EngineProfile.identity_mismatches`."""
    out = {}
    for side, path_key, sha_key, file_, sha in (("target", "model_path", "model_sha256", pair.target_file, pair.target_sha256),
                                                ("draft", "draft_path", "draft_sha256", pair.draft_file, pair.draft_sha256)):
        served_sha, served_path = fp.get(sha_key), fp.get(path_key)
        if served_sha and sha and served_sha != sha:
            out[side] = (f"the engine serves {side} {_name(served_path)} (sha256 {served_sha[:12]}), the pair's {side} is "
                         f"{file_ or '?'} (sha256 {sha[:12]})")
        elif not (served_sha and sha) and served_path and file_ and Path(str(served_path)).name != file_:
            out[side] = (f"the engine serves {side} {_name(served_path)}, the pair's {side} is {file_} (by file name; "
                         "the engine's file is not readable here to hash)")
    vocab = fp.get("vocab_size")
    if vocab is not None and pair.vocab_size and vocab not in (pair.vocab_size, pair.model_vocab_size):
        out["vocab_size"] = f"the engine's vocabulary has {vocab} tokens, the pair's target has {pair.vocab_size}"
    for name in ("bos_token", "eos_token"):
        served, want = fp.get(name), getattr(pair, name)
        if served and want and served != want:
            out[name] = f"the engine's {name.split('_')[0].upper()} token is {served!r}, the pair's target uses {want!r}"
    return out


def _name(path: Any) -> str:
    return Path(str(path)).name if path else "?"
