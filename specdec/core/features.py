"""Target features: the auxiliary hidden states an EAGLE-3 head reads from the target's passes.

What a layer id means (vLLM and speculators agree; checked in their source, see README "EAGLE-3"):
layer id ``i`` is the residual stream *entering* decoder layer ``i`` -- vLLM appends
``hidden_states + residual`` right before running layer ``i`` (``EagleModelMixin._maybe_add_hidden_state``
in ``vllm/model_executor/models/interfaces.py``; the older per-model loops in ``llama.py``/``qwen3.py``
do the same) -- i.e. the output of layer ``i - 1`` with its residual added, *before* any final norm.
Id 0 is the token embeddings; id ``L`` (the number of layers) is the last layer's output before the
final norm. For ``i < L`` this equals transformers' ``output_hidden_states[i]``; for ``i = L``
transformers returns the *normed* state instead, so it is captured here from the last layer's output.
``speculators`` trains on exactly these states: its data generation reads them from vLLM
(``hs_connectors``), and it applies the verifier's final norm itself to id ``L``
(``Eagle3DraftModel.verifier_norm``), which only makes sense on pre-norm states.

Capture uses forward (pre-)hooks on the target's decoder layers, so the target's own forward pass
(with its KV cache) is unchanged: :func:`capture_features` wraps any target call.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

__all__ = ["decoder_layers", "capture_features", "target_features", "check_layer_ids"]


def decoder_layers(target) -> torch.nn.ModuleList:
    """The decoder layers of a transformers causal LM (``target.model.layers`` for Llama/Qwen3/...).

    Raises:
        TypeError: the model exposes no ``layers`` list.
    """
    base = target.get_decoder() if hasattr(target, "get_decoder") else getattr(target, "model", target)
    layers = getattr(base, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise TypeError(f"cannot find the decoder layers of {type(target).__name__} (expected .model.layers)")
    return layers


def check_layer_ids(layer_ids, num_layers: int) -> list[int]:
    """``layer_ids`` as a list, each in ``[0, num_layers]``.

    Raises:
        ValueError: an empty list, or an id outside ``[0, num_layers]`` (one line naming it).
    """
    ids = [int(i) for i in layer_ids]
    if not ids:
        raise ValueError("target_layer_ids is empty")
    bad = [i for i in ids if not 0 <= i <= num_layers]
    if bad:
        raise ValueError(f"target_layer_ids: layer id {bad[0]} is outside the target's layers [0, {num_layers}]")
    return ids


def _first_tensor(x):
    return x[0] if isinstance(x, (tuple, list)) else x


@contextmanager
def capture_features(target, layer_ids):
    """Capture the aux hidden states of every target forward pass run inside the ``with`` block.

    Yields a list; after each pass one float tensor ``[B, T, len(layer_ids) * hidden]`` (the states at
    ``layer_ids``, concatenated in that order, in the target's dtype) is appended.

    Raises:
        ValueError: a layer id outside ``[0, L]``. TypeError: no decoder layers found.
    """
    layers = decoder_layers(target)
    ids = check_layer_ids(layer_ids, len(layers))
    grabbed: dict[int, torch.Tensor] = {}
    out: list[torch.Tensor] = []
    handles = []

    def pre(i):
        def hook(module, args, kwargs):
            grabbed[i] = args[0] if args else kwargs["hidden_states"]
        return hook

    def post(module, args, kwargs, output):
        grabbed[len(layers)] = _first_tensor(output)
        out.append(torch.cat([grabbed[i] for i in ids], dim=-1))
        grabbed.clear()

    for i in sorted(set(ids)):
        if i < len(layers):
            handles.append(layers[i].register_forward_pre_hook(pre(i), with_kwargs=True))
    handles.append(layers[-1].register_forward_hook(post, with_kwargs=True))
    try:
        yield out
    finally:
        for h in handles:
            h.remove()


@torch.inference_mode()
def target_features(target, input_ids: torch.Tensor, layer_ids, attention_mask=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the target once (no cache) and return ``(logits [B, T, V], features [B, T, n * hidden])``.

    Args:
        target: transformers causal LM. input_ids: LongTensor ``[B, T]``.
        layer_ids: aux layer ids (module docstring). attention_mask: optional ``[B, T]``.
    Raises:
        ValueError / TypeError: see :func:`capture_features`.
    """
    with capture_features(target, layer_ids) as feats:
        logits = target(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    return logits, feats[-1]
