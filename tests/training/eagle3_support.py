"""Tiny targets and quick training settings for the EAGLE-3 training tests (not product code)."""

from __future__ import annotations

from pathlib import Path

from tests.support.models import save_tiny_checkpoint

#: aux layer ids for the 2-layer tiny Llama (0 = embeddings, 2 = last layer output before the final norm)
TINY_LAYER_IDS = [0, 1, 2]


def tiny_target_dir(path: Path, *, perturb: float = 0.0) -> Path:
    """A 2-layer tiny Llama with a character tokenizer whose distributions a head can learn quickly
    (``init_std`` 0.1: peaked enough for a clear argmax, smooth enough to learn in a few steps)."""
    return save_tiny_checkpoint(path, seed=0, init_std=0.1, perturb=perturb)


def quick_config(**kw):
    """A training run of about 20 optimizer steps on the tiny target (recipe ``fixed``, float32: the
    resume and warm-start mechanics tests compare exact weights; no time budget, whose learning-rate decay
    follows the wall clock)."""
    from specdec.training import Eagle3TrainConfig

    base = dict(recipe="fixed", precision="fp32", max_minutes=None, num_sequences=20, response_tokens=40,
                draft_vocab_size=64, epochs=4, batch_size=4, lr=3e-3, warmup_steps=2, checkpoint_every=100)
    base.update(kw)
    return Eagle3TrainConfig(**base)
