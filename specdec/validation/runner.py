"""The validation runner: prompts in groups of ``batch_size`` (B = 1 is a group of one).

The prompts that are not skipped (empty, or longer than the context) are taken in held-out
order, in groups of B. Each group is left-padded (the tokenizer's pad id, else 0; the attention
mask hides it) and gets

1. ONE target-only call (:func:`specdec.autoregressive_generate`, ``[B, L]``),
2. ONE speculative call per drafter (:func:`specdec.speculative_generate`),
3. then, per prompt, the teacher-forced passes and, greedy only, the exactness audit of each
   row against its own target-only row.

Per-prompt rows are filled from each row's own counters. Seconds are shared by the rows of a
call, so each call's wall seconds (and its pass-timer seconds and pass counts) are split across
its rows in proportion to the tokens each row emitted: the pooled sums equal the wall times and
the pooled per-pass means are those of the (batched) passes. Definitions: ``docs/metrics.md``
("Batched validation").
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from specdec.core.finite import BrokenModel, NonFiniteLogits

from specdec.core.decoding import autoregressive_generate, speculative_generate
from specdec.core.kv import left_pad as left_pad_with_mask
from specdec.core.kv import model_device
from specdec.validation.config import ValidationConfig
from specdec.validation.heldout import HeldoutPrompt, HeldoutSet, prompt_token_ids
from specdec.validation.machine import load_average
from specdec.validation.prompt_run import (
    DrafterUnderTest,
    Outcome,
    PromptRun,
    fill_run,
    prompt_seed,
    seeded_generator,
    skip_reason,
)
from specdec.validation.report import PromptResult
from specdec.validation.teacher_forcing import target_teacher_forcing
from specdec.core.kv import timed
from specdec.validation.timing import PassTimer

__all__ = ["DecodeSetup", "run_prompts", "run_group", "retime_prompts", "warmup", "left_pad", "token_shares",
           "pad_token_id"]


@dataclass(frozen=True)
class DecodeSetup:
    """What decoding prompts needs: the target causal LM (eval mode, hooked by ``target_timer``), its
    tokenizer (chat template applied by :func:`prompt_token_ids`), the drafters under validation (each
    with its own pass timer), the settings, the EOS id(s) and the models' smallest context (or None)."""

    target: torch.nn.Module
    tokenizer: Any
    drafters: list[DrafterUnderTest]
    config: ValidationConfig
    eos: Any
    ctx_limit: int | None
    target_timer: PassTimer | None = None  # entered by the caller; None only for :func:`warmup`


def pad_token_id(tokenizer: Any) -> int:
    """The tokenizer's pad id, else 0 (any id works: the attention mask hides padding)."""
    pid = getattr(tokenizer, "pad_token_id", None)
    return int(pid) if pid is not None else 0


def left_pad(seqs: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token id lists into a batch.

    Args:
        seqs: B >= 1 non-empty lists of token ids.
        pad_id: id written into the padding slots.
        device: where the tensors go.
    Returns:
        ``(input_ids, attention_mask)``, both LongTensor ``[B, max_len]``; mask 1 = token, 0 = padding.
    Raises:
        ValueError: no sequences, or an empty one.
    """
    if not seqs or any(len(s) == 0 for s in seqs):
        raise ValueError("left_pad needs at least one sequence and no empty sequence")
    ids, valid = left_pad_with_mask(seqs, device, pad_id)
    return ids, valid.long()


def token_shares(tokens: list[int]) -> list[float]:
    """Each row's share of a batched call's cost: its emitted tokens over the batch's (sums to 1).

    Equal shares when no row emitted a token. ``tokens``: per-row counts (>= 0).
    """
    total = sum(tokens)
    if total <= 0:
        return [1.0 / len(tokens)] * len(tokens)
    return [n / total for n in tokens]


def generation_rows(result: Any) -> list[Any]:
    """Per-row :class:`~specdec.core.decoding.GenerationResult` s of a B = 1 or B > 1 generation."""
    rows = getattr(result, "rows", None)
    return list(rows) if rows is not None else [result]


def run_prompts(prompts: list[HeldoutPrompt], setup: DecodeSetup) -> Iterator[tuple[int, list[PromptRun]]]:
    """Validate ``prompts`` (the held-out subset, in order) in groups of ``config.batch_size`` (see the
    module docstring), with ``setup``'s timers entered.

    Yields:
        ``(index in prompts, one PromptRun per drafter)``: a skipped prompt as soon as it is found,
        the others when their group is done (so with B = 1 in held-out order).
    Raises:
        specdec.core.finite.BrokenModel: a model produced non-finite logits.
    """
    config = setup.config
    group: list[tuple[int, HeldoutPrompt, list[int]]] = []

    flushed = [0]
    history: list[list[float]] = []  # per group: seconds per token of target-only and of each drafter

    def flush() -> Iterator[tuple[int, list[PromptRun]]]:
        # every other group runs its speculative calls before target-only (interleaved timing)
        items = [(p, ids) for _, p, ids in group]
        try:
            runs = run_group(items, setup, spec_first=flushed[0] % 2 == 1)
            if under_load(history, group_rates(runs)):  # one side ran while a co-tenant took the cores: once more
                runs = run_group(items, setup, spec_first=flushed[0] % 2 == 0)
                for r in (r for per in runs for r in per):
                    r.remeasured = True
        except NonFiniteLogits as e:  # a broken model: the whole validation stops, naming it
            raise BrokenModel.naming(e, setup.target, [p.id for p, _ in items]) from None
        history.append(group_rates(runs))
        flushed[0] += 1
        yield from zip([i for i, _, _ in group], runs)
        group.clear()

    for i, prompt in enumerate(prompts):
        ids = [] if prompt.is_empty else prompt_token_ids(prompt, setup.tokenizer)
        reason = skip_reason(prompt, ids, config, setup.ctx_limit)
        if reason is not None:
            row = dict(status="skipped", skip_reason=reason, prompt_tokens=len(ids))
            yield i, [PromptRun(row=PromptResult(prompt.id, prompt.category, **row)) for _ in setup.drafters]
            continue
        group.append((i, prompt, ids))
        if len(group) == config.batch_size:
            yield from flush()
    if group:
        yield from flush()


#: a group whose target-only or speculative seconds per token exceed this multiple of the median of the
#: groups before it ran under load (a co-tenant) and is re-timed once (the second timing is kept)
LOADED_FACTOR = 1.5


def group_rates(runs: list[list[PromptRun]]) -> list[float]:
    """Seconds per emitted token of a group's target-only run and of each drafter's speculative run."""
    ref = sum(r[0].target_only_seconds for r in runs) / max(1, sum(r[0].target_only_tokens for r in runs))
    spec = [sum(r[j].speculative_seconds for r in runs) / max(1, sum(r[j].speculative_tokens for r in runs))
            for j in range(len(runs[0]))]
    return [ref, *spec]


def under_load(history: list[list[float]], rates: list[float]) -> bool:
    """True when any side of this group is :data:`LOADED_FACTOR` slower per token than the median of
    at least 3 earlier groups (prompt lengths differ, so one-off factors below that are not flagged)."""
    if len(history) < 3:
        return False
    for j, x in enumerate(rates):
        past = sorted(h[j] for h in history)
        med = past[len(past) // 2]
        if med > 0 and x > LOADED_FACTOR * med:
            return True
    return False


def band_outliers(runs: list[PromptRun], predicted: float, band: tuple[float, float]) -> list[str]:
    """Prompt ids whose paired speedup (speculative over target-only token rate) lies outside
    ``band`` times ``predicted`` on the side the group's median disagrees: the slow prompts of a run
    measured below the speed model's band (the fast ones of a run above it). ``[]`` without a prediction."""
    rates = {r.row.prompt_id: (r.speculative_tokens / r.speculative_seconds) / (r.target_only_tokens / r.target_only_seconds)
             for r in runs if r.ok and min(r.speculative_seconds, r.target_only_seconds, r.speculative_tokens,
                                           r.target_only_tokens) > 0}
    if not rates or not predicted > 0:
        return []
    med = sorted(rates.values())[len(rates) // 2]
    if med < band[0] * predicted:
        return [p for p, x in rates.items() if x < band[0] * predicted]
    if med > band[1] * predicted:
        return [p for p, x in rates.items() if x > band[1] * predicted]
    return []


def retime_prompts(prompts: list[tuple[int, HeldoutPrompt, list[int]]],
                   setup: DecodeSetup) -> Iterator[tuple[int, list[PromptRun]]]:
    """Time ``(index, prompt, ids)`` once more, one prompt a group, target-only and speculative
    interleaved as the first time (alternating which goes first); the new runs are marked
    ``remeasured`` and replace the old ones (the caller's choice)."""
    for n, (i, prompt, ids) in enumerate(prompts):
        runs = run_group([(prompt, ids)], setup, spec_first=n % 2 == 0)[0]
        for r in runs:
            r.remeasured = True
        yield i, runs


def proposal_rule(config: ValidationConfig) -> dict[str, Any]:
    """The pair's proposal rule and draft-length policy as ``speculative_generate`` keywords
    (``draft_sampling``, ``assistant_confidence_threshold``), from ``config.speculative``."""
    spec = config.speculative
    return {"draft_sampling": spec.draft_sampling, "assistant_confidence_threshold": spec.assistant_confidence_threshold}


def run_group(group: list[tuple[HeldoutPrompt, list[int]]], setup: DecodeSetup,
              spec_first: bool = False) -> list[list[PromptRun]]:
    """One group of prompts (B >= 1): target-only and each drafter's speculative run back to back
    (target-only first, or last with ``spec_first``: the caller alternates, so neither side always
    runs on the warmer machine), the 1-minute load average right after, then per prompt the
    teacher-forced agreement and the exactness audit.

    Returns:
        per prompt of the group, one :class:`PromptRun` per drafter.
    """
    target, config, target_timer = setup.target, setup.config, setup.target_timer
    device = model_device(target)
    inputs = left_pad([ids for _, ids in group], pad_token_id(setup.tokenizer), device)
    group_seed = prompt_seed(config.seed, group[0][0].id)  # one generator per group (see ValidationConfig)
    decode = dict(max_new_tokens=config.max_new_tokens, sampling=config.sampling, eos_token_id=setup.eos)

    def target_only():
        start = target_timer.start_generation()
        reference, reference_seconds = timed(
            lambda: autoregressive_generate(target, *inputs, generator=seeded_generator(group_seed, device), **decode),
            device,
        )
        return (reference, reference_seconds, *target_timer.since(start))

    if not spec_first:
        reference, reference_seconds, step_seconds, steps = target_only()
    per_drafter: list[list[PromptRun]] = []
    speculative: list[tuple[list[Any], list[float], float]] = []  # per drafter: rows, shares, wall seconds
    for d in setup.drafters:
        runs, timed_rows = _speculative_run(group, setup, d, inputs, group_seed)
        per_drafter.append(runs)
        speculative.append(timed_rows)

    if spec_first:
        reference, reference_seconds, step_seconds, steps = target_only()
    load = load_average()
    reference_tokens = [r.token_ids for r in generation_rows(reference)]
    reference_shares = token_shares([len(t) for t in reference_tokens])
    for runs in per_drafter:
        for b, run in enumerate(runs):
            run.target_step_s, run.target_steps = step_seconds * reference_shares[b], steps * reference_shares[b]
            run.row.load_avg_1m = load
    # per prompt: the target's teacher-forced pass once, then each drafter's agreement and audit
    for b, (_, ids) in enumerate(group):
        ref = reference_tokens[b]
        forced = target_teacher_forcing(target, ids, ref, config.sampling) if ref else None
        for d, runs, (rows, shares, wall) in zip(setup.drafters, per_drafter, speculative):
            out = Outcome(rows[b].token_ids, rows[b].stats, ref, reference_seconds * reference_shares[b], wall * shares[b])
            fill_run(runs[b], out, forced, d, config)
    return [[runs[b] for runs in per_drafter] for b in range(len(group))]



def draft_prefill_tokens(d: DrafterUnderTest, target: torch.nn.Module, prompt_len: int) -> int:
    """Prompt tokens a drafter's model prefills itself: ``prompt_len``, or 0 for a drafter without a
    model (n-gram; a head reads the target's features) and for a draft that adopts the target's
    prompt KV (``can_adopt_prefix``: a bf16 copy of this very target)."""
    if d.model is None or getattr(d.obj, "head", None) is not None:
        return 0
    adopt = getattr(d.obj, "can_adopt_prefix", None)
    return 0 if adopt is not None and adopt(target, prompt_len) else prompt_len


def _speculative_run(group: list[tuple[HeldoutPrompt, list[int]]], setup: DecodeSetup, d: DrafterUnderTest,
                     inputs: tuple[torch.Tensor, torch.Tensor],
                     group_seed: int) -> tuple[list[PromptRun], tuple[list[Any], list[float], float]]:
    """One drafter's timed speculative run of the group (``inputs``: left-padded ids and mask).

    Returns:
        ``(runs, (rows, shares, wall seconds))``: one :class:`PromptRun` per prompt with its share (by emitted
        tokens) of the batch's verify and draft pass seconds; the generation rows, the shares and the wall time.
    """
    target, config, target_timer = setup.target, setup.config, setup.target_timer
    device = model_device(target)
    target_start, draft_start = target_timer.start_generation(), d.timer.start_generation()
    out, wall = timed(
        lambda: speculative_generate(
            target, d.obj, *inputs, num_speculative_tokens=config.num_speculative_tokens,
            max_new_tokens=config.max_new_tokens, sampling=config.sampling, eos_token_id=setup.eos,
            generator=seeded_generator(group_seed + 1, device), **proposal_rule(config),
        ),
        device,
    )
    rows = generation_rows(out)
    shares = token_shares([len(r.token_ids) for r in rows])
    verify_seconds, verify_passes = target_timer.since(target_start)
    if d.timer.model is not None:  # a draft model or an EAGLE-3 head: its own passes, prefill excluded
        draft_seconds, draft_passes = d.timer.since(draft_start)
    else:  # n-gram: one (batched) lookup per target pass, timed by the core as draft_seconds
        draft_seconds, draft_passes = out.stats.draft_seconds, max(r.stats.target_forward_passes for r in rows)
    runs = []
    for b, (prompt, ids) in enumerate(group):
        run = PromptRun(row=PromptResult(prompt_id=prompt.id, category=prompt.category, prompt_tokens=len(ids)))
        run.draft_prefill_tokens = draft_prefill_tokens(d, target, len(ids))
        run.target_pass_s, run.target_passes = verify_seconds * shares[b], verify_passes * shares[b]
        run.draft_pass_s, run.draft_passes = draft_seconds * shares[b], draft_passes * shares[b]
        row_stats = rows[b].stats  # seconds: shares of the batch's wall, not each the whole batch
        row_stats.target_seconds = out.stats.target_seconds * shares[b]
        row_stats.draft_seconds = out.stats.draft_seconds * shares[b]
        runs.append(run)
    return runs, (rows, shares, wall)


def warmup(setup: DecodeSetup, subset: HeldoutSet) -> None:
    """One short untimed generation of each kind on a group like the run's (not recorded).

    Uses up to ``config.batch_size`` of the shortest prompts among the first
    ``max(8, batch_size)`` (lazy init, allocator, the batched kernels and masks).

    Raises:
        specdec.core.finite.BrokenModel: a model produced non-finite logits (side, prompt, position named).
    """
    config, target = setup.config, setup.target
    cands = []
    for p in subset.prompts[: max(8, config.batch_size)]:
        ids = [] if p.is_empty else prompt_token_ids(p, setup.tokenizer)
        if ids and (setup.ctx_limit is None or len(ids) + 4 <= setup.ctx_limit):
            cands.append((ids, p.id))
    pick = sorted(cands, key=lambda c: len(c[0]))[: config.batch_size]
    if not pick:
        return
    x, mask = left_pad([ids for ids, _ in pick], pad_token_id(setup.tokenizer), model_device(target))
    decode = dict(max_new_tokens=min(4, config.max_new_tokens), sampling=config.sampling, eos_token_id=setup.eos)
    try:
        autoregressive_generate(target, x, mask, **decode)
        for d in setup.drafters:
            speculative_generate(target, d.obj, x, mask, num_speculative_tokens=config.num_speculative_tokens,
                                 **decode, **proposal_rule(config))
    except NonFiniteLogits as e:  # a broken model shows in the warm-up already: named as in the run
        raise BrokenModel.naming(e, target, [pid for _, pid in pick]) from None
