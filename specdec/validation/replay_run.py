"""The replay engine: continuations (cached or produced by the core) and per-prompt replays.

For every prompt of the subset that can run (:func:`specdec.validation.prompt_run.skip_reason`):

1. the target's continuation from the :class:`~specdec.validation.continuation_cache.ContinuationCache`,
   or produced by the core and stored. Greedy: by :func:`specdec.speculative_generate` (token-identical
   to target-only) with whichever producer is faster here (:class:`ProducerChoice`: the model
   drafter under test, if any, and the n-gram drafter, whose miss costs nothing, are timed on the
   first produced continuations, then the faster per new token produces the rest). Sampling: by
   :func:`specdec.autoregressive_generate` with the same per-prompt generator as the decoding
   validation (:func:`prompt_seed`);
2. per drafter, one teacher-forced draft pass: the counters of every k in ``1..kmax``
   (:mod:`specdec.validation.replay`) wherever they are exact (:func:`replays_exactly`: greedy; at
   temperature > 0 the argmax proposal rule and the n-gram drafter); otherwise (the sampled rule) the
   per-position alphas (one teacher-forced target pass shared by the drafters) for the expected
   counters (:mod:`specdec.validation.replay_expected`).

Why the argmax rule replays exactly at temperature > 0: its draft ``x = argmax q`` is a function of
the prefix, it is accepted with probability ``p(x)``, and a rejection draws from ``p`` without ``x``.
So the emitted token equals ``x`` exactly when the draft was accepted, and a run of speculative
decoding that emits ``y`` has counters fixed by ``y`` (those of greedy replay along ``y``). Since its
output is distributed as the target's, the counters replayed along target samples are distributed as
the decoded counters: not the independent-coin approximation of ``sum p(argmax q)``, which overstates
acceptance after a rejection (the residual token is one the draft did not expect; measured on the
real pair: 0.572 expected vs 0.506 [0.468, 0.539] decoded, ``benchmarks/results/2026-12-01-rule-tau-cpu.md``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from specdec.core.decoding import autoregressive_generate, speculative_generate
from specdec.core.finite import BrokenModel, NonFiniteLogits
from specdec.core.drafters import ModelDrafter, NgramDrafter, fit_vocab
from specdec.core.inputs import stop_token_ids
from specdec.core.kv import model_device, timed
from specdec.core.stats import DecodingStats
from specdec.validation.config import ValidationConfig
from specdec.validation.continuation_cache import ContinuationCache, ContinuationKey, chat_template_hash
from specdec.validation.heldout import HeldoutPrompt, HeldoutSet, prompt_token_ids
from specdec.validation.prompt_run import prompt_seed, seeded_generator, skip_reason
from specdec.validation.replay import DraftTrace, draft_trace, replay_curve
from specdec.validation.replay_expected import position_alphas
from specdec.validation.teacher_forcing import teacher_forced_logits

__all__ = ["ReplayedPrompt", "DrafterReplay", "replay_prompts", "adopts_prefix", "ProducerChoice", "replays_exactly"]


def replays_exactly(drafter: Any, config: ValidationConfig) -> bool:
    """Whether replay gives ``drafter``'s exact counters under ``config`` (module docstring): greedy
    decoding; the n-gram drafter (a lookup: q one-hot, no confidence threshold applies to it); or, at
    temperature > 0, a model drafter under the argmax rule without a confidence threshold (the
    threshold's confidence is the draft's warped probability there, which the trace does not record)."""
    if config.sampling.is_greedy or isinstance(drafter, NgramDrafter):
        return True
    spec = config.speculative
    return spec.draft_sampling == "argmax" and spec.assistant_confidence_threshold is None


@dataclass
class DrafterReplay:
    """One drafter's replay of one prompt: ``curve`` (exact counters, ``{k: DecodingStats}``) and
    its trace, or ``alphas`` (the sampled rule, per continuation position)."""

    curve: dict[int, DecodingStats] = field(default_factory=dict)
    alphas: list[float] = field(default_factory=list)
    trace: DraftTrace | None = None
    adopts_prefix: bool = False


@dataclass
class ReplayedPrompt:
    """One prompt: its ids, the target's continuation, where it came from, and each drafter's replay.

    ``status`` is ``"ok"`` or ``"skipped"`` (``skip_reason`` says why); ``produced_by`` is
    ``"cache"``, ``"speculative"`` (the model drafter under test), ``"ngram"`` (the n-gram drafter) or
    ``"target-only"``; seconds are wall seconds.
    """

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
    """Which drafter produces the greedy continuations: the faster one, measured here.

    Every option is exact (greedy speculative decoding emits the target's own continuation), so the
    choice only changes cost. The options are tried in turn on the first ``trials`` produced
    continuations each; after that the one with the fewest seconds per new token (pooled over its
    trials) produces the rest.

    Args:
        options: ``(name, drafter)`` pairs, e.g. ``[("speculative", model_drafter), ("ngram", NgramDrafter())]``;
            at least one.
        trials: produced continuations timed per option before choosing (>= 1).
    Raises:
        ValueError: no options, or ``trials < 1``.
    """

    def __init__(self, options: list[tuple[str, Any]], trials: int = 2) -> None:
        if not options or trials < 1:
            raise ValueError("ProducerChoice needs at least one option and trials >= 1")
        self.options = list(options)
        self.trials = trials
        self._seconds = {name: 0.0 for name, _ in options}
        self._tokens = {name: 0 for name, _ in options}
        self._runs = {name: 0 for name, _ in options}

    def next(self) -> tuple[str, Any]:
        """The option that produces the next continuation: ``(name, drafter)``."""
        pending = [o for o in self.options if self._runs[o[0]] < self.trials]
        if pending:
            return min(pending, key=lambda o: self._runs[o[0]])
        return min(self.options, key=lambda o: self.seconds_per_token(o[0]))

    def record(self, name: str, seconds: float, new_tokens: int) -> None:
        """One produced continuation: wall ``seconds`` for ``new_tokens`` tokens."""
        self._runs[name] += 1
        self._seconds[name] += seconds
        self._tokens[name] += max(new_tokens, 1)

    def seconds_per_token(self, name: str) -> float:
        """Pooled seconds per new token of ``name`` (inf before its first run)."""
        return self._seconds[name] / self._tokens[name] if self._tokens[name] else float("inf")

    def summary(self) -> dict[str, float]:
        """``{name: seconds per new token}`` of the options tried (for reports)."""
        return {n: self.seconds_per_token(n) for n, _ in self.options if self._runs[n]}


def adopts_prefix(drafter_obj: Any, target: torch.nn.Module, prompt_len: int) -> bool:
    """Whether decoding lets this drafter adopt the target's prompt KV (one plain first step)."""
    if isinstance(drafter_obj, ModelDrafter):
        return bool(drafter_obj.can_adopt_prefix(target, prompt_len))
    if isinstance(drafter_obj, torch.nn.Module):
        return bool(ModelDrafter(drafter_obj).can_adopt_prefix(target, prompt_len))
    return False


def replay_prompts(
    subset: HeldoutSet,
    target: torch.nn.Module,
    tokenizer: Any,
    drafters: list[Any],
    config: ValidationConfig,
    eos: Any,
    ctx_limit: int | None,
    *,
    cache: ContinuationCache,
    target_weights: str,
    kmax: int = 16,
    exact: bool = False,
    progress: Callable[[int, int, ReplayedPrompt], None] | None = None,
    replay: bool = True,
) -> list[ReplayedPrompt]:
    """Replay every prompt of ``subset`` for every drafter (see the module docstring).

    Args:
        subset: the prompts (its ``source_version`` keys the cache).
        target: the target causal LM (eval mode).
        tokenizer: its tokenizer (chat template applied by :func:`prompt_token_ids`).
        drafters: per drafter, the object decoding uses (causal LM, ModelDrafter or NgramDrafter).
        config: the validation settings (k is irrelevant: every k in ``1..kmax`` is replayed).
        eos: EOS id(s). ctx_limit: the models' smallest context (tokens) or None.
        cache: where continuations are read and stored.
        target_weights: the target's weights hash (:func:`model_weights_hash`).
        kmax: largest k replayed (greedy: 1..kmax; sampling: 1..min(kmax, 8)).
        exact: greedy model drafters: also run the draft after each rejected token
            (:func:`draft_trace`), so ``num_draft_tokens`` is exact too.
        progress: ``progress(done, total, replayed)`` after each prompt.
        replay: False: only the continuations (read from the cache or produced), no drafter replay.
    Returns:
        one :class:`ReplayedPrompt` per prompt, in order.
    """
    device = model_device(target)
    stop = stop_token_ids(eos)
    vocab = target.get_output_embeddings().weight.shape[0]
    template = chat_template_hash(tokenizer)
    greedy = config.sampling.is_greedy
    producers = None
    if greedy:
        model = next((d for d in drafters if not isinstance(d, NgramDrafter)), None)
        producers = ProducerChoice(([("speculative", model)] if model is not None else [])
                                   + [("ngram", NgramDrafter())])
    out: list[ReplayedPrompt] = []
    for i, prompt in enumerate(subset.prompts):
        ids = [] if prompt.is_empty else prompt_token_ids(prompt, tokenizer)
        rp = ReplayedPrompt(prompt, ids)
        reason = skip_reason(prompt, ids, config, ctx_limit)
        if reason is not None:
            rp.status, rp.skip_reason = "skipped", reason
            out.append(rp)
            if progress is not None:
                progress(i + 1, len(subset.prompts), rp)
            continue
        key = ContinuationKey.build(
            target_weights=target_weights, heldout_version=subset.source_version, prompt_id=prompt.id, prompt_ids=ids,
            chat_template=template, max_new_tokens=config.max_new_tokens, sampling=config.sampling, seed=config.seed,
            stop_token_ids=stop, dtype=next(target.parameters()).dtype, device=device,
        )
        try:
            _continuation(rp, cache, key, vocab, producers, lambda p: _produce(target, p, ids, config, eos,
                                                                               prompt.id, device), device)
            if replay:
                rp.drafters, rp.replay_seconds = timed(
                    lambda: _replay_one(target, drafters, ids, rp.continuation, config, stop, vocab, kmax, exact),
                    device)
        except NonFiniteLogits as e:  # a broken model: the whole validation stops, naming it (issue 32, item 2)
            raise BrokenModel.naming(e, target, [prompt.id]) from None
        out.append(rp)
        if progress is not None:
            progress(i + 1, len(subset.prompts), rp)
    return out


def _continuation(rp: ReplayedPrompt, cache: ContinuationCache, key, vocab: int, producers, produce,
                  device) -> None:
    """The target continuation of ``rp``: from the cache, else produced (``produce(producer)``) and stored."""
    cached = cache.get(key, vocab_size=vocab)
    if cached is not None:
        rp.continuation, rp.produced_by = cached, "cache"
        return
    name, producer = producers.next() if producers is not None else ("target-only", None)
    rp.continuation, rp.continuation_seconds = timed(lambda: produce(producer), device)
    rp.produced_by = name
    if producers is not None:
        producers.record(name, rp.continuation_seconds, len(rp.continuation))
    cache.put(key, rp.continuation, rp.produced_by)


def _produce(target, producer, ids: list[int], config: ValidationConfig, eos: Any, prompt_id: str,
             device: torch.device) -> list[int]:
    x = torch.tensor([ids], dtype=torch.long, device=device)
    decode = dict(max_new_tokens=config.max_new_tokens, sampling=config.sampling, eos_token_id=eos)
    if producer is not None:  # greedy: the pair's output is the target's own greedy continuation
        return speculative_generate(target, producer, x, num_speculative_tokens=config.num_speculative_tokens,
                                    **decode).token_ids
    gen = seeded_generator(prompt_seed(config.seed, prompt_id), device)  # as the decoding validation's target-only
    return autoregressive_generate(target, x, generator=gen, **decode).token_ids


@torch.inference_mode()
def _replay_one(target, drafters, ids, y, config: ValidationConfig, stop, vocab: int, kmax: int,
                exact: bool) -> list[DrafterReplay]:
    res: list[DrafterReplay] = []
    z_p = None
    for d in drafters:
        adopt = adopts_prefix(d, target, len(ids))
        if replays_exactly(d, config):
            trace = draft_trace(d, ids, y, vocab, kmax=kmax, stop_token_ids=stop, exact=exact, adopts_prefix=adopt,
                                target=target)
            curve = replay_curve(trace, y, range(1, kmax + 1), max_new_tokens=config.max_new_tokens, stop_token_ids=stop,
                                 assistant_confidence_threshold=config.speculative.assistant_confidence_threshold)
            res.append(DrafterReplay(curve=curve, trace=trace, adopts_prefix=adopt))
            continue
        if not y:
            res.append(DrafterReplay(adopts_prefix=adopt))
            continue
        if z_p is None:  # one teacher-forced target pass shared by the drafters that need p
            z_p = teacher_forced_logits(target, ids + y[:-1], len(y))
        model = d.model if isinstance(d, ModelDrafter) else d
        z_q = fit_vocab(teacher_forced_logits(model, ids + y[:-1], len(y)), vocab)
        alphas = position_alphas(z_p, z_q, config.sampling, config.speculative.draft_sampling)
        res.append(DrafterReplay(alphas=alphas, adopts_prefix=adopt))
    return res
