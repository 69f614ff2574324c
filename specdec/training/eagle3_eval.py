"""Teacher-forced agreement of a head with its target (a cheap acceptance estimate during training).

On sequences whose responses the target wrote itself (greedy), the head drafts ``k`` tokens from every
position through the TTT unroll; a draft token is right when it equals the target's argmax over the
target's *full* vocabulary (a target argmax outside the draft vocabulary is a miss). ``alpha_tf`` is
the step-0 agreement; ``accepted_per_draft`` the mean number of leading right tokens of a ``k``-token
draft (greedy speculative decoding accepts exactly these, so ``1 + accepted_per_draft`` tokens per
target pass). The decoded acceptance comes from :mod:`specdec.validation` once the head is a drafter.
"""

from __future__ import annotations

from typing import Any

import torch

from specdec.training.eagle3_data import TrainingSequence, regenerated_sequences
from specdec.training.eagle3_features import SequenceFeatures, all_target_features, draft_token_ids


def heldout_sequences(target: Any, heldout: str = "spec_bench", *, per_category: int = 2,
                      max_prompt_tokens: int = 256, max_new_tokens: int = 64, seed: int = 0) -> list[TrainingSequence]:
    """Short held-out prompts (every category) answered greedily by ``target``: evaluation sequences.

    Raises:
        FileNotFoundError / HeldoutFormatError: see :func:`specdec.validation.heldout.load_heldout`.
    """
    from specdec.validation.heldout import load_heldout, prompt_token_ids
    from specdec.validation.short_prompts import short_prompts

    held = short_prompts(load_heldout(heldout), target.tokenizer, per_category=per_category,
                         max_prompt_tokens=max_prompt_tokens, seed=seed)
    prompts = [(prompt_token_ids(p, target.tokenizer), []) for p in held.prompts]
    return regenerated_sequences(target, prompts, max_new_tokens)


@torch.no_grad()
def teacher_forced_agreement(head, target: Any, feats: list[SequenceFeatures], *, steps: int = 3,
                             batch_size: int = 4) -> dict[str, Any]:
    """Agreement of ``head`` with ``target`` on ``feats`` (module docstring).

    Returns:
        ``{"alpha_tf", "step_agreement" (per step), "accepted_per_draft", "positions", "in_draft_rate"}``.
    """
    from specdec.training.eagle3 import collate
    from specdec.training.eagle3_ttt import ttt_unroll

    dev = head.fc.weight.device
    full = target.model.get_output_embeddings().weight.detach().to(dev, torch.float32)
    d2t = head.d2t.cpu() if head.d2t is not None else torch.zeros(head.config.draft_vocab_size, dtype=torch.long)
    t2d = head.t2d.to(dev) if head.t2d is not None else torch.ones(full.shape[0], dtype=torch.bool, device=dev)
    w_draft = full[draft_token_ids(d2t).to(dev)]
    was_training = head.training
    head.eval()
    correct, chain, total, in_draft_n = [0] * steps, [0] * steps, [0] * steps, 0
    for i in range(0, len(feats), batch_size):
        b = collate(feats[i:i + batch_size], dev)
        in_draft = t2d[(b["last"] @ full.T).argmax(-1)]
        res = ttt_unroll(head, b["input_ids"], b["aux"], b["last"] @ w_draft.T, b["loss_mask"], steps=steps,
                         target_in_draft=in_draft)
        in_draft_n += int((in_draft & b["loss_mask"]).sum())
        for s in range(steps):
            correct[s] += res.step_correct[s]
            chain[s] += res.chain_correct[s]
            total[s] += res.step_total[s]
    head.train(was_training)
    rate = [c / t if t else float("nan") for c, t in zip(correct, total)]
    n0 = total[0] or 1
    return {"alpha_tf": rate[0], "step_agreement": rate, "accepted_per_draft": sum(chain) / n0,
            "positions": total[0], "in_draft_rate": in_draft_n / max(1, sum(int(f.loss_mask.sum()) for f in feats))}


def evaluation_features(target: Any, layer_ids: list[int], **kw) -> list[SequenceFeatures]:
    """:func:`heldout_sequences` with their target features (``kw`` go to :func:`heldout_sequences`)."""
    return all_target_features(target.model, heldout_sequences(target, **kw), layer_ids)
