"""Does an EAGLE-3 head fit a target? Checked from the head's config (and its ``d2t`` buffer) before
any head weights load; one clear line per problem (:class:`specdec.models.compat.IncompatiblePairError`)."""

from __future__ import annotations

from pathlib import Path

import torch

from specdec.models.compat import IncompatiblePairError
from specdec.models.eagle3.config import Eagle3Config, Eagle3ConfigError

__all__ = ["check_head_target", "read_d2t"]


def read_d2t(path: str | Path) -> torch.Tensor | None:
    """The ``d2t`` buffer of the head at ``path`` (read alone from the safetensors), or None."""
    from safetensors import safe_open

    path = Path(path)
    files = sorted(path.glob("*.safetensors"))
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            if "d2t" in st.keys():
                return st.get_tensor("d2t")
    return None


def _target_dims(target) -> tuple[int, int, int]:
    """``(hidden_size, num_hidden_layers, vocab rows of the LM head)`` of a transformers causal LM."""
    cfg = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
    return cfg.hidden_size, cfg.num_hidden_layers, target.get_output_embeddings().weight.shape[0]


def check_head_target(config: Eagle3Config, target, d2t: torch.Tensor | None = None) -> list[int]:
    """Check that the head described by ``config`` (and ``d2t``) can draft for ``target``.

    Checks: the head's target hidden size equals the target's (its ``fc`` reads the target's
    states; its embeddings are the target's); the head's target vocabulary (``transformer_layer_config
    .vocab_size``) equals the target's LM head rows; every aux layer id lies in ``[0, L]``, or the
    default ``[2, L // 2, L - 3]`` is valid for the target's ``L`` layers; every ``draft + d2t[draft]``
    is a target id.

    Args:
        config: the head's :class:`Eagle3Config`. target: the target causal LM (already loaded).
        d2t: the head's ``d2t`` buffer (LongTensor ``[draft_vocab_size]``), or None (no reduced vocabulary).
    Returns:
        the aux layer ids to read from the target.
    Raises:
        IncompatiblePairError: one line per problem found.
    """
    hidden, layers, vocab = _target_dims(target)
    problems = []
    head_target_hidden = config.target_hidden_size or config.hidden_size
    if head_target_hidden != hidden:
        problems.append(f"the head reads hidden states of size {head_target_hidden}, the target's are {hidden}")
    if config.hidden_size != hidden and config.target_hidden_size is None:
        problems.append(f"the head's hidden size {config.hidden_size} differs from the target's {hidden}")
    if config.target_vocab_size != vocab:
        problems.append(f"the head was built for a {config.target_vocab_size}-token vocabulary, the target has {vocab}")
    ids: list[int] = []
    try:
        ids = config.layer_ids_for(layers)
    except Eagle3ConfigError as e:
        problems.append(str(e))
    bad = [i for i in ids if not 0 <= i <= layers]
    if bad:
        problems.append(f"aux layer id {bad[0]} is outside the target's layers [0, {layers}]")
    if d2t is not None:
        if d2t.shape[0] != config.draft_vocab_size:
            problems.append(f"d2t has {d2t.shape[0]} entries, draft_vocab_size is {config.draft_vocab_size}")
        targets = torch.arange(d2t.shape[0]) + d2t.long()
        if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= vocab):
            problems.append(f"d2t maps draft ids to target id {int(targets.max())} (or below 0), outside the target's "
                            f"vocabulary [0, {vocab})")
    elif config.draft_vocab_size != config.target_vocab_size:
        problems.append("the head has a reduced draft vocabulary but no d2t mapping in its weights")
    if problems:
        raise IncompatiblePairError(problems)
    return ids
