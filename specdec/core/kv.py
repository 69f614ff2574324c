"""KV-cache and forward-pass helpers shared by the decoding loops and the drafters.

* B = 1: a transformers ``DynamicCache`` cropped back to the verified prefix (:func:`crop_cache`). Its
  layers are preallocated (:func:`new_cache`): appending a block writes it in place and a crop only
  moves the end, where transformers' layer copies the whole cache on every pass.
* B > 1: :class:`MaskedKV`, a cache plus a per-row validity mask over its columns. Rows accept
  different numbers of drafts at each step, so their sequences drift apart. Instead of
  re-padding and recomputing, a rejected draft's column is masked out (a *hole*) rather than cut,
  and the next block is appended after it. Positions (RoPE) are counted from valid columns only,
  so each row sees exactly the sequence it would see alone. Columns that are invalid in every row
  are cropped from the end after each step; finished rows are dropped
  (``Cache.batch_select_indices``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import torch

from specdec.core.attention import NATIVE_GQA, wants_native_gqa
from specdec.core.finite import DeferredChecks, check_logits
from specdec.core.static import StaticKV, new_static_cache

T = TypeVar("T")


def new_cache(model, *, static: bool = False, need: int | None = None):
    """A fresh KV cache for ``model`` that supports ``crop``: with ``static`` and static passes selected for
    ``model`` (:func:`specdec.core.static.use_passes`), its :class:`~specdec.core.static.StaticKV` (when
    ``need`` positions, None = unknown, fit); else a transformers ``DynamicCache`` whose full-attention
    layers are :class:`GrowingLayer`s (preallocated; appending and cropping copy nothing)."""
    if static:
        cache = new_static_cache(model, need)
        if cache is not None:
            return cache
    from transformers import DynamicCache

    try:
        cache = DynamicCache(config=model.config)
    except TypeError:  # older transformers
        cache = DynamicCache()
    growing = growing_layer_class()
    if growing is None:
        return cache
    plain = growing.__mro__[2]  # GrowingLayer, _GrowingBuffers, DynamicLayer
    cache.layers = [growing() if type(layer) is plain else layer for layer in cache.layers]
    if getattr(cache, "layer_class_to_replicate", None) is plain:
        cache.layer_class_to_replicate = growing
    return cache


_GROWING: list = []


def growing_layer_class():
    """:class:`GrowingLayer` built on this transformers' ``DynamicLayer`` (None where it has none: 4.x)."""
    if not _GROWING:
        try:
            from transformers.cache_utils import DynamicLayer
        except ImportError:  # transformers 4.x: plain DynamicCache
            _GROWING.append(None)
        else:
            _GROWING.append(_growing_layer(DynamicLayer))
    return _GROWING[0]


#: spare positions a :class:`GrowingLayer` allocates beyond what it holds: at least this many, or half
GROW_MIN_SPARE = 256


class _GrowingBuffers:
    """The methods of :func:`growing_layer_class`'s ``GrowingLayer`` (mixed into transformers' ``DynamicLayer``,
    imported lazily): keys/values in a preallocated buffer ``[B, H, capacity, D]``.

    ``DynamicLayer.update`` concatenates: every pass copies the whole cache (at 1,000 cached positions
    that is ~50 MB per target pass of SmolLM2-135M), and every crop leaves a view that the next update
    copies again. Here an update writes the new positions in place (the buffer grows by half, at least
    :data:`GROW_MIN_SPARE` positions, when full) and a crop only moves the end. ``keys``/``values`` are
    views ``[B, H, n, D]`` of the buffer: the same values the plain layer holds, and attention over them
    is bitwise the same (tests/core/test_kv_buffers.py; benchmarks/results/2026-12-02-step-profile-cpu.md).
    """

    _kbuf = _vbuf = None
    _n = 0

    def lazy_initialization(self, key_states, value_states) -> None:
        super().lazy_initialization(key_states, value_states)
        self._kbuf = self._vbuf = None
        self._n = 0

    def _reserve(self, key_states, value_states, need: int) -> None:
        if self._kbuf is not None and need <= self._kbuf.shape[-2] and self._kbuf.shape[:2] == key_states.shape[:2]:
            return
        cap = need + max(GROW_MIN_SPARE, need // 2)
        kb = key_states.new_empty((*key_states.shape[:-2], cap, key_states.shape[-1]))
        vb = value_states.new_empty((*value_states.shape[:-2], cap, value_states.shape[-1]))
        if self._n:
            kb[..., : self._n, :].copy_(self.keys)
            vb[..., : self._n, :].copy_(self.values)
        self._kbuf, self._vbuf = kb, vb

    def _view(self, n: int) -> None:
        self._n = n
        self.keys = self._kbuf[..., :n, :]
        self.values = self._vbuf[..., :n, :]

    def update(self, key_states, value_states, *args, **kwargs):
        """Append ``[B, H, m, D]`` keys/values in place; returns the views of all ``n + m`` positions."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, m = self._n, key_states.shape[-2]
        self._reserve(key_states, value_states, n + m)
        self._kbuf[..., n : n + m, :].copy_(key_states)
        self._vbuf[..., n : n + m, :].copy_(value_states)
        self._view(n + m)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._n if self.is_initialized else 0

    def reset(self) -> None:
        super().reset()
        self._kbuf = self._vbuf = None
        self._n = 0

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``-tokens_to_remove`` positions (a negative count, as transformers' layer)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count (tokens to remove), got {tokens_to_remove}")
        if tokens_to_remove and self.is_initialized and self._kbuf is not None:
            self._view(max(0, self._n + tokens_to_remove))

    def _rows(self, pick) -> None:
        if self.is_initialized and self._kbuf is not None:
            self._kbuf, self._vbuf = pick(self._kbuf), pick(self._vbuf)
            self._view(self._n)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._rows(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices) -> None:
        self._rows(lambda t: t[indices, ...])

    def reorder_cache(self, beam_idx) -> None:
        self._rows(lambda t: t.index_select(0, beam_idx.to(t.device)))


def _growing_layer(base: type) -> type:
    return type("GrowingLayer", (_GrowingBuffers, base), {"__doc__": _GrowingBuffers.__doc__})


def sync(device: torch.device) -> None:
    """Block until queued work on ``device`` is done, so wall-clock timings are honest."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":  # pragma: no cover
        torch.mps.synchronize()


def model_device(model) -> torch.device:
    """The device of ``model``'s first parameter."""
    return next(model.parameters()).device


def crop_cache(cache, keep: int) -> None:
    """Drop every cached position after the first ``keep`` (rollback of rejected drafts)."""
    remove = cache.get_seq_length() - keep
    if remove > 0:
        cache.crop(-remove)  # negative = "remove this many", in transformers 4.4x and 5.x alike


def cache_layer_tensors(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(keys, values)`` per layer of a ``DynamicCache``, each ``[batch, kv_heads, positions, head_dim]``
    (transformers 5.x ``cache.layers``; 4.x ``key_cache``/``value_cache``)."""
    if isinstance(cache, StaticKV):
        return cache.layer_tensors()
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [(layer.keys, layer.values) for layer in layers]
    return list(zip(cache.key_cache, cache.value_cache))


def copy_cache_prefix(source, model, positions: int, dtype: torch.dtype):
    """A new cache for ``model`` holding the first ``positions`` positions of ``source``, cast to
    ``dtype`` (the source is left untouched). Both models must share the KV layout (KV heads, head dim)
    of ``model``'s layers, which are ``source``'s first ones: e.g. a draft derived from the target by a
    dtype cast or quantization (every layer), or the target's first N layers (a layer-skip draft)."""
    out = new_cache(model, static=True)
    layers = cache_layer_tensors(source)[: getattr(model.config, "num_hidden_layers", None)]
    for i, (k, v) in enumerate(layers):
        out.update(k[:, :, :positions].to(dtype), v[:, :, :positions].to(dtype), i)
    return out


FORWARD_KWARGS_BY_CLASS: dict[type, tuple[str, bool]] = {}


def forward_kwargs(model) -> tuple[str, bool]:
    # transformers 5.x renamed `past_key_values` to `cache`; support both. `logits_to_keep`
    # (transformers >= 4.45) lets the LM head skip positions whose logits nobody reads.
    cls = type(model)
    if cls not in FORWARD_KWARGS_BY_CLASS:
        import inspect

        params = inspect.signature(model.forward).parameters
        FORWARD_KWARGS_BY_CLASS[cls] = ("cache" if "cache" in params else "past_key_values", "logits_to_keep" in params)
    return FORWARD_KWARGS_BY_CLASS[cls]


def model_kwargs(model, cache, logits_to_keep: int | None) -> dict:
    """Keyword arguments for ``model(...)``: the cache under its name, ``logits_to_keep`` (only the
    last ``logits_to_keep`` positions get logits) when the model supports it, and
    :data:`specdec.core.attention.NATIVE_GQA` for a grouped-query ``sdpa`` model (masked passes attend
    without repeating the KV per query head; bitwise the same output)."""
    name, has_keep = forward_kwargs(model)
    kw = {name: cache, "use_cache": True}
    if wants_native_gqa(model):  # verification passes attend without copying the KV per query head
        kw[NATIVE_GQA] = True
    if logits_to_keep is not None and has_keep:
        kw["logits_to_keep"] = logits_to_keep
    return kw


@torch.inference_mode()
def forward_tokens(model, tokens: list[int], cache, logits_to_keep: int | None = None) -> torch.Tensor:
    """Run ``model`` over ``tokens`` appended to what ``cache`` holds; returns logits.

    Args:
        model: transformers causal LM.
        tokens: the ids not yet in the cache (at least one).
        cache: a ``DynamicCache`` holding the preceding positions; updated in place.
        logits_to_keep: compute logits only for the last this-many positions (the LM head over a
            long prompt is the single largest waste in a prefill otherwise); None = all.
    Returns:
        float tensor ``[n, V]`` of next-token logits for the last ``n`` fed tokens, where
        ``n = len(tokens)`` or ``logits_to_keep`` (row i predicts the token after its input).
    """
    return forward_tokens_features(model, tokens, cache, logits_to_keep, None)[0]


@torch.inference_mode()
def forward_tokens_features(model, tokens: list[int], cache, logits_to_keep: int | None,
                            layer_ids: tuple[int, ...] | None, check: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`forward_tokens`, plus the target features ``layer_ids`` ask for. A
    :class:`~specdec.core.static.StaticKV` cache runs the model's static (or graphed) pass.

    Args:
        check: check the logits are finite here (one host read); False: the caller folds the check into
            its own read (:func:`specdec.core.finite.checked_argmax`).
    Returns:
        ``(logits [n, V], features)`` with ``features`` = the aux hidden states of the fed
        tokens, ``[1, len(tokens), len(layer_ids) * hidden]`` in the model's dtype; ``None`` when
        ``layer_ids`` is None (then no hidden states are requested: costs nothing).
    Raises:
        ValueError: a layer id outside ``0..num_hidden_layers``.
        specdec.core.finite.NonFiniteLogits: with ``check``, non-finite logits.
    """
    ids = torch.tensor([tokens], dtype=torch.long, device=model_device(model))
    past = cache.get_seq_length() if cache is not None else 0
    if isinstance(cache, StaticKV):
        full, hidden = cache.forward(ids, logits_to_keep, layer_ids)
    else:
        out, hidden = _with_features(model, layer_ids, input_ids=ids, **model_kwargs(model, cache, logits_to_keep))
        full = out.logits
    logits = full[0] if logits_to_keep is None else full[0, -logits_to_keep:]
    if check:
        check_logits(model, logits, logit_positions(past + len(tokens), logits.shape[0], logits.device))
    return logits, hidden


def logit_positions(end: int, n: int, device) -> torch.Tensor:
    """Positions the last ``n`` logits of a pass ending at ``end`` predict: ``end - n + 1 .. end``."""
    return torch.arange(end - n + 1, end + 1, device=device)


def _with_features(model, layer_ids, **kw):
    """``(model(**kw), features or None)``: the aux hidden states ``layer_ids`` ask for, captured by
    hooks on the decoder layers (:func:`specdec.core.features.capture_features`: id ``i`` = the
    stream entering layer ``i``, id ``L`` = the last layer's output *before* the final norm, as vLLM
    feeds EAGLE-3 heads; transformers' ``hidden_states[L]`` is after the norm)."""
    if layer_ids is None:
        return model(**kw), None
    from specdec.core.features import capture_features

    with capture_features(model, layer_ids) as feats:
        out = model(**kw)
    return out, feats[-1]


def compact_rows(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Move each row's valid slots to the front, in order: ``x [B, W, D]``, ``valid [B, W]`` bool
    -> ``[B, max_b valid[b].sum(), D]`` (row b's first ``valid[b].sum()`` entries are its valid
    slots; the rest is padding)."""
    width = int(valid.sum(dim=1).max()) if valid.numel() else 0
    order = torch.sort((~valid).to(torch.int8), dim=1, stable=True).indices[:, :width]
    return x.gather(1, order[..., None].expand(-1, -1, x.shape[-1]))


def now(device: torch.device) -> float:
    """``time.perf_counter()`` after synchronising ``device``, in seconds."""
    sync(device)
    return time.perf_counter()


def timed(fn: Callable[[], T], device: torch.device) -> tuple[T, float]:
    """``(fn(), seconds)``: wall time of ``fn`` between two synchronisations of ``device``."""
    t0 = now(device)
    out = fn()
    return out, now(device) - t0


class MaskedKV(DeferredChecks):
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

    def forward(self, ids: torch.Tensor, valid: torch.Tensor, logits_to_keep: int | None = None,
                check: bool = True) -> torch.Tensor:
        """Append a block and run the model over it (``check`` False: the finiteness check is deferred to
        :meth:`check_pending`).

        Args:
            ids: LongTensor ``[B, m]``; ids in invalid slots are ignored (masked for every query).
            valid: BoolTensor ``[B, m]``; a row's valid slots get consecutive positions.
            logits_to_keep: logits only for the last this-many slots (None = all ``m``).
        Returns:
            logits ``[B, n, V]`` for the last ``n`` slots (rows of invalid slots are meaningless).
        """
        return self.forward_features(ids, valid, logits_to_keep, None, check)[0]

    @torch.inference_mode()
    def forward_features(self, ids: torch.Tensor, valid: torch.Tensor, logits_to_keep: int | None,
                         layer_ids: tuple[int, ...] | None, check: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`forward`, plus the aux hidden states ``[B, m, len(layer_ids) * hidden]`` of every
        slot of the block (invalid slots meaningless); ``None`` (and no hidden states asked
        for) when ``layer_ids`` is None."""
        self.mask = torch.cat([self.mask, valid], dim=1)
        positions = (self.num_valid[:, None] + valid.long().cumsum(dim=1) - 1).clamp_min(0)
        out, hidden = _with_features(self.model, layer_ids, input_ids=ids, attention_mask=self.mask.long(),
                                     position_ids=positions, **model_kwargs(self.model, self.cache, logits_to_keep))
        self.num_valid = self.num_valid + valid.sum(dim=1)
        logits = out.logits if logits_to_keep is None else out.logits[:, -logits_to_keep:]
        n = logits.shape[1]
        if check:
            check_logits(self.model, logits, positions[:, -n:] + 1, valid[:, -n:])
        else:
            self.defer(self.model, logits, positions[:, -n:] + 1, valid[:, -n:])
        return logits, hidden

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


class SingleKV(DeferredChecks):
    """:class:`MaskedKV`'s interface for a batch of one row, on a plain ``DynamicCache``.

    One row never has holes (rejected drafts are cut, not masked), so no attention mask and no
    position ids are passed: the B = 1 draft pass is exactly the plain cached forward pass.
    Left padding in a block (``valid`` False) is dropped before the pass.

    Args:
        model: the transformers causal LM. cache: an existing ``DynamicCache`` to continue
            (default: a new one).
    """

    def __init__(self, model, cache=None) -> None:
        self.model = model
        self.device = model_device(model)
        self.cache = new_cache(model, static=True) if cache is None else cache

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, valid: torch.Tensor, logits_to_keep: int | None = None,
                check: bool = True) -> torch.Tensor:
        """As :meth:`MaskedKV.forward` for ``ids``/``valid`` ``[1, m]``; returns logits ``[1, n, V]``. A
        :class:`~specdec.core.static.StaticKV` cache runs the model's static (or graphed) pass. One row has
        no padding on a device (``valid`` is only read when it lies on the CPU: no host sync).
        ``check`` False defers the finiteness check (:meth:`check_pending`)."""
        if valid.device.type == "cpu" and not bool(valid.all()):
            ids = ids[valid][None]
        past = self.cache.get_seq_length()
        if isinstance(self.cache, StaticKV):
            full = self.cache.forward(ids, logits_to_keep)[0]
        else:
            full = self.model(input_ids=ids, **model_kwargs(self.model, self.cache, logits_to_keep)).logits
        logits = full if logits_to_keep is None else full[:, -logits_to_keep:]
        positions = logit_positions(past + ids.shape[1], logits.shape[1], logits.device)[None]
        if check:
            check_logits(self.model, logits, positions)
        else:
            self.defer(self.model, logits, positions)
        return logits

    def invalidate_tail(self, keep: torch.Tensor, width: int) -> None:
        """Within the last ``width`` positions keep only the first ``keep[0]`` (rollback)."""
        if width > 0:
            crop_cache(self.cache, self.cache.get_seq_length() - width + min(int(keep[0]), width))

    def select(self, rows: torch.Tensor) -> None:
        """Keep ``rows`` (``[0]``: no-op; ``[]``: the row finished, drop the cache)."""
        if rows.numel() == 0:
            self.cache = new_cache(self.model)


def new_kv(model, batch_size: int):
    """The draft-side cache for ``batch_size`` rows: :class:`SingleKV` for one, else :class:`MaskedKV`."""
    return SingleKV(model) if batch_size == 1 else MaskedKV(model, batch_size)


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
