"""Batched decoding (B > 1): target-only and speculative, with per-row acceptance.

Rows accept different numbers of drafts at each step, so their sequences drift apart. Instead of
re-padding and recomputing, every KV cache here keeps one column per fed token and a 2-D
validity mask ``[B, columns]``: a rejected draft's column is masked out (a *hole*) rather than
cut, and the next block is appended after it. Positions (RoPE) are counted from valid columns
only, so each row sees exactly the sequence it would see alone. Columns that are invalid in every
row are cropped from the end after each step, so the cache grows by at most ``max_b n_b + 1``
columns per step. Finished rows (EOS or ``max_new_tokens``) are dropped from the batch
(``Cache.batch_select_indices``).

The probability math is :func:`specdec.sampling.verify_batch` (Leviathan Alg. 1 per row);
nothing here decides acceptance.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specdec.drafters import (
    ModelDrafter,
    NgramDrafter,
    check_draft_embeds,
    fit_vocab,
    model_device,
    model_kwargs,
    new_cache,
    now,
)
from specdec.sampling import SamplingConfig, logits_to_probs, sample_rows, verify_batch
from specdec.stats import DecodingStats


@dataclass
class BatchGenerationResult:
    """What a batched generation produced.

    Attributes:
        rows: one :class:`~specdec.decoding.GenerationResult` per input row, in input order.
            A row's ``stats`` count its own tokens, drafts and acceptances (equal to its B = 1
            run's under greedy decoding); its ``*_forward_passes`` count the batched passes it
            took part in (a row drafts as many tokens as the batch's longest proposal), and its
            ``*_seconds`` are the wall seconds of those passes (shared with the other rows).
        stats: pooled counters over all rows (so pass counters are row-passes, summed over
            rows); ``target_seconds`` / ``draft_seconds`` are the batch's wall seconds (not the
            sum over rows), so ``num_emitted_tokens`` divided by their sum is the batch
            throughput in tokens/s.
        target_calls / draft_calls: batched model calls actually made (prefill included).
    """

    rows: list = field(default_factory=list)
    stats: DecodingStats = field(default_factory=DecodingStats)
    target_calls: int = 0
    draft_calls: int = 0

    @property
    def token_ids(self) -> list[list[int]]:
        """The new tokens of each row (``list[list[int]]``)."""
        return [r.token_ids for r in self.rows]


def check_batch_inputs(target, input_ids, attention_mask, max_new_tokens) -> torch.Tensor:
    """Validate a left-padded batch; returns the attention mask as a BoolTensor ``[B, L]``.

    Args:
        target: the target model (its ``config.max_position_embeddings`` bounds the length), or
            an object whose ``config`` is None (no bound).
        input_ids: integer tensor ``[B, L]``, B >= 1, L >= 1.
        attention_mask: ``[B, L]`` of 0/1 (bool, int or float) with left padding, or None.
        max_new_tokens: int >= 0.
    Raises:
        ValueError: wrong shapes or dtypes, mask values other than 0/1, right padding, an empty
            row, a negative ``max_new_tokens``, or a row + ``max_new_tokens`` longer than the
            target's context.
    """
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[0] < 1:
        shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise ValueError(f"input_ids must be an integer tensor of shape [batch >= 1, prompt_len], got {shape}")
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
        raise ValueError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
    if input_ids.shape[1] == 0:
        raise ValueError("empty prompt: input_ids must hold at least one token")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if attention_mask is None:
        mask = torch.ones(input_ids.shape, dtype=torch.bool, device=input_ids.device)
    else:
        attention_mask = torch.as_tensor(attention_mask, device=input_ids.device)
        if attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask shape {tuple(attention_mask.shape)} != input_ids shape {tuple(input_ids.shape)}"
            )
        if not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
            raise ValueError("attention_mask must hold only 0 (padding) and 1 (token)")
        mask = attention_mask.to(torch.bool)
    lengths = mask.sum(dim=1)
    if bool((lengths == 0).any()):
        raise ValueError("empty prompt: every row of attention_mask needs at least one 1")
    # left padding: each row is 0…0 1…1
    expected = torch.arange(mask.shape[1], device=mask.device)[None, :] >= (mask.shape[1] - lengths)[:, None]
    if not bool((expected == mask).all()):
        raise ValueError("attention_mask must use left padding (each row 0…0 1…1); pad with padding_side='left'")
    config = getattr(target, "config", None)
    limit = getattr(config, "max_position_embeddings", None)
    if limit is not None and int(lengths.max()) + max_new_tokens > limit:
        raise ValueError(
            f"a prompt of {int(lengths.max())} tokens + max_new_tokens={max_new_tokens} exceeds the "
            f"target's context of {limit} tokens"
        )
    return mask


def sliding_window(model) -> int | None:
    """The attention window (tokens) of a sliding-window model (Mistral, Gemma 2/3, ...), else None."""
    cfg = getattr(model, "config", None)
    window = getattr(cfg, "sliding_window", None)
    if not window or getattr(cfg, "use_sliding_window", True) is False:
        return None
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types and not any("sliding" in str(t) for t in layer_types):
        return None
    return int(window)


def check_no_sliding_window(models, batched: bool, max_columns: int) -> None:
    """Refuse sliding-window models where the window could be reached.

    A sliding window counts cache columns. The batched cache keeps masked-out columns (left
    padding, rejected drafts), so a row would see less context than alone; and transformers'
    ``DynamicCache.crop`` (the B = 1 rollback) fails once a sliding layer is full.

    Raises:
        ValueError: if a model has a window smaller than ``max_columns`` (batched: any window).
    """
    for m in models:
        window = sliding_window(m)
        if window is not None and (batched or max_columns > window):
            raise ValueError(
                f"{type(m).__name__} uses sliding-window attention (window {window} tokens), which "
                + ("batched decoding does not support (masked cache columns would count against the window)"
                   if batched else f"speculative decoding does not support beyond the window "
                   f"(prompt + max_new_tokens + k = {max_columns} tokens)")
            )


class MaskedKV:
    """A KV cache plus a per-row validity mask over its columns (see module docstring).

    Args:
        model: the transformers causal LM this cache belongs to.
        batch_size: rows.
    """

    def __init__(self, model, batch_size: int) -> None:
        self.model = model
        self.device = model_device(model)
        self.cache = new_cache(model)
        self.mask = torch.zeros(batch_size, 0, dtype=torch.bool, device=self.device)
        self.num_valid = torch.zeros(batch_size, dtype=torch.long, device=self.device)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, valid: torch.Tensor, logits_to_keep: int | None = None) -> torch.Tensor:
        """Append a block and run the model over it.

        Args:
            ids: LongTensor ``[B, m]``; ids in invalid slots are ignored (masked for every query).
            valid: BoolTensor ``[B, m]``; a row's valid slots get consecutive positions.
            logits_to_keep: logits only for the last this-many slots (None = all ``m``).
        Returns:
            logits ``[B, n, V]`` for the last ``n`` slots (rows of invalid slots are meaningless).
        """
        self.mask = torch.cat([self.mask, valid], dim=1)
        positions = (self.num_valid[:, None] + valid.long().cumsum(dim=1) - 1).clamp_min(0)
        out = self.model(
            input_ids=ids, attention_mask=self.mask.long(), position_ids=positions,
            **model_kwargs(self.model, self.cache, logits_to_keep),
        )
        self.num_valid = self.num_valid + valid.sum(dim=1)
        return out.logits if logits_to_keep is None else out.logits[:, -logits_to_keep:]

    @torch.inference_mode()
    def invalidate_tail(self, keep: torch.Tensor, width: int) -> None:
        """Within the last ``width`` columns, keep only the first ``keep[b]`` valid ones per row.

        Used for rollback: rejected drafts are at the end of each row's block. Columns that are
        invalid in every row are then cropped from the cache.
        """
        if width <= 0:
            return
        tail = self.mask[:, -width:]
        rank = tail.long().cumsum(dim=1)
        new_tail = tail & (rank <= keep[:, None])
        self.num_valid = self.num_valid - (tail.sum(dim=1) - new_tail.sum(dim=1))
        self.mask[:, -width:] = new_tail
        used = self.mask.any(dim=0).nonzero()
        keep_cols = int(used.max()) + 1 if used.numel() else 0
        remove = self.mask.shape[1] - keep_cols
        if remove > 0:
            self.cache.crop(-remove)
            self.mask = self.mask[:, :keep_cols]

    @torch.inference_mode()
    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (LongTensor of row indices) in the cache and mask."""
        self.cache.batch_select_indices(rows)
        self.mask = self.mask[rows]
        self.num_valid = self.num_valid[rows]


def left_pad(seqs: list[list[int]], device, pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad id lists into ``(ids LongTensor [B, W], valid BoolTensor [B, W])``, W = longest.

    Padding slots hold ``pad_id`` and are False in ``valid``; an empty list is all padding.
    """
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long, device=device)
    valid = torch.zeros(len(seqs), width, dtype=torch.bool, device=device)
    for b, s in enumerate(seqs):
        if s:
            ids[b, width - len(s) :] = torch.tensor(s, dtype=torch.long, device=device)
            valid[b, width - len(s) :] = True
    return ids, valid


class BatchModelDrafter:
    """A draft causal LM drafting for every row at once, with a :class:`MaskedKV` cache.

    Each row's ``pending`` tokens (the prompt at first, then the recovered/bonus token, plus the
    last draft after a fully accepted block) are fed left-padded, then k tokens are drafted with
    one batched forward pass each.
    """

    def __init__(self, model, batch_size: int) -> None:
        self.model = model
        self.kv = MaskedKV(model, batch_size)
        self.embed_rows = model.get_input_embeddings().weight.shape[0]
        self.forward_passes = 0
        self._fed_drafts = 0

    def propose(self, pending: list[list[int]], k: int, limits: list[int], sampling, vocab_size, generator, stop):
        """Draft ``k`` tokens per row; row b's proposal counts only its first ``limits[b]``.

        Returns ``(tokens [B, k], q [B, k, V], num_drafts [B])``; a row's proposal also ends
        after a drafted stop token.

        Raises:
            ValueError: a pending id the draft cannot embed (:func:`check_draft_embeds`).
        """
        check_draft_embeds(self.embed_rows, [t for row in pending for t in row])
        ids, valid = left_pad(pending, self.kv.device)
        tokens, qs = [], []
        for j in range(k):
            logits = self.kv.forward(ids, valid, logits_to_keep=1)[:, -1]
            self.forward_passes += 1
            q = logits_to_probs(fit_vocab(logits, vocab_size), sampling)
            x = sample_rows(q, generator)
            tokens.append(x)
            qs.append(q)
            ids, valid = x[:, None], torch.ones(len(pending), 1, dtype=torch.bool, device=self.kv.device)
        self._fed_drafts = max(k - 1, 0)
        device = self.kv.device
        toks = torch.stack(tokens, dim=1) if tokens else torch.zeros(len(pending), 0, dtype=torch.long, device=device)
        q = torch.stack(qs, dim=1) if qs else torch.zeros(len(pending), 0, vocab_size, device=device)
        return toks, q, _limit_at_stop(toks, torch.tensor(limits, device=device), stop)

    def rollback(self, num_accepted: torch.Tensor) -> None:
        """Drop the drafts after each row's accepted prefix from the cache."""
        self.kv.invalidate_tail(num_accepted, self._fed_drafts)

    def select(self, rows: torch.Tensor) -> None:
        self.kv.select(rows)


_IDS_ONLY = SamplingConfig()  # greedy: NgramDrafter.propose returns ids without building q


class BatchNgramDrafter:
    """Prompt lookup (:class:`~specdec.drafters.NgramDrafter`) for every row; one-hot ``q``."""

    def __init__(self, ngram: NgramDrafter) -> None:
        self.ngram = ngram
        self.forward_passes = 0

    def propose_rows(self, contexts, limits, vocab_size, stop, device):
        """Each row's lookup proposal (:meth:`NgramDrafter.propose`), padded to ``[B, k]``.

        Returns ``(tokens [B, k], q [B, k, V] one-hot on proposed slots, num_drafts [B])``.
        """
        props = [self.ngram.propose(ctx, lim, _IDS_ONLY, vocab_size, None, stop)[0] for ctx, lim in zip(contexts, limits)]
        k = max((len(t) for t in props), default=0)
        ids = torch.zeros(len(props), k, dtype=torch.long, device=device)
        for b, t in enumerate(props):
            if t:
                ids[b, : len(t)] = torch.tensor(t, dtype=torch.long, device=device)
        q = torch.zeros(len(props), k, vocab_size, device=device)
        n = torch.tensor([len(t) for t in props], dtype=torch.long, device=device)
        drafted = torch.arange(k, device=device)[None, :] < n[:, None]
        q.scatter_(2, ids[..., None], drafted[..., None].float())
        return ids, q, n

    def rollback(self, num_accepted) -> None:
        pass

    def select(self, rows) -> None:
        pass


def _limit_at_stop(tokens: torch.Tensor, limits: torch.Tensor, stop: frozenset[int]) -> torch.Tensor:
    """Per-row draft count: ``limits[b]``, cut right after the first drafted stop token."""
    n = limits.clamp(max=tokens.shape[1])
    if stop and tokens.shape[1]:
        is_stop = torch.isin(tokens, torch.tensor(sorted(stop), device=tokens.device))
        first = torch.where(is_stop.any(dim=1), is_stop.long().argmax(dim=1) + 1, tokens.shape[1])
        n = torch.minimum(n, first)
    return n


def _as_batch_drafter(drafter, batch_size: int):
    if isinstance(drafter, NgramDrafter):
        return BatchNgramDrafter(drafter)
    if isinstance(drafter, ModelDrafter):
        return BatchModelDrafter(drafter.model, batch_size)
    if isinstance(drafter, torch.nn.Module) and hasattr(drafter, "config"):
        return BatchModelDrafter(drafter, batch_size)
    raise TypeError(
        f"batched decoding supports a draft causal LM, ModelDrafter or NgramDrafter, got {type(drafter).__name__}"
    )


def _new_rows(batch_size: int, k: int):
    from specdec.decoding import GenerationResult

    return [GenerationResult(stats=DecodingStats(num_draft_tokens_k=k)) for _ in range(batch_size)]


def _pool(rows, k: int, target_seconds: float, draft_seconds: float) -> DecodingStats:
    pooled = DecodingStats(num_draft_tokens_k=k)
    for r in rows:
        pooled = pooled.merge(r.stats)
    pooled.target_seconds, pooled.draft_seconds = target_seconds, draft_seconds
    return pooled


@torch.inference_mode()
def autoregressive_generate_batch(
    target, input_ids, attention_mask=None, *, max_new_tokens, sampling: SamplingConfig,
    eos_token_id=None, generator=None,
) -> BatchGenerationResult:
    """Target-only decoding of a left-padded batch; each row as :func:`autoregressive_generate`.

    Args:
        target: transformers causal LM.
        input_ids: LongTensor ``[B, L]``, left-padded.
        attention_mask: ``[B, L]`` (1 = token, 0 = left padding) or None (no padding).
        max_new_tokens, sampling, eos_token_id, generator: as :func:`autoregressive_generate`.
    Returns:
        :class:`BatchGenerationResult`.
    Raises:
        ValueError: see :func:`check_batch_inputs`.
    """
    from specdec.decoding import _stop_ids

    mask = check_batch_inputs(target, input_ids, attention_mask, max_new_tokens)
    check_no_sliding_window([target], batched=True, max_columns=0)
    input_ids = input_ids.long().masked_fill(~mask, 0)  # padding ids may lie outside the vocabulary
    stop = _stop_ids(eos_token_id)
    device = model_device(target)
    rows = _new_rows(input_ids.shape[0], 0)
    active = list(range(len(rows)))
    kv = MaskedKV(target, len(rows))
    ids, valid = input_ids.to(device), mask.to(device)
    wall, calls = 0.0, 0
    while active and max_new_tokens > 0:
        t0 = now(device)
        logits = kv.forward(ids, valid, logits_to_keep=1)[:, -1]
        tokens = sample_rows(logits_to_probs(logits, sampling), generator).tolist()
        dt = now(device) - t0
        wall += dt
        calls += 1
        keep = []
        for i, b in enumerate(active):
            r = rows[b]
            r.stats.target_forward_passes += 1
            r.stats.target_seconds += dt
            r.token_ids.append(tokens[i])
            if tokens[i] in stop:
                r.finish_reason = "eos"
            elif len(r.token_ids) < max_new_tokens:
                keep.append(i)
        if len(keep) < len(active):
            sel = torch.tensor(keep, dtype=torch.long, device=device)
            kv.select(sel)
            tokens = [tokens[i] for i in keep]
            active = [active[i] for i in keep]
        ids = torch.tensor(tokens, dtype=torch.long, device=device)[:, None]
        valid = torch.ones(len(active), 1, dtype=torch.bool, device=device)
    for r in rows:
        r.stats.num_emitted_tokens = len(r.token_ids)
    return BatchGenerationResult(rows=rows, stats=_pool(rows, 0, wall, 0.0), target_calls=calls)


@torch.inference_mode()
def speculative_generate_batch(
    target, drafter, input_ids, attention_mask=None, *, num_draft_tokens, max_new_tokens,
    sampling: SamplingConfig, eos_token_id=None, generator=None,
) -> BatchGenerationResult:
    """Exact speculative decoding of a left-padded batch (Leviathan et al. 2022, Alg. 1 per row).

    Every step drafts up to k tokens for all active rows, scores all rows' blocks in one target
    forward pass ``[B, k + 1]`` (the first pass is the prefill), and verifies each row with
    :func:`~specdec.sampling.verify_batch`. Rows accept different numbers of tokens; their caches
    stay consistent through the validity mask (:class:`MaskedKV`). Each row's output is
    distributed as its own B = 1 target-only output; greedy rows are token-identical to it (up to
    float rounding differences between batched and single-row kernels).

    Args:
        target: transformers causal LM.
        drafter: draft causal LM, :class:`~specdec.drafters.ModelDrafter` (its model is used) or
            :class:`~specdec.drafters.NgramDrafter`.
        input_ids: LongTensor ``[B, L]``, left-padded.
        attention_mask: ``[B, L]`` (1 = token, 0 = left padding) or None.
        num_draft_tokens: k >= 1. Row b drafts ``min(k, max_new_tokens − emitted_b − 1)``.
        max_new_tokens, sampling, eos_token_id, generator: as :func:`speculative_generate`.
    Returns:
        :class:`BatchGenerationResult`: per-row results and stats (vLLM counters), pooled stats.
    Raises:
        ValueError: bad shapes or padding (:func:`check_batch_inputs`), ``num_draft_tokens < 1``.
        TypeError: unsupported drafter.
    """
    from specdec.decoding import _stop_ids

    if isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, int) or num_draft_tokens < 1:
        raise ValueError(f"num_draft_tokens must be an int >= 1, got {num_draft_tokens!r}")
    mask = check_batch_inputs(target, input_ids, attention_mask, max_new_tokens)
    input_ids = input_ids.long().masked_fill(~mask, 0)  # padding ids may lie outside the vocabulary
    stop = _stop_ids(eos_token_id)
    device = model_device(target)
    k = num_draft_tokens
    vocab_size = target.get_output_embeddings().weight.shape[0]
    B = input_ids.shape[0]
    rows = _new_rows(B, k)
    contexts = [input_ids[b][mask[b]].tolist() for b in range(B)]
    active = list(range(B))
    tkv = MaskedKV(target, B)
    dr = _as_batch_drafter(drafter, B)
    check_no_sliding_window([target] + ([dr.model] if isinstance(dr, BatchModelDrafter) else []), True, 0)
    t_ids, t_valid = input_ids.to(device), mask.to(device)  # tokens not yet in the target cache
    d_pending = {b: list(c) for b, c in enumerate(contexts)}  # tokens not yet in the draft cache
    t_wall = d_wall = 0.0
    t_calls = 0
    while active and max_new_tokens > 0:
        limits = [min(k, max_new_tokens - len(rows[b].token_ids) - 1) for b in active]
        t0 = now(device)
        if isinstance(dr, BatchNgramDrafter):
            drafts, q, ndraft = dr.propose_rows([contexts[b] for b in active], limits, vocab_size, stop, device)
        else:
            kb = max(limits)
            drafts, q, ndraft = dr.propose([d_pending[b] for b in active], kb, limits, sampling, vocab_size, generator, stop)
        t1 = now(device)
        kb = drafts.shape[1]
        width = t_ids.shape[1]
        block = torch.cat([t_ids, drafts], dim=1)
        block_valid = torch.cat([t_valid, torch.arange(kb, device=device)[None, :] < ndraft[:, None]], dim=1)
        logits = tkv.forward(block, block_valid, logits_to_keep=kb + 1)
        p = logits_to_probs(logits, sampling)
        out = verify_batch(drafts, ndraft, p, q.to(p.device), generator, stop)
        tkv.invalidate_tail(out.num_accepted + 1, kb + 1)  # keep the last pending token + accepted drafts
        dr.rollback(out.num_accepted)
        t2 = now(device)
        t_wall += t2 - t1
        t_calls += 1
        d_wall += t1 - t0

        n_acc, nxt, nd = out.num_accepted.tolist(), out.next_token.tolist(), ndraft.tolist()
        draft_rows = drafts.tolist()
        keep, next_pending = [], []
        for i, b in enumerate(active):
            r, s = rows[b], rows[b].stats
            s.target_forward_passes += 1
            s.target_seconds += t2 - t1
            s.draft_seconds += t1 - t0
            if not isinstance(dr, BatchNgramDrafter):
                s.draft_forward_passes += kb
            if nd[i]:
                s.num_drafts += 1
                s.num_draft_tokens += nd[i]
                s.num_accepted_tokens += n_acc[i]
                if n_acc[i] < nd[i] and nxt[i] >= 0:  # ended at a rejected draft
                    s.num_rejected_steps += 1
                for j in range(nd[i]):
                    s.drafted_per_position[j] += 1
                for j in range(n_acc[i]):
                    s.accepted_per_position[j] += 1
            emitted = draft_rows[i][: n_acc[i]] + ([nxt[i]] if nxt[i] >= 0 else [])
            r.token_ids.extend(emitted)
            contexts[b].extend(emitted)
            if emitted and emitted[-1] in stop:
                r.finish_reason = "eos"
            elif len(r.token_ids) < max_new_tokens:
                keep.append(i)
                # the draft cache lacks the last draft of a fully accepted block
                tail = [draft_rows[i][kb - 1]] if kb and n_acc[i] == kb else []
                d_pending[b] = tail + [nxt[i]]
                next_pending.append(nxt[i])
        if len(keep) < len(active):
            sel = torch.tensor(keep, dtype=torch.long, device=device)
            tkv.select(sel)
            dr.select(sel)
            active = [active[i] for i in keep]
        t_ids = torch.tensor(next_pending, dtype=torch.long, device=device)[:, None]
        t_valid = torch.ones(len(active), 1, dtype=torch.bool, device=device)
    for r in rows:
        r.stats.num_emitted_tokens = len(r.token_ids)
    return BatchGenerationResult(rows=rows, stats=_pool(rows, k, t_wall, d_wall), target_calls=t_calls,
                                 draft_calls=dr.forward_passes)
