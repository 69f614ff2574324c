"""Teacher forcing: p and q at every position of the target's own continuation, and their agreement.

Position t scores the distribution of ``continuation[t]`` given ``prompt + continuation[:t]``,
from ONE full forward pass of each model without a cache. The n-gram drafter has no model: its q
is the one-hot lookup proposal (:func:`specdec.validation.metrics.onehot_agreement_sums`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.core.config import SamplingConfig
from specdec.core.drafters import NgramDrafter, fit_vocab, unwrap_drafter
from specdec.core.finite import check_logits
from specdec.core.head_drafter import Eagle3Drafter
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
    logits = out.logits[0, -num_positions:]
    check_logits(model, logits, torch.arange(len(ids) - num_positions + 1, len(ids) + 1, device=logits.device))
    return logits.float().cpu()


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
    target: torch.nn.Module | None = None  # the target (an EAGLE-3 head's agreement reads its features)


def target_teacher_forcing(target: torch.nn.Module, prompt_ids: list[int], continuation: list[int], sampling: SamplingConfig) -> TargetTeacherForcing:
    """Position t scores the distribution of ``continuation[t]`` given ``prompt + continuation[:t]``."""
    T = len(continuation)
    seq = prompt_ids + continuation[:-1]  # the last token is never an input
    z_p = teacher_forced_logits(target, seq, T)
    return TargetTeacherForcing(seq, len(prompt_ids), continuation, z_p, logits_to_probs(z_p, sampling),
                                kl_logprobs(z_p, sampling), target)


def draft_agreement(tf: TargetTeacherForcing, draft_model: torch.nn.Module | None, drafter: NgramDrafter | Eagle3Drafter | None,
                    sampling: SamplingConfig, *, chain: int = 0) -> AgreementSums:
    """Agreement of the drafter's q with the target's p at every continuation position: the draft LM's
    (``draft_model``), else the drafter's (``drafter``: an n-gram's lookup, or a drafter reading target
    features, an EAGLE-3 head; a wrapper such as
    :class:`~specdec.validation.replay.RecordingDrafter` is unwrapped first). ``chain``: draft positions of
    both acceptance rules' per-position sums (k; :func:`specdec.validation.metrics.chain_sums`)."""
    T, vocab = tf.z_p.shape
    drafter = unwrap_drafter(drafter) if drafter is not None else None  # a recorder's inner drafter
    if drafter is not None and drafter.target_layer_ids is not None:  # an EAGLE-3 head
        return _head_agreement(tf, drafter, sampling, chain)
    if draft_model is not None:
        z_q = fit_vocab(teacher_forced_logits(draft_model, tf.seq, T), vocab)
        return agreement_sums(tf.p, logits_to_probs(z_q, sampling), tf.kl_logp, kl_logprobs(z_q, sampling), chain=chain)
    assert drafter is not None
    full = tf.seq + tf.continuation[-1:]
    proposals: list[int | None] = []
    for t in range(T):
        look = drafter.lookup(full[: tf.prompt_len + t], 1)
        proposals.append(look[0] if look and look[0] < vocab else None)
    return onehot_agreement_sums(tf.p, proposals, chain=chain)


@torch.inference_mode()
def _head_agreement(tf: TargetTeacherForcing, drafter, sampling: SamplingConfig, chain: int) -> AgreementSums:
    """An EAGLE-3 head's first-draft q at every continuation position ``t >= 1`` (at ``t = 0`` the
    head has no target features: decoding's first step is the target's prefill). Position ``t`` is
    head entry ``len(prompt) + t - 2`` (it reads ``x[e + 1]`` and the target features at ``e``);
    costs one more teacher-forced target pass (the features) and one head pass."""
    from specdec.core.features import target_features

    T, vocab = tf.z_p.shape
    P, head = tf.prompt_len, drafter.head
    if T < 2 or tf.target is None:
        return agreement_sums(tf.p[:0], tf.p[:0], tf.kl_logp[:0], tf.kl_logp[:0])
    device = head.fc.weight.device
    ids = torch.tensor([tf.seq], device=device)
    _, feats = target_features(tf.target, ids, drafter.target_layer_ids)
    E = P + T - 2  # entries 0 .. P + T - 3
    _, logits = head(ids[:, 1:E + 1], head.combine(feats[:, :E]), torch.arange(E, device=device)[None], head.new_cache(1))
    z_q = head.target_logits(logits[0, P - 1:], vocab).float().cpu()  # positions t = 1 .. T - 1
    return agreement_sums(tf.p[1:], logits_to_probs(z_q, sampling), tf.kl_logp[1:], kl_logprobs(z_q, sampling), chain=chain)
