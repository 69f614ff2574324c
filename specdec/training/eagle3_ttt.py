"""The EAGLE-3 training-time test (TTT) unroll over whole sequences, and its loss.

EAGLE-3 (Li et al., 2025, arXiv 2503.01840) trains the head on its own hidden states: step 0 feeds
``combine(aux hidden states of x_i)`` with the embedding of ``x_{i+1}``; step ``s > 0`` feeds the
head's own step ``s-1`` state at the same position with the embedding of ``x_{i+1+s}`` (teacher-forced
tokens, as ``speculators`` 0.9.0 ``Eagle3DraftModel.forward`` does). At step ``s`` a query attends to
the step-0 keys at positions ``<= i`` (causal) and to its own position's keys of steps ``1..s``
(:func:`ttt_mask`): what a drafting head sees when it drafts ``s`` tokens beyond the verified prefix.
RoPE positions are ``i + s`` (the drafter's; speculators' are shifted by one, RoPE sees differences).

Everything but the mask and the loss is the head's own code
(:class:`specdec.models.eagle3.head.Eagle3Head`: ``combine``, ``embed_tokens``, ``rotary_emb``,
``layers``, ``norm``, ``lm_head``), so training and drafting compute the same function.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specdec.models.eagle3.head import ttt_attention_mask


def ttt_mask(batch: int, length: int, step: int, device=None) -> torch.Tensor:
    """Bool ``[batch, length, (step + 1) * length]`` (True = attend) for the queries of TTT step ``step``.

    Columns ``[0, length)`` are the step-0 keys (causal); block ``j`` (``1..step``) holds step ``j``'s keys,
    of which query ``i`` sees only column ``i`` (its own position's earlier drafts).
    """
    return ttt_attention_mask(length, step, device=device)[None].expand(batch, -1, -1)


@dataclass
class TTTResult:
    """What :func:`ttt_unroll` returns.

    Attributes:
        loss: scalar tensor (with grad): ``sum_s decay**s * mean KL(target || head)`` over valid positions.
        step_loss: per-step mean KL (floats); step_correct / step_total: per step, how many valid positions
            have the head's argmax equal to the target's argmax; chain_correct: how many were right at this
            step *and* all earlier steps from the same position (greedy acceptance under teacher forcing).
    """

    loss: torch.Tensor
    step_loss: list[float]
    step_correct: list[int]
    step_total: list[int]
    chain_correct: list[int]


def ttt_states(head, input_ids: torch.Tensor, aux: torch.Tensor, steps: int, start: int = 0):
    """Yield ``(s, normed)`` for each TTT step ``s``: the head's final-norm output ``[B, T, hidden]`` at every
    position (its logits are ``head.lm_head(normed)``); position ``i`` of step ``s`` drafts token ``i + 2 + s``.

    ``start``: steps ``s >= 1`` are computed for positions ``>= start`` only (their rows before ``start``
    are zeros). A step-``s`` query reads the step-0 keys and its own position's earlier steps, so the
    rows from ``start`` on are exactly those of the full unroll; :func:`ttt_unroll` passes the first
    position any loss needs (the prompts' step ``s >= 1`` drafts are never trained on).
    """
    b, t = input_ids.shape
    dev = aux.device
    start = max(0, min(int(start), t - 1))
    hidden = head.combine(aux)
    cache = head.new_cache(b)
    pos = torch.arange(t, device=dev)[None].expand(b, t)
    for s in range(steps):
        lo = 0 if s == 0 else start
        fed = torch.cat([input_ids[:, 1 + s:], input_ids.new_zeros(b, min(1 + s, t))], dim=1)[:, lo:t]
        with torch.no_grad():
            embeds = head.embed_tokens(fed).to(hidden.dtype)
        h = hidden if s != 1 else hidden[:, lo:]
        rope = head.rotary_emb(h, pos[:, lo:] + s)
        mask = ttt_mask(b, t, s, dev) if lo == 0 else _suffix_mask(b, t, lo, s, dev)
        h = head.run_layers(h, embeds, rope, cache, mask)
        normed = head.norm(h)
        hidden = normed if head.config.norm_output else h
        yield s, normed if lo == 0 else torch.cat([normed.new_zeros(b, lo, normed.shape[-1]), normed], dim=1)


def _suffix_mask(batch: int, length: int, start: int, step: int, device=None) -> torch.Tensor:
    """:func:`ttt_mask` for the queries at positions ``>= start`` when steps ``1..step`` hold only those
    positions: ``[batch, length - start, length + step * (length - start)]``."""
    return ttt_attention_mask(length, step, start, device=device)[None].expand(batch, -1, -1)


def ttt_unroll(head, input_ids: torch.Tensor, aux: torch.Tensor, target_logits: torch.Tensor,
               loss_mask: torch.Tensor, steps: int = 3, *, decay: float = 1.0,
               target_in_draft: torch.Tensor | None = None) -> TTTResult:
    """Run the TTT unroll and its KL loss against the target's distributions over the draft vocabulary.

    Args:
        head: an :class:`~specdec.models.eagle3.head.Eagle3Head` (float32 for training).
        input_ids: int64 ``[B, T]``; aux: ``[B, T, n_aux * target_hidden]`` target aux hidden states.
        target_logits: ``[B, T, draft_vocab]``: the target's logits at each position restricted to the
            draft vocabulary (``t2d``), i.e. its distribution over the token after ``input_ids[:, t]``.
        loss_mask: bool ``[B, T]``: positions whose next token is trained on (responses, not padding).
        steps: TTT steps (tokens drafted per position); decay: weight ``decay**s`` of step ``s``.
        target_in_draft: optional bool ``[B, T]``: whether the target's argmax over its *full* vocabulary
            is in the draft vocabulary; where it is not, the head counts as wrong (metrics only).
    Returns:
        :class:`TTTResult`.
    """
    b, t = input_ids.shape
    total = torch.zeros((), device=aux.device)
    res = TTTResult(total, [], [], [], [])
    chain = torch.ones(b, t, dtype=torch.bool, device=aux.device)
    first = loss_mask.float().argmax(dim=1)[loss_mask.any(dim=1)]
    start = int(first.min()) - steps if first.numel() else 0
    for s, normed in ttt_states(head, input_ids, aux, steps, start=start):
        total = total + (decay ** s) * _step_metrics(res, s, head.lm_head, normed, target_logits, loss_mask, chain=chain,
                                                     in_draft=target_in_draft)
    res.loss = total
    return res


def _step_metrics(res: TTTResult, s: int, lm_head, normed, target_logits, loss_mask, *, chain,
                  in_draft=None) -> torch.Tensor:
    """Mean KL of step ``s`` (position ``i`` predicts the target's distribution at ``i + 1 + s``); the
    LM head runs on the valid positions only. Appends the step's numbers to ``res``; updates ``chain``."""
    b, t, _ = normed.shape
    n = t - 1 - s
    valid = loss_mask[:, 1 + s:1 + s + n] if n > 0 else loss_mask[:, :0]
    if n <= 0 or not bool(valid.any()):
        for lst in (res.step_correct, res.step_total, res.chain_correct):
            lst.append(0)
        res.step_loss.append(0.0)
        chain[:] = False
        return normed.sum() * 0.0
    lq = F.log_softmax(lm_head(normed[:, :n][valid]).float(), dim=-1)
    lp = F.log_softmax(target_logits[:, 1 + s:1 + s + n][valid].float(), dim=-1)
    loss = (lp.exp() * (lp - lq)).sum(-1).mean()
    right = torch.zeros(b, n, dtype=torch.bool, device=normed.device)
    right[valid] = lq.argmax(-1) == lp.argmax(-1)
    if in_draft is not None:
        right &= in_draft[:, 1 + s:1 + s + n]
    chain[:, :n] &= right
    chain[:, n:] = False
    res.step_loss.append(float(loss.detach()))
    res.step_correct.append(int(right.sum()))
    res.step_total.append(int(valid.sum()))
    res.chain_correct.append(int(chain[:, :n].sum()))
    return loss
