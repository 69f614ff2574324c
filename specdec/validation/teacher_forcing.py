"""Teacher forcing: p and q at every position of the target's own continuation, and their agreement.

Position t scores the distribution of ``continuation[t]`` given ``prompt + continuation[:t]``,
from ONE full forward pass of each model without a cache. The n-gram drafter has no model: its q
is the one-hot lookup proposal (:func:`specdec.validation.metrics.onehot_agreement_sums`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.core.config import SamplingConfig
from specdec.core.drafters import NgramDrafter, fit_vocab
from specdec.core.kv import model_device
from specdec.core.sampling import logits_to_probs
from specdec.validation.metrics import AgreementSums, agreement_sums, onehot_agreement_sums

__all__ = ["TargetTeacherForcing", "target_teacher_forcing", "draft_agreement", "teacher_forced_logits", "kl_logprobs"]


@torch.inference_mode()
def teacher_forced_logits(model: torch.nn.Module, ids: list[int], num_positions: int) -> torch.Tensor:
    """Logits ``[num_positions, V]`` (float32, CPU) of the last ``num_positions`` positions of
    ``ids`` from one full forward pass without a cache."""
    x = torch.tensor([ids], dtype=torch.long, device=model_device(model))
    try:
        out = model(input_ids=x, use_cache=False, logits_to_keep=num_positions)
    except TypeError:  # models without logits_to_keep
        out = model(input_ids=x, use_cache=False)
    return out.logits[0, -num_positions:].float().cpu()


def kl_logprobs(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """Log-probabilities for KL: the untruncated softmax at the sampling temperature (T=1 if greedy)."""
    t = sampling.temperature if not sampling.is_greedy else 1.0
    return torch.log_softmax(logits.double() / t, dim=-1)


@dataclass
class TargetTeacherForcing:
    """The target's teacher-forced pass over prompt + its own continuation (shared by all drafters)."""

    seq: list[int]  # prompt + continuation[:-1]: the model inputs
    prompt_len: int
    continuation: list[int]
    z_p: torch.Tensor  # [T, V] raw logits
    p: torch.Tensor  # [T, V] at the configured sampling
    kl_logp: torch.Tensor  # [T, V] untruncated log-probs for KL


def target_teacher_forcing(target: torch.nn.Module, prompt_ids: list[int], continuation: list[int], sampling: SamplingConfig) -> TargetTeacherForcing:
    """Position t scores the distribution of ``continuation[t]`` given ``prompt + continuation[:t]``."""
    T = len(continuation)
    seq = prompt_ids + continuation[:-1]  # the last token is never an input
    z_p = teacher_forced_logits(target, seq, T)
    return TargetTeacherForcing(seq, len(prompt_ids), continuation, z_p, logits_to_probs(z_p, sampling), kl_logprobs(z_p, sampling))


def draft_agreement(tf: TargetTeacherForcing, draft_model: torch.nn.Module | None, ngram: NgramDrafter | None, sampling: SamplingConfig) -> AgreementSums:
    """Agreement of the drafter's q with the target's p at every continuation position."""
    T, vocab = tf.z_p.shape
    if draft_model is not None:
        z_q = fit_vocab(teacher_forced_logits(draft_model, tf.seq, T), vocab)
        return agreement_sums(tf.p, logits_to_probs(z_q, sampling), tf.kl_logp, kl_logprobs(z_q, sampling))
    assert ngram is not None
    full = tf.seq + tf.continuation[-1:]
    proposals: list[int | None] = []
    for t in range(T):
        look = ngram.lookup(full[: tf.prompt_len + t], 1)
        proposals.append(look[0] if look and look[0] < vocab else None)
    return onehot_agreement_sums(tf.p, proposals)
