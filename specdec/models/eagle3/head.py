"""The EAGLE-3 head (Li et al. 2025, "EAGLE-3"), as ``speculators`` 0.9.0 trains it and vLLM serves it.

Parameter names equal ``speculators.models.eagle3.core.Eagle3DraftModel``'s state dict, so a
checkpoint loads with no renaming:

* ``fc``: ``Linear(num_aux * target_hidden, hidden)`` over the concatenated target aux hidden states
  (optionally ``input_norm`` over the concatenation, ``norm_before_fc``, or one ``fc_norm.i`` per
  aux state, ``fc_norm``); used on *target* features only. Draft steps after the first feed the
  head's own hidden state back without ``fc`` (vLLM ``combine_hidden_states``; speculators' TTT loop).
* ``layers.0`` (first layer): ``input_layernorm(embed(x))`` concatenated with ``hidden_norm(h)``
  (``2 * hidden`` into q/k/v), residual ``h`` (or ``hidden_norm(h)`` with ``norm_before_residual``),
  then attention, ``post_attention_layernorm`` and the SwiGLU MLP (speculators
  ``Eagle3FirstLayerMixin.forward``; vLLM ``llama_eagle3.LlamaDecoderLayer``). ``layers.1..``
  are plain Llama/Qwen3 decoder layers. Qwen3 layers add ``q_norm``/``k_norm`` (per head, before RoPE).
* ``norm`` then ``lm_head`` (``draft_vocab_size`` rows); with ``norm_output`` the *normed* state is
  also what the next step gets (Eagle 3.1), else the pre-norm state (vLLM ``hidden_prenorm``).
* ``embed_tokens`` (target vocabulary rows; usually the target's own, copied in at load), ``d2t``
  (``target_id = draft_id + d2t[draft_id]``) and ``t2d`` buffers.

RoPE uses the layer config's rotary embedding (transformers ``LlamaRotaryEmbedding`` /
``Qwen3RotaryEmbedding``: rope_theta and scaling types); positions are the target positions of
the hidden states (vLLM); speculators trains with positions shifted by one, and RoPE attention
only sees position differences, so both give the same attention.

The KV cache is :class:`HeadCache`: plain per-layer tensors plus a per-row validity mask, cropped
or masked on rollback.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from specdec.models.eagle3.config import Eagle3Config

__all__ = ["Eagle3Head", "HeadCache", "ttt_attention_mask"]


class RMSNorm(nn.Module):
    """Llama/Qwen3 RMSNorm: ``w * x / sqrt(mean(x^2) + eps)`` computed in float32."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def ttt_attention_mask(length: int, step: int, start: int = 0, device=None) -> torch.Tensor:
    """speculators' TTT attention pattern: bool ``[length - start, length + step * (length - start)]``
    (True = attend) for the step-``step`` queries at positions ``start..length-1``.

    Columns ``[0, length)`` are the step-0 keys (causal: query ``i`` sees keys ``<= i``); block ``j``
    (``1..step``) holds step ``j``'s keys of positions ``start..``, of which query ``i`` sees only its
    own position's (its earlier drafts). Drafting's chains (:meth:`Eagle3Head.chain_logits`) and TTT
    training (:mod:`specdec.training.eagle3_ttt`) both use it.
    """
    i = torch.arange(length, device=device)
    n = length - start
    blocks = [i[None, :] <= i[start:, None]] + [torch.eye(n, dtype=torch.bool, device=device)] * step
    return torch.cat(blocks, dim=1)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class HeadCache:
    """The head's KV cache: ``keys[l]``/``values[l]`` ``[B, kv_heads, T, head_dim]`` per layer, and
    ``valid`` ``[B, T]`` (False = a masked-out column: padding or a rejected draft in a batch)."""

    def __init__(self, num_layers: int, batch_size: int = 1, device=None) -> None:
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.valid = torch.zeros(batch_size, 0, dtype=torch.bool, device=device)

    @property
    def length(self) -> int:
        """Columns held (valid or not)."""
        return self.valid.shape[1]

    def crop(self, keep: int) -> None:
        """Keep the first ``keep`` columns."""
        self.keys = [None if k is None else k[:, :, :keep] for k in self.keys]
        self.values = [None if v is None else v[:, :, :keep] for v in self.values]
        self.valid = self.valid[:, :keep]

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (LongTensor of row indices)."""
        self.keys = [None if k is None else k[rows] for k in self.keys]
        self.values = [None if v is None else v[rows] for v in self.values]
        self.valid = self.valid[rows]


class Attention(nn.Module):
    """Grouped-query attention with RoPE (Llama; Qwen3 with per-head q/k RMSNorm)."""

    def __init__(self, cfg, in_features: int, qk_norm: bool) -> None:
        super().__init__()
        h, kvh, d, bias = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, bool(cfg.attention_bias)
        self.num_heads, self.num_kv_heads, self.head_dim = h, kvh, d
        self.q_proj = nn.Linear(in_features, h * d, bias=bias)
        self.k_proj = nn.Linear(in_features, kvh * d, bias=bias)
        self.v_proj = nn.Linear(in_features, kvh * d, bias=bias)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=bias)
        if qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.qk_norm = qk_norm

    def forward(self, x, rope, cache: HeadCache, layer: int, mask: torch.Tensor) -> torch.Tensor:
        """``x`` ``[B, T, in]``; ``rope`` = (cos, sin) ``[B, T, head_dim]``; ``mask`` bool
        ``[B, T, cached + T]`` (True = attend). Appends this block's K/V to ``cache`` layer ``layer``."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(B, T, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        cos, sin = rope[0][:, None], rope[1][:, None]
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if cache.keys[layer] is not None:
            k = torch.cat([cache.keys[layer], k], dim=2)
            v = torch.cat([cache.values[layer], v], dim=2)
        cache.keys[layer], cache.values[layer] = k, v
        rep = self.num_heads // self.num_kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], scale=self.head_dim ** -0.5)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, cfg) -> None:
        super().__init__()
        bias = bool(getattr(cfg, "mlp_bias", False))
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=bias)
        from transformers.activations import ACT2FN

        self.act = ACT2FN[cfg.hidden_act]

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """A Llama/Qwen3 decoder layer; ``first=True`` is the EAGLE-3 first layer (module docstring)."""

    def __init__(self, cfg, first: bool, norm_before_residual: bool = False) -> None:
        super().__init__()
        H = cfg.hidden_size
        self.first, self.norm_before_residual = first, norm_before_residual
        self.self_attn = Attention(cfg, 2 * H if first else H, qk_norm=cfg.model_type == "qwen3")
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        if first:
            self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)

    def forward(self, h, embeds, rope, cache, layer, mask):
        if self.first:
            hn = self.hidden_norm(h)
            residual = hn if self.norm_before_residual else h
            x = torch.cat([self.input_layernorm(embeds), hn], dim=-1)
        else:
            residual, x = h, self.input_layernorm(h)
        h = residual + self.self_attn(x, rope, cache, layer, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Head(nn.Module):
    """An EAGLE-3 head (module docstring). Build with :func:`specdec.models.eagle3.load_eagle3`.

    Args:
        config: :class:`Eagle3Config`.
    """

    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        cfg = config.layer
        self.config = config
        H, V, Vd = cfg.hidden_size, cfg.vocab_size, config.draft_vocab_size
        self.embed_tokens = nn.Embedding(V, H)
        self.fc = nn.Linear(config.fc_in_features, H, bias=False)
        if config.norm_before_fc:
            self.input_norm = RMSNorm(config.fc_in_features, cfg.rms_norm_eps)
        if config.fc_norm:
            self.fc_norm = nn.ModuleList(RMSNorm(config.fc_in_features // config.num_aux, cfg.rms_norm_eps)
                                         for _ in range(config.num_aux))
        self.layers = nn.ModuleList(DecoderLayer(cfg, i == 0, config.norm_before_residual)
                                    for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(H, Vd, bias=False)
        if Vd != V:
            self.register_buffer("d2t", torch.zeros(Vd, dtype=torch.long))
            self.register_buffer("t2d", torch.zeros(V, dtype=torch.bool))
        else:
            self.d2t = self.t2d = None
        self.rotary_emb = _rotary(cfg)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def new_cache(self, batch_size: int = 1) -> HeadCache:
        return HeadCache(self.num_layers, batch_size, self.fc.weight.device)

    def combine(self, aux: torch.Tensor) -> torch.Tensor:
        """Target aux features ``[..., num_aux * target_hidden]`` -> ``[..., hidden]`` (norms, then ``fc``)."""
        aux = aux.to(self.fc.weight.dtype)
        if self.config.norm_before_fc:
            aux = self.input_norm(aux)
        if self.config.fc_norm:
            aux = torch.cat([n(c) for n, c in zip(self.fc_norm, aux.chunk(len(self.fc_norm), dim=-1))], dim=-1)
        return self.fc(aux)

    def forward(self, input_ids, hidden, positions, cache: HeadCache, valid=None, mask=None):
        """One head pass over a block appended to ``cache``.

        Args:
            input_ids: LongTensor ``[B, T]``, target-vocabulary ids (embedded with ``embed_tokens``).
            hidden: ``[B, T, hidden]``: :meth:`combine` of target features, or the head's own state.
            positions: LongTensor ``[B, T]``: RoPE positions (the target position of ``hidden``).
            cache: :class:`HeadCache` (updated in place).
            valid: BoolTensor ``[B, T]`` (None = all valid): invalid slots are masked for every query.
            mask: BoolTensor ``[B, T, cached + T]`` replacing the causal mask (True = attend), as
                :meth:`chain_logits` uses for speculators' TTT attention pattern.
        Returns:
            ``(state [B, T, hidden], logits [B, T, draft_vocab_size])``: ``state`` is what the next
            draft step feeds back (pre-norm; normed with ``norm_output``); logits are float32.
        """
        B, T = input_ids.shape
        if valid is None:
            valid = torch.ones(B, T, dtype=torch.bool, device=input_ids.device)
        cached = cache.length
        cache.valid = torch.cat([cache.valid, valid], dim=1)
        if mask is None:
            cols = torch.arange(cached + T, device=input_ids.device)[None, :]
            rows = torch.arange(T, device=input_ids.device)[:, None] + cached
            mask = (cols <= rows)[None] & cache.valid[:, None, :]
            mask = mask | (cols == rows)[None]  # a padding slot attends to itself: no empty softmax row
        h = hidden.to(self.fc.weight.dtype)
        embeds = self.embed_tokens(input_ids).to(h.dtype)
        h = self.run_layers(h, embeds, self.rotary_emb(h, positions), cache, mask)
        normed = self.norm(h)
        logits = self.lm_head(normed).float()
        return (normed if self.config.norm_output else h), logits

    def run_layers(self, h, embeds, rope, cache: HeadCache, mask: torch.Tensor) -> torch.Tensor:
        """The decoder layers over one block (``h`` ``[B, T, hidden]``, ``embeds`` its token embeddings,
        ``rope`` its (cos, sin), ``mask`` bool ``[B, T, cached + T]``): the pre-norm state ``[B, T, hidden]``.
        Drafting (:meth:`forward`) and TTT training (:mod:`specdec.training.eagle3_ttt`) both run it."""
        for i, layer in enumerate(self.layers):
            h = layer(h, embeds, rope, cache, i, mask)
        return h

    @torch.inference_mode()
    def chain_logits(self, input_ids: torch.Tensor, features: torch.Tensor, depth: int) -> list[torch.Tensor]:
        """Teacher-forced draft chains from every position at once (speculators' TTT forward).

        Entry ``t`` of depth 0 reads ``x[t + 1]`` and the target features at ``t``; depth ``d``
        reads ``x[t + 1 + d]`` and the depth ``d - 1`` state at ``t``, at position ``t + d``, and
        attends to the depth-0 entries ``<= t`` and its own chain (depths ``1..d`` at ``t``): exactly
        what decoding computes for the ``d``-th draft of a block whose target features end at ``t``,
        while the earlier drafts matched ``x``.

        Args:
            input_ids: LongTensor ``[1, T + depth]``: the target ids ``x[1:]`` (position 0 dropped).
            features: ``[1, T, num_aux * target_hidden]``: the target features of positions ``0..T-1``.
            depth: chain depths to compute (>= 1).
        Returns:
            ``depth`` float32 tensors ``[T, draft_vocab_size]`` (logits of depth ``d`` at entry ``t``).
        """
        T = features.shape[1]
        dev = features.device
        cache = self.new_cache(1)
        t = torch.arange(T, device=dev)
        state, logits = self(input_ids[:, :T], self.combine(features), t[None], cache)
        out = [logits[0]]
        for d in range(1, depth):
            mask = ttt_attention_mask(T, d, device=dev)[None]
            ids = input_ids[:, d : d + T]
            state, logits = self(ids, state, (t + d)[None], cache, mask=mask)
            out.append(logits[0])
        return out

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> target ids (``draft + d2t[draft]``; identity without ``d2t``)."""
        return draft_ids if self.d2t is None else draft_ids + self.d2t[draft_ids]

    def target_logits(self, logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """Draft logits ``[..., draft_vocab]`` scattered onto ``[..., vocab_size]`` target ids; ``-inf``
        (q = 0) for target ids outside the draft vocabulary (vLLM ``Eagle3LlamaForCausalLM.compute_logits``)."""
        targets = self.to_target_ids(torch.arange(logits.shape[-1], device=logits.device))
        out = logits.new_full((*logits.shape[:-1], vocab_size), -math.inf)
        keep = targets < vocab_size
        out[..., targets[keep]] = logits[..., keep]
        return out


def _rotary(cfg) -> nn.Module:
    """The rotary embedding of the layer family (rope_theta / rope scaling from the layer config)."""
    if cfg.model_type == "qwen3":
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding as Rotary
    else:
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding as Rotary
    return Rotary(cfg)
