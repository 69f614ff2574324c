"""The replay engine: per prompt the target's continuation (cached, or produced by the core) and each drafter's replay.

Greedy continuations come from :func:`specdec.speculative_generate` with the producer measured faster here
(:class:`ProducerChoice`), or from the engine serving the target (``engine``:
:class:`~specdec.validation.engine_continuations.EngineContinuations`; the target may then be a
:func:`~specdec.validation.served_target.served_target` with no weights), sampled ones from target-only
decoding with the per-prompt generator. Each drafter
gets exact counters for every k where they are exact (:func:`replays_exactly`; why the argmax rule is: docs/metrics.md
"Proposal rule"), else per-position alphas for expected counters (:mod:`specdec.validation.replay_expected`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from specdec.core.decoding import autoregressive_generate, speculative_generate
from specdec.core.drafters import ModelDrafter, NgramDrafter, as_drafter, fit_vocab
from specdec.core.finite import BrokenModel, NonFiniteLogits
from specdec.core.inputs import stop_token_ids
from specdec.core.kv import model_device, timed
from specdec.core.stats import DecodingStats
from specdec.validation.config import ValidationConfig
from specdec.validation.continuation_cache import ContinuationCache, ContinuationKey, chat_template_hash
from specdec.validation.heldout import HeldoutPrompt, HeldoutSet, prompt_token_ids
from specdec.validation.prompt_run import prompt_seed, seeded_generator, skip_reason
from specdec.validation.replay import DraftTrace, draft_trace, replay_counters
from specdec.validation.replay_expected import position_alphas
from specdec.validation.teacher_forcing import teacher_forced_logits

__all__ = ["ReplayedPrompt", "DrafterReplay", "replay_prompts", "adopts_prefix", "ProducerChoice", "replays_exactly"]


def replays_exactly(drafter: Any, config: ValidationConfig) -> bool:
    """Whether replay gives ``drafter``'s exact counters under ``config``: greedy; the n-gram drafter; or at
    T > 0 a model drafter under the argmax rule without a threshold (its confidence is not in the trace)."""
    if config.sampling.is_greedy or isinstance(drafter, NgramDrafter):
        return True
    spec = config.speculative
    return spec.draft_sampling == "argmax" and spec.assistant_confidence_threshold is None


@dataclass
class DrafterReplay:
    """One drafter's replay of one prompt: ``curve`` (``{k: DecodingStats}``) and its trace, or ``alphas``."""
    curve: dict[int, DecodingStats] = field(default_factory=dict)
    alphas: list[float] = field(default_factory=list)
    trace: DraftTrace | None = None
    adopts_prefix: bool = False


@dataclass
class ReplayedPrompt:
    """One prompt: its ids, ``status`` (``"ok"`` / ``"skipped"``), the target's continuation, who produced it
    (``"cache"``, ``"speculative"``, ``"ngram"``, ``"target-only"``), wall seconds and each drafter's replay."""
    prompt: HeldoutPrompt
    ids: list[int]
    status: str = "ok"
    skip_reason: str | None = None
    continuation: list[int] = field(default_factory=list)
    produced_by: str = ""
    continuation_seconds: float = 0.0
    replay_seconds: float = 0.0
    drafters: list[DrafterReplay] = field(default_factory=list)


class ProducerChoice:
    """Which ``(name, drafter)`` option produces the greedy continuations (every option is exact): each in
    turn for ``trials`` continuations, then the one with the fewest seconds per new token.

    Raises:
        ValueError: no options, or ``trials < 1``.
    """

    def __init__(self, options: list[tuple[str, Any]], trials: int = 2) -> None:
        if not options or trials < 1:
            raise ValueError("ProducerChoice needs at least one option and trials >= 1")
        self.options, self.trials = list(options), trials
        self._seconds, self._tokens, self._runs = ({name: 0 for name, _ in options} for _ in range(3))

    def next(self) -> tuple[str, Any]:
        pending = [o for o in self.options if self._runs[o[0]] < self.trials]
        if pending:
            return min(pending, key=lambda o: self._runs[o[0]])
        return min(self.options, key=lambda o: self.seconds_per_token(o[0]))

    def record(self, name: str, seconds: float, new_tokens: int) -> None:
        self._runs[name] += 1
        self._seconds[name] += seconds
        self._tokens[name] += max(new_tokens, 1)

    def seconds_per_token(self, name: str) -> float:  # pooled; inf before its first run
        return self._seconds[name] / self._tokens[name] if self._tokens[name] else float("inf")

    def summary(self) -> dict[str, float]:  # seconds per new token of the options tried
        return {n: self.seconds_per_token(n) for n, _ in self.options if self._runs[n]}


def adopts_prefix(drafter: Any, target: torch.nn.Module, prompt_len: int) -> bool:
    """Whether decoding lets this drafter adopt the target's prompt KV, asked as the core asks it."""
    return bool(getattr(as_drafter(drafter), "can_adopt_prefix", lambda *a: False)(target, prompt_len))


@dataclass
class _Replay:  # what replaying one prompt needs

    target: torch.nn.Module
    drafters: list[Any]
    config: ValidationConfig
    stop: frozenset[int]
    eos: Any
    kmax: int
    exact: bool
    cache: ContinuationCache
    producers: ProducerChoice | None
    device: torch.device
    vocab: int
    engine: Any = None  # EngineContinuations: the continuations' source instead of the core


def replay_prompts(subset: HeldoutSet, target: torch.nn.Module, tokenizer: Any, drafters: list[Any],
                   config: ValidationConfig, *, eos: Any, ctx_limit: int | None, cache: ContinuationCache,
                   target_weights: str, kmax: int = 16, exact: bool = False,
                   progress: Callable[[int, int, ReplayedPrompt], None] | None = None,
                   replay: bool = True, engine: Any = None) -> list[ReplayedPrompt]:
    """One :class:`ReplayedPrompt` per prompt of ``subset`` (its ``source_version`` keys the cache), in order:
    every drafter (the objects decoding uses) replayed against ``target`` (eval mode) for every k in ``1..kmax``
    (``exact`` as :func:`draft_trace`; ``replay=False``: only the continuations); ``progress(done, total, rp)``;
    ``engine``: an :class:`~specdec.validation.engine_continuations.EngineContinuations` producing the
    (greedy) continuations, cached with its fingerprint.

    Raises:
        ValueError: ``engine`` with a sampling config (an engine's sampled stream is not the core's).
        specdec.core.finite.BrokenModel: a model produced non-finite logits.
        specdec.engines.client.EngineRequestError: the engine failed (the prompts done so far stay cached).
    """
    if engine is not None and not config.sampling.is_greedy:
        raise ValueError("continuations from an engine need greedy decoding (temperature 0)")
    run = _Replay(target, drafters, config, stop_token_ids(eos), eos, kmax, exact, cache,
                  _producers(drafters) if config.sampling.is_greedy and engine is None else None,
                  model_device(target), target.get_output_embeddings().weight.shape[0], engine)
    key = dict(target_weights=target_weights, heldout_version=subset.source_version,
               chat_template=chat_template_hash(tokenizer), max_new_tokens=config.max_new_tokens,
               sampling=config.sampling, seed=config.seed, stop_token_ids=run.stop,
               dtype=next(target.parameters()).dtype, device=run.device)
    if engine is not None:  # what the engine serves, not what this process holds
        key.update(dtype=str(engine.fingerprint.get("model_ftype", "served")), device=f"engine:{engine.name}",
                   engine=engine.digest)
    out: list[ReplayedPrompt] = []
    for i, prompt in enumerate(subset.prompts):
        rp = ReplayedPrompt(prompt, [] if prompt.is_empty else prompt_token_ids(prompt, tokenizer))
        rp.skip_reason = skip_reason(prompt, rp.ids, config, ctx_limit)
        if rp.skip_reason is not None:
            rp.status = "skipped"
        else:
            try:
                _continuation(run, rp, ContinuationKey.build(prompt_id=prompt.id, prompt_ids=rp.ids, **key))
                if replay:
                    rp.drafters, rp.replay_seconds = timed(lambda: _replay_one(run, rp.ids, rp.continuation),
                                                           run.device)
            except NonFiniteLogits as e:  # a broken model: the whole validation stops, naming it
                raise BrokenModel.naming(e, target, [prompt.id]) from None
        out.append(rp)
        if progress is not None:
            progress(i + 1, len(subset.prompts), rp)
    return out


def _producers(drafters: list[Any]) -> ProducerChoice:  # greedy: the pair's draft or the n-gram lookup, the faster
    model = next((d for d in drafters if not isinstance(d, NgramDrafter)), None)
    return ProducerChoice(([("speculative", model)] if model is not None else []) + [("ngram", NgramDrafter())])


def _continuation(run: _Replay, rp: ReplayedPrompt, key: ContinuationKey) -> None:  # cached, else produced and stored
    cached = run.cache.get(key, vocab_size=run.vocab)
    if cached is not None:
        rp.continuation, rp.produced_by = cached, "cache"
        return
    if run.engine is not None:
        name, producer = "engine", None
    else:
        name, producer = run.producers.next() if run.producers is not None else ("target-only", None)
    rp.continuation, rp.continuation_seconds = timed(lambda: _produce(run, producer, rp), run.device)
    rp.produced_by = name
    if run.producers is not None:
        run.producers.record(name, rp.continuation_seconds, len(rp.continuation))
    run.cache.put(key, rp.continuation, rp.produced_by)


def _produce(run: _Replay, producer: Any, rp: ReplayedPrompt) -> list[int]:  # engine; greedy: the pair's; else target-only
    if run.engine is not None:
        return run.engine.continuation(rp.ids, max_new_tokens=run.config.max_new_tokens, stop=run.stop,
                                       vocab_size=run.vocab)
    x = torch.tensor([rp.ids], dtype=torch.long, device=run.device)
    decode = dict(max_new_tokens=run.config.max_new_tokens, sampling=run.config.sampling, eos_token_id=run.eos)
    if producer is not None:
        return speculative_generate(run.target, producer, x, num_speculative_tokens=run.config.num_speculative_tokens,
                                    **decode).token_ids
    gen = seeded_generator(prompt_seed(run.config.seed, rp.prompt.id), run.device)
    return autoregressive_generate(run.target, x, generator=gen, **decode).token_ids


@torch.inference_mode()
def _replay_one(run: _Replay, ids: list[int], y: list[int]) -> list[DrafterReplay]:
    res: list[DrafterReplay] = []
    z_p, config = None, run.config
    for d in run.drafters:
        adopt = adopts_prefix(d, run.target, len(ids))
        if replays_exactly(d, config):
            trace = draft_trace(d, ids, y, run.vocab, kmax=run.kmax, stop_token_ids=run.stop, exact=run.exact,
                                adopts_prefix=adopt, target=run.target)
            curve = {k: replay_counters(trace, y, num_speculative_tokens=k, max_new_tokens=config.max_new_tokens,
                                        stop_token_ids=run.stop,
                                        assistant_confidence_threshold=config.speculative.assistant_confidence_threshold)
                     for k in range(1, run.kmax + 1)}
            res.append(DrafterReplay(curve=curve, trace=trace, adopts_prefix=adopt))
        elif not y:
            res.append(DrafterReplay(adopts_prefix=adopt))
        else:
            if z_p is None:  # one teacher-forced target pass shared by the drafters that need p
                z_p = teacher_forced_logits(run.target, ids + y[:-1], len(y))
            model = d.model if isinstance(d, ModelDrafter) else d
            z_q = fit_vocab(teacher_forced_logits(model, ids + y[:-1], len(y)), run.vocab)
            res.append(DrafterReplay(alphas=position_alphas(z_p, z_q, config.sampling,
                                                            config.speculative.draft_sampling), adopts_prefix=adopt))
    return res
