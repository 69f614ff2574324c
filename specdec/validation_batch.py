"""Batched validation: :func:`specdec.validation.validate_pairs` with ``ValidationConfig.batch_size`` > 1.

The prompts that are not skipped (empty, or longer than the context) are taken in held-out
order, in groups of B. Each group is left-padded (the tokenizer's pad id, else 0; the attention
mask hides it) and gets

1. ONE batched target-only call (:func:`specdec.autoregressive_generate` with ``[B, L]``),
2. ONE batched speculative call per drafter (:func:`specdec.speculative_generate`),
3. then, per prompt, the teacher-forced passes (as with B = 1) and, greedy only, the exactness
   audit of each row against its own batched target-only row.

Per-prompt rows are filled from each row's own counters (:class:`specdec.batch.BatchGenerationResult`).
Seconds are shared by the rows of a batched call, so each call's wall seconds (and its pass-timer
seconds and pass counts) are split across its rows in proportion to the tokens each row emitted:
the pooled sums equal the batch's wall times and the pooled per-pass means are those of the
batched passes. Definitions: ``docs/metrics.md`` ("Batched validation").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from specdec.batch import left_pad as _left_pad
from specdec.decoding import autoregressive_generate, speculative_generate
from specdec.drafters import model_device
from specdec.heldout import HeldoutPrompt, HeldoutSet, prompt_token_ids
from specdec.report import PromptResult
from specdec.validation import (
    ValidationConfig,
    _DrafterCtx,
    _fill_run,
    _gen,
    _PassTimer,
    _prompt_seed,
    _Run,
    _skip_reason,
    _target_tf,
    _timed,
)

__all__ = ["run_batched", "warmup_batched", "left_pad", "token_shares"]


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
    ids, valid = _left_pad(seqs, device, pad_id)
    return ids, valid.long()


def token_shares(tokens: list[int]) -> list[float]:
    """Each row's share of a batched call's cost: its emitted tokens over the batch's (sums to 1).

    Equal shares when no row emitted a token. ``tokens``: per-row counts (>= 0).
    """
    total = sum(tokens)
    if total <= 0:
        return [1.0 / len(tokens)] * len(tokens)
    return [n / total for n in tokens]


def _rows(result: Any) -> list[Any]:
    """Per-row :class:`~specdec.decoding.GenerationResult` s of a B = 1 or B > 1 generation."""
    rows = getattr(result, "rows", None)
    return list(rows) if rows is not None else [result]


def run_batched(
    prompts: list[HeldoutPrompt],
    target: torch.nn.Module,
    tokenizer: Any,
    drafters: list[_DrafterCtx],
    config: ValidationConfig,
    eos: Any,
    ctx_limit: int | None,
    t_timer: _PassTimer,
    progress: Callable[[int, int, list[PromptResult]], None] | None = None,
) -> list[list[_Run]]:
    """Validate ``prompts`` in groups of ``config.batch_size`` (see the module docstring).

    Args:
        prompts: the held-out subset, in order.
        target: the target causal LM (eval mode), hooked by ``t_timer``.
        tokenizer: the target's tokenizer (chat template applied by :func:`prompt_token_ids`).
        drafters: the drafters under validation, each with its own pass timer (entered).
        config: the validation settings (``batch_size`` > 1).
        eos: EOS id(s) that end generation.
        ctx_limit: the smallest context of the models (tokens), or None.
        t_timer: the target's pass timer (entered).
        progress: ``progress(done, total, rows)`` per prompt: skipped prompts when found, the
            others when their group is done.
    Returns:
        per prompt (held-out order), the list of one :class:`_Run` per drafter.
    """
    n = len(prompts)
    out: list[list[_Run] | None] = [None] * n
    done = 0
    todo: list[tuple[int, HeldoutPrompt, list[int]]] = []
    for i, prompt in enumerate(prompts):
        ids = [] if prompt.is_empty else prompt_token_ids(prompt, tokenizer)
        reason = _skip_reason(prompt, ids, config, ctx_limit)
        if reason is None:
            todo.append((i, prompt, ids))
            continue
        out[i] = [
            _Run(row=PromptResult(prompt.id, prompt.category, status="skipped", skip_reason=reason, prompt_tokens=len(ids)))
            for _ in drafters
        ]
        done += 1
        if progress is not None:
            progress(done, n, [r.row for r in out[i]])
    pad = pad_token_id(tokenizer)
    B = config.batch_size
    for g in range(0, len(todo), B):
        group = todo[g : g + B]
        runs = _run_group([(p, ids) for _, p, ids in group], target, drafters, config, eos, t_timer, pad)
        for (i, _, _), r in zip(group, runs):
            out[i] = r
            done += 1
            if progress is not None:
                progress(done, n, [x.row for x in r])
    assert all(r is not None for r in out)
    return out  # type: ignore[return-value]


def _run_group(
    group: list[tuple[HeldoutPrompt, list[int]]],
    target: torch.nn.Module,
    drafters: list[_DrafterCtx],
    config: ValidationConfig,
    eos: Any,
    t_timer: _PassTimer,
    pad: int,
) -> list[list[_Run]]:
    """One group: batched target-only, batched speculative per drafter, then per-prompt teacher forcing."""
    device = model_device(target)
    ids_list = [ids for _, ids in group]
    input_ids, mask = left_pad(ids_list, pad, device)
    gseed = _prompt_seed(config.seed, group[0][0].id)  # one generator per group (see ValidationConfig)
    kw = dict(max_new_tokens=config.max_new_tokens, sampling=config.sampling, eos_token_id=eos)

    t_timer.new_generation()
    before = (t_timer.decode_seconds, t_timer.decode_passes)
    ref, t_ref = _timed(
        lambda: autoregressive_generate(target, input_ids, mask, generator=_gen(gseed, device), **kw), device
    )
    step_s, step_n = t_timer.decode_seconds - before[0], t_timer.decode_passes - before[1]
    ref_tokens = [r.token_ids for r in _rows(ref)]
    w_ref = token_shares([len(t) for t in ref_tokens])

    per_drafter: list[list[_Run]] = []
    specs: list[tuple[list[Any], list[float], float]] = []
    for d in drafters:
        t_timer.new_generation()
        d.timer.new_generation()
        before = (t_timer.decode_seconds, t_timer.decode_passes, d.timer.decode_seconds, d.timer.decode_passes)
        spec, t_spec = _timed(
            lambda: speculative_generate(
                target, d.obj, input_ids, mask, num_draft_tokens=config.num_draft_tokens,
                generator=_gen(gseed + 1, device), **kw,
            ),
            device,
        )
        rows = _rows(spec)
        w = token_shares([len(r.token_ids) for r in rows])
        tp_s, tp_n = t_timer.decode_seconds - before[0], t_timer.decode_passes - before[1]
        if d.model is not None:
            dp_s, dp_n = d.timer.decode_seconds - before[2], d.timer.decode_passes - before[3]
        else:  # n-gram: one (batched) lookup per target pass, timed by the core as draft_seconds
            dp_s, dp_n = spec.stats.draft_seconds, max(r.stats.target_forward_passes for r in rows)
        pooled_t, pooled_d = spec.stats.target_seconds, spec.stats.draft_seconds
        runs = []
        for b, (prompt, ids) in enumerate(group):
            run = _Run(row=PromptResult(prompt_id=prompt.id, category=prompt.category, prompt_tokens=len(ids)))
            run.target_pass_s, run.target_passes = tp_s * w[b], tp_n * w[b]
            run.draft_pass_s, run.draft_passes = dp_s * w[b], dp_n * w[b]
            run.target_step_s, run.target_steps = step_s * w_ref[b], step_n * w_ref[b]
            s = rows[b].stats
            s.target_seconds, s.draft_seconds = pooled_t * w[b], pooled_d * w[b]  # shares of the batch wall
            runs.append(run)
        per_drafter.append(runs)
        specs.append((rows, w, t_spec))

    from specdec.machine import load_average

    load = load_average()
    # per prompt: the target's teacher-forced pass once, then each drafter's agreement and audit
    for b, (_, ids) in enumerate(group):
        tf = _target_tf(target, ids, ref_tokens[b], config.sampling) if ref_tokens[b] else None
        for d, runs, (rows, w, t_spec) in zip(drafters, per_drafter, specs):
            _fill_run(runs[b], rows[b].token_ids, rows[b].stats, ref_tokens[b], t_ref * w_ref[b], t_spec * w[b], tf, d, config)
            runs[b].row.load_avg_1m = load
    return [[runs[b] for runs in per_drafter] for b in range(len(group))]


def warmup_batched(
    target: torch.nn.Module, drafters: list[Any], subset: HeldoutSet, tokenizer: Any, config: ValidationConfig,
    eos: Any, ctx_limit: int | None,
) -> None:
    """One short untimed batched generation of each kind (the batched kernels and masks), not recorded.

    Uses up to ``config.batch_size`` of the shortest prompts among the first ``max(8, batch_size)``;
    does nothing when fewer than two fit.
    """
    cands = []
    for p in subset.prompts[: max(8, config.batch_size)]:
        ids = [] if p.is_empty else prompt_token_ids(p, tokenizer)
        if ids and (ctx_limit is None or len(ids) + 4 <= ctx_limit):
            cands.append(ids)
    pick = sorted(cands, key=len)[: config.batch_size]
    if len(pick) < 2:
        return
    x, mask = left_pad(pick, pad_token_id(tokenizer), model_device(target))
    n = min(4, config.max_new_tokens)
    autoregressive_generate(target, x, mask, max_new_tokens=n, sampling=config.sampling, eos_token_id=eos)
    for d in drafters:
        speculative_generate(
            target, d, x, mask, num_draft_tokens=config.num_draft_tokens, max_new_tokens=n,
            sampling=config.sampling, eos_token_id=eos,
        )
