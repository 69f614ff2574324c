"""Static-shape B = 1 passes: a preallocated KV cache of fixed length, and CUDA graphs per block width.

Eager decoding (the default) runs every pass through Python and transformers' dynamic cache: on a GPU a
one-token pass of a 135M model is launch- and host-bound (issue 39: 21-43 ms on an H200 against ~0.06 ms of
weight reads). :func:`use_passes` switches a model's B = 1 decoding passes (the target's one-token pass, its
(k+1)-token verification pass, the draft's passes) to

* ``"static"``: one persistent transformers ``StaticCache`` of ``max_len`` positions per model (allocated once,
  at fixed addresses), the pass's positions passed explicitly, rollback by moving the end (stale entries
  beyond it are masked by the causal mask and overwritten by the next block); every pass over a block of
  ``m`` tokens has the same shapes whatever the context length;
* ``"graphs"``: ``"static"`` plus one ``torch.cuda.CUDAGraph`` per ``(m, logits_to_keep)`` (blocks of up to
  :data:`GRAPH_MAX_TOKENS` tokens; a longer prefill runs the static pass uncaptured), captured on first use
  after two warm-up passes on a side stream; a replay is one launch. CUDA only.

``"eager"`` stays selectable and is the default everywhere, CUDA included, until a device run shows
identical outputs and the gain (docs/gpu.md). Greedy speculative output through these passes equals the
target-only output through the same passes (the loops are unchanged); on a CPU the static passes are
token-identical to eager ones (tests/core/test_static_passes.py).

One live cache per model: :func:`new_static_cache` resets the model's cache and invalidates the previous
handle (using it raises ``RuntimeError``), so a model decodes one sequence at a time (as a B = 1 loop does).
Feature capture (EAGLE-3 heads: hooks on decoder layers) runs uncaptured.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch

__all__ = ["PASSES", "StaticPasses", "StaticKV", "use_passes", "passes_of", "new_static_cache", "GRAPH_MAX_TOKENS"]

PASSES = ("eager", "static", "graphs")
#: blocks of at most this many tokens are captured as CUDA graphs (one-token passes, k+1 verification blocks)
GRAPH_MAX_TOKENS = 16
#: default length of the static cache when the model's context is longer (positions)
DEFAULT_MAX_LEN = 4096


@dataclass
class _Graph:
    """One captured pass: its graph and its static input/output tensors."""

    graph: torch.cuda.CUDAGraph
    ids: torch.Tensor
    positions: torch.Tensor
    logits: torch.Tensor


@dataclass
class StaticPasses:
    """A model's static B = 1 passes (:func:`use_passes`): its persistent cache, graphs and counters.

    Attributes:
        model: the causal LM. mode: ``"static"`` or ``"graphs"``. max_len: cache positions.
        graphs: captured passes by ``(m, logits_to_keep)``. failures: why a shape could not be captured
            (it then runs uncaptured). replays / uncaptured: pass counts, for the device report.
    """

    model: torch.nn.Module
    mode: str
    max_len: int
    graphs: dict = field(default_factory=dict)
    failures: dict = field(default_factory=dict)
    replays: int = 0
    uncaptured: int = 0
    generation: int = 0
    cache: object = None

    def __deepcopy__(self, memo):  # a deep copy of the model (a derived draft) starts eager
        return None

    def __post_init__(self) -> None:
        from transformers import StaticCache

        self.device = next(self.model.parameters()).device
        self.cache = StaticCache(config=self.model.config, max_cache_len=self.max_len)
        params = inspect.signature(self.model.forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"
        self.cache_position = "cache_position" in params  # transformers < 5.2x: positions of the written slots
        self.keep_arg = "logits_to_keep" in params
        self.arange = torch.arange(max(GRAPH_MAX_TOKENS, 1), device=self.device)

    def _kwargs(self, ids: torch.Tensor, positions: torch.Tensor, keep: int | None) -> dict:
        kw = {"input_ids": ids, "position_ids": positions, self.cache_arg: self.cache, "use_cache": True}
        if self.cache_position:
            kw["cache_position"] = positions[0]
        if keep is not None and self.keep_arg:
            kw["logits_to_keep"] = keep
        return kw

    def set_length(self, n: int) -> None:
        """Move every layer's end to ``n`` (transformers' ``cumulative_length``, where it keeps one; no host sync)."""
        for layer in getattr(self.cache, "layers", []):
            length = getattr(layer, "cumulative_length", None)
            if isinstance(length, torch.Tensor):
                length.fill_(n)

    def run(self, ids: torch.Tensor, start: int, keep: int | None, layer_ids) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits ``[1, n, V]`` (``n`` = ``keep`` or all) of ``ids [1, m]`` written at ``start .. start+m-1``,
        and the features ``layer_ids`` ask for (None when None). Raises ValueError: past ``max_len``."""
        m = ids.shape[1]
        if start + m > self.max_len:
            raise ValueError(f"the static cache holds {self.max_len} positions; this pass needs {start + m} "
                             "(use_passes(model, mode, max_len=...) with a larger max_len, or eager passes)")
        self.set_length(start)
        key = (m, keep)
        if layer_ids is None and self.mode == "graphs" and m <= GRAPH_MAX_TOKENS and key not in self.failures:
            g = self.graphs.get(key) or self._capture(ids, start, keep)
            if g is not None:
                g.ids.copy_(ids)
                g.positions.copy_(self.arange[:m][None] + start)
                g.graph.replay()
                self.replays += 1
                return g.logits.clone(), None
        self.uncaptured += 1
        positions = (self.arange[:m] + start)[None] if m <= self.arange.numel() else \
            torch.arange(start, start + m, device=self.device)[None]
        kw = self._kwargs(ids, positions, keep)
        if layer_ids is None:
            return self.model(**kw).logits, None
        from specdec.core.features import capture_features

        with capture_features(self.model, layer_ids) as feats:
            out = self.model(**kw)
        return out.logits, feats[-1]

    def _capture(self, ids: torch.Tensor, start: int, keep: int | None) -> _Graph | None:
        """Capture the pass of this shape (two warm-up passes first, on a side stream); None on failure
        (recorded in :attr:`failures`; the shape then runs uncaptured)."""
        m = ids.shape[1]
        static_ids, positions = ids.clone(), (self.arange[:m] + start)[None].clone()
        kw = self._kwargs(static_ids, positions, keep)
        try:
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream), torch.inference_mode():
                for _ in range(2):
                    self.set_length(start)
                    self.model(**kw)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            self.set_length(start)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph), torch.inference_mode():
                logits = self.model(**kw).logits
        except Exception as e:  # noqa: BLE001  (recorded; the pass runs uncaptured)
            self.failures[(m, keep)] = f"{type(e).__name__}: {e}"[:300]
            self.set_length(start)
            return None
        self.set_length(start)
        g = _Graph(graph, static_ids, positions, logits)
        self.graphs[(m, keep)] = g
        return g


class StaticKV:
    """A handle on a model's static cache for one sequence (what the B = 1 loops hold as their cache).

    Behaves like the ``DynamicCache`` the loops use otherwise: :meth:`get_seq_length` (host int, no sync),
    :meth:`crop` (a negative count, as transformers'), :meth:`update` (only to load a prompt prefix,
    :func:`specdec.core.kv.copy_cache_prefix`), :meth:`layer_tensors`.
    """

    def __init__(self, passes: StaticPasses) -> None:
        passes.generation += 1
        self.passes, self.generation, self.n = passes, passes.generation, 0
        passes.set_length(0)

    def _live(self) -> StaticPasses:
        if self.generation != self.passes.generation:
            raise RuntimeError("this static cache was superseded by a newer one of the same model (one sequence "
                               "at a time per model with static passes)")
        return self.passes

    def get_seq_length(self) -> int:
        return self.n

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``-tokens_to_remove`` positions (only the end moves)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count (tokens to remove), got {tokens_to_remove}")
        self.n = max(0, self.n + tokens_to_remove)

    def forward(self, ids: torch.Tensor, keep: int | None, layer_ids=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Append ``ids [1, m]`` and run the model: ``(logits [1, n, V], features or None)``."""
        logits, hidden = self._live().run(ids, self.n, keep, layer_ids)
        self.n += ids.shape[1]
        return logits, hidden

    def layer_tensors(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``(keys, values)`` per layer, each ``[1, kv_heads, n, head_dim]`` (views of the static buffers)."""
        layers = self._live().cache.layers
        return [(layer.keys[:, :, : self.n], layer.values[:, :, : self.n]) for layer in layers
                if getattr(layer, "keys", None) is not None and layer.keys.dim() == 4]

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int) -> None:
        """Load ``[1, H, p, D]`` keys/values as positions ``0 .. p-1`` of layer ``layer_idx`` (a prompt prefix)."""
        layer = self._live().cache.layers[layer_idx]
        if getattr(layer, "keys", None) is None or not getattr(layer, "is_initialized", True):
            layer.lazy_initialization(keys, values)
        p = keys.shape[-2]
        layer.keys[:, :, :p].copy_(keys)
        layer.values[:, :, :p].copy_(values)
        self.n = p


def use_passes(model: torch.nn.Module, mode: str, max_len: int | None = None) -> torch.nn.Module:
    """Select how ``model``'s B = 1 decoding passes run (module docstring); returns ``model``.

    Args:
        model: a transformers causal LM. mode: one of :data:`PASSES`.
        max_len: static cache positions (default: the model's context, at most :data:`DEFAULT_MAX_LEN`).
    Raises:
        ValueError: unknown mode, or ``"graphs"`` off CUDA.
    """
    if mode not in PASSES:
        raise ValueError(f"unknown passes {mode!r}; use one of {', '.join(PASSES)}")
    device = next(model.parameters()).device
    if mode == "graphs" and device.type != "cuda":
        raise ValueError(f"passes='graphs' needs CUDA (the model is on {device.type}); use 'static' or 'eager'")
    if mode == "eager":
        model.specdec_passes = None
        return model
    ctx = getattr(model.config, "max_position_embeddings", None) or DEFAULT_MAX_LEN
    model.specdec_passes = StaticPasses(model, mode, int(max_len or min(ctx, DEFAULT_MAX_LEN)))
    return model


def passes_of(model) -> StaticPasses | None:
    """The model's :class:`StaticPasses`, or None (eager)."""
    return getattr(model, "specdec_passes", None)


def new_static_cache(model, need: int | None = None) -> StaticKV | None:
    """A fresh :class:`StaticKV` when ``model`` runs static passes and ``need`` positions (None: unknown) fit,
    else None (the caller uses a dynamic cache)."""
    passes = passes_of(model)
    if passes is None or (need is not None and need > passes.max_len):
        return None
    return StaticKV(passes)
