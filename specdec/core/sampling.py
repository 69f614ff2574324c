"""The sampling math of exact speculative decoding, as pure tensor functions.

This is the module to check line by line against the papers:

* Leviathan, Kalman, Matias (2022), "Fast Inference from Transformers via Speculative Decoding",
  Algorithm 1 (``SpeculativeDecodingStep``).
* Chen et al. (2023), "Accelerating Large Language Model Decoding with Speculative Sampling",
  Algorithm 2 (modified rejection sampling).

Notation: ``p`` is the target distribution, ``q`` the draft distribution, both over the target's
vocabulary ``V``, after temperature / top-k / top-p have been applied *identically* to both
(:func:`logits_to_probs`). For a draft token ``x ~ q``:

    accept x   with probability min(1, p(x) / q(x))                 (Alg. 1, "r < p/q")
    otherwise  sample from the residual  norm(max(0, p − q))        (Alg. 1, "p'(x)")
    if all k drafts are accepted, sample the bonus token from p_{k+1} (Alg. 1, last line)

Greedy decoding (temperature 0) is the same algorithm with one-hot ``p`` and ``q``: a draft is
accepted iff it equals the target's argmax, and the residual is the one-hot target argmax.

The decoding loops (B = 1 and B > 1) and the greedy replay verify through one function,
:func:`verify_drafts`, with a greedy branch (:func:`verify_greedy` on token ids, one host read per
pass) and a sampling branch (:func:`verify_batch` on distributions), as vLLM's rejection sampler.
:func:`verify_block` is the same algorithm for one row, written token by token as in the paper:
the reference that :func:`verify_batch` is tested against.

No function here holds state, touches a model, or allocates on a device other than the inputs'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specdec.core.config import SamplingConfig
from specdec.core.inputs import check_draft_tokens, check_token_range

#: ``next_token`` when there is none: an accepted stop token (EOS) ended the block, so no
#: recovered or bonus token is sampled after it.
NO_NEXT_TOKEN = -1

__all__ = [
    "SamplingConfig",
    "NO_NEXT_TOKEN",
    "logits_to_probs",
    "sample",
    "acceptance_probability",
    "residual_distribution",
    "verify_block",
    "verify_greedy",
    "VerifyOutcome",
    "sample_rows",
    "verify_batch",
    "BatchVerifyOutcome",
    "verify_drafts",
    "draft_step",
    "one_hot_q",
    "ACCEPTANCE_RULES",
    "acceptance_rule_of",
    "exact_rule_acceptance",
    "argmax_rule_acceptance",
    "rule_acceptance",
]

#: the acceptance rule each proposal rule (``SpeculativeConfig.draft_sampling``) is counted under
#: (docs/metrics.md, "Two acceptance rules"): ``x ~ q`` with rejection sampling accepts with Σ_x min(p, q)
#: ("exact"); ``x = argmax q`` verified with q one-hot (vLLM's default ``draft_sample_method``, llama.cpp's
#: exact-match verification) accepts with p(argmax q) ("argmax")
ACCEPTANCE_RULES = {"sampled": "exact", "argmax": "argmax"}


def logits_to_probs(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """Turn raw logits into the sampling distribution used for both target and draft.

    Order (as in HF ``generate`` and vLLM): temperature, then top-k, then top-p, then softmax.
    Greedy returns the one-hot argmax (first index on exact ties).

    Args:
        logits: float tensor ``[..., V]`` (any float dtype; computed in float32).
        sampling: the :class:`SamplingConfig`.
    Returns:
        float32 tensor ``[..., V]``; each row sums to 1; entries outside top-k/top-p are exactly 0.
    """
    logits = logits.float()
    if sampling.is_greedy:
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).float()
    logits = logits / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    if sampling.top_p is not None and sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        # mass strictly before each token; a token is kept if that mass is < top_p
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop_sorted = mass_before >= sampling.top_p
        drop_sorted[..., 0] = False  # always keep the most likely token
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, -math.inf)
    return logits.softmax(dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> int:
    """Draw one token id from ``probs`` (float ``[V]``, sums to 1) with ``torch.multinomial``.

    A one-hot row (greedy) returns its index without consuming randomness.
    """
    if probs.dim() != 1:
        raise ValueError(f"sample expects a 1-D distribution, got shape {tuple(probs.shape)}")
    top = int(probs.argmax())
    if probs[top] >= 1.0:
        return top
    return int(torch.multinomial(probs, 1, generator=generator))


def draft_step(logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator | None = None
               ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """One proposal step of a drafter for ``B`` rows: the proposal rule and the confidence.

    Rule (``sampling.draft_sampling`` of a :class:`~specdec.core.config.ProposalSampling`; a
    plain :class:`SamplingConfig` means ``"sampled"``):

    * ``"sampled"`` (Leviathan 2022 / Chen 2023; transformers): ``x ~ q``, q =
      :func:`logits_to_probs` of the draft logits; verified against q (acceptance
      ``min(1, p(x)/q(x))``, expected ``sum_x min(p(x), q(x))``).
    * ``"argmax"`` (vLLM's model-based proposers, SGLang's EAGLE chain): ``x = argmax q`` (=
      argmax of the raw logits; temperature/top-k/top-p keep it), verified with q one-hot on x:
      acceptance ``p(x)``, residual ``p`` without ``x``; expected acceptance ``p(argmax q)``.
      Exact as well: P(y) = [y = x] p(x) + (1 - p(x)) p(y)[y != x] / (1 - p(x)) = p(y).

    Greedy decoding (temperature 0) is the argmax under both rules.

    Confidence (only when ``sampling.assistant_confidence_threshold`` is set, as transformers'
    ``ConfidenceCriteria``: the drafted token's probability under the draft's *processed*
    distribution, i.e. ``softmax(logits)`` of the raw logits (T = 1) under greedy decoding and
    :func:`logits_to_probs` (temperature, top-k, top-p) otherwise, whatever the rule).

    Args:
        logits: float ``[B, V]`` draft logits over the target vocabulary.
        sampling: :class:`SamplingConfig` or :class:`~specdec.core.config.ProposalSampling`.
        generator: for ``x ~ q``.
    Returns:
        ``(x LongTensor [B], q float32 [B, V] or None, confidence float32 [B] or None)``; ``q`` is
        None when it is one-hot on ``x`` (greedy, or the argmax rule).
    """
    rule = getattr(sampling, "draft_sampling", "sampled")
    tau = getattr(sampling, "assistant_confidence_threshold", None)
    if sampling.is_greedy or rule == "argmax":
        x = logits.argmax(dim=-1)
        if tau is None:
            return x, None, None
        probs = logits.float().softmax(dim=-1) if sampling.is_greedy else logits_to_probs(logits, sampling)
        return x, None, probs.gather(-1, x[:, None]).squeeze(-1)
    q = logits_to_probs(logits, sampling)
    x = sample_rows(q, generator)
    return x, q, (None if tau is None else q.gather(-1, x[:, None]).squeeze(-1))


def one_hot_q(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The draft distribution of a deterministic proposal: float32 one-hot ``[..., V]`` on
    ``tokens`` (LongTensor ``[...]``)."""
    return torch.nn.functional.one_hot(tokens, vocab_size).float()


def acceptance_rule_of(draft_sampling: str) -> str:
    """The acceptance rule (``"exact"`` | ``"argmax"``) a proposal rule (``"sampled"`` | ``"argmax"``) is counted under.

    Raises:
        ValueError: an unknown proposal rule.
    """
    try:
        return ACCEPTANCE_RULES[draft_sampling]
    except KeyError:
        raise ValueError(f"draft_sampling must be one of {', '.join(ACCEPTANCE_RULES)}, got {draft_sampling!r}") from None


def exact_rule_acceptance(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Acceptance probability of one drafted position under the exact rule: ``x ~ q``, accepted with
    ``min(1, p(x)/q(x))`` (Leviathan et al. 2022, Sec. 3.1 / Def. 3.1: β = Σ_x min(p(x), q(x)) = 1 − TV(p, q)).

    Args:
        p, q: float ``[..., V]`` target and draft distributions (rows sum to 1).
    Returns:
        float64 ``[...]`` in [0, 1] (rounding above 1 clamped).
    """
    return torch.minimum(p.double(), q.double()).sum(dim=-1).clamp(0.0, 1.0)


def argmax_rule_acceptance(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Acceptance probability of one drafted position under the argmax rule: the draft proposes ``x =
    argmax q`` (first index on exact ties, as ``torch.argmax``) and the verifier takes q one-hot on x, so
    ``min(1, p(x)/1) = p(x)``: acceptance ``p(argmax q)`` (vLLM's rejection sampler with ``draft_probs=None``;
    llama.cpp's exact match of a sampled target token).

    Args:
        p, q: float ``[..., V]`` target and draft distributions.
    Returns:
        float64 ``[...]`` in [0, 1].
    """
    return p.double().gather(-1, q.argmax(dim=-1, keepdim=True)).squeeze(-1).clamp(0.0, 1.0)


def rule_acceptance(p: torch.Tensor, q: torch.Tensor, rule: str) -> torch.Tensor:
    """:func:`exact_rule_acceptance` (``rule="exact"``) or :func:`argmax_rule_acceptance` (``"argmax"``), float64 ``[...]``.

    Raises:
        ValueError: an unknown rule.
    """
    if rule == "exact":
        return exact_rule_acceptance(p, q)
    if rule == "argmax":
        return argmax_rule_acceptance(p, q)
    raise ValueError(f"acceptance rule must be 'exact' or 'argmax', got {rule!r}")


def acceptance_probability(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """min(1, p(x)/q(x)), elementwise, in [0, 1] (Leviathan Alg. 1; Chen Alg. 2).

    Edge cases: ``p(x) = 0`` gives 0 (a token the target rules out is never accepted);
    ``q(x) = 0 < p(x)`` gives 1 (the ratio is +inf; such a token cannot be drawn from q anyway).
    Never NaN.
    """
    ratio = torch.where(q_x > 0, p_x / q_x.clamp_min(torch.finfo(torch.float32).tiny), torch.ones_like(p_x))
    return torch.where(p_x > 0, ratio.clamp(max=1.0), torch.zeros_like(p_x))


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p − q)): the distribution to sample from after a rejection (Leviathan Alg. 1).

    Args:
        p, q: float ``[..., V]`` distributions.
    Returns:
        float32 ``[..., V]``. Zero wherever ``p`` is zero. If ``max(0, p − q)`` has no mass (only
        when ``p == q`` up to rounding, where a rejection has probability 0), falls back to ``p``,
        so the result is never NaN.
    """
    r = (p.float() - q.float()).clamp_min(0.0)
    mass = r.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, r / mass.clamp_min(torch.finfo(torch.float32).tiny), p.float())


@dataclass
class VerifyOutcome:
    """The result of verifying one block of draft tokens.

    Attributes:
        num_accepted: accepted draft tokens ``n`` (0..len(draft)).
        next_token: the token after the accepted prefix: *recovered* (sampled from the residual at
            the first rejection) or *bonus* (sampled from ``p[n]`` when all drafts were accepted).
        is_bonus: True if ``next_token`` is a bonus token. Neither recovered nor bonus when an
            accepted stop token ended the block (``next_token == NO_NEXT_TOKEN``).
    """

    num_accepted: int
    next_token: int
    is_bonus: bool

    @property
    def rejected(self) -> bool:
        """True if the block ended at a rejected draft (``next_token`` is a recovered token)."""
        return not self.is_bonus and self.next_token != NO_NEXT_TOKEN


def verify_block(
    draft_tokens: list[int],
    p: torch.Tensor,
    q: torch.Tensor,
    generator: torch.Generator | None = None,
    stop_token_ids: frozenset[int] = frozenset(),
) -> VerifyOutcome:
    """Modified rejection sampling over one block (Leviathan Alg. 1, lines after the target pass).

    Args:
        draft_tokens: the ``k`` proposed ids ``x_1..x_k`` (k >= 0).
        p: float32 ``[k + 1, V]`` target distributions; ``p[i]`` is for the position of
            ``x_{i+1}``, and ``p[k]`` is the bonus distribution.
        q: float32 ``[k, V]`` draft distributions that ``x_1..x_k`` were drawn from (one-hot for
            greedy or an n-gram proposal).
        generator: source of the uniform coins ``r_i ~ U[0, 1)``; accept iff ``r_i < min(1, p/q)``
            (strict, so a coin of exactly 0 never accepts a token with ``p(x) = 0``).
        stop_token_ids: if an accepted draft is one of these (EOS), stop right there: the outcome
            has ``next_token = NO_NEXT_TOKEN`` and nothing is sampled after it.
    Returns:
        :class:`VerifyOutcome`.
    Raises:
        ValueError: shapes that do not match k, or a draft id outside ``[0, V)`` (``-1``, vLLM's
            empty-slot placeholder, included).
    """
    k = len(draft_tokens)
    if p.shape[0] != k + 1 or q.shape[0] != k:
        raise ValueError(f"need p [k+1, V] and q [k, V] for k={k}, got {tuple(p.shape)} and {tuple(q.shape)}")
    check_draft_tokens(draft_tokens, p.shape[-1])  # -1 or >= V would index the wrong row, silently
    for i, x in enumerate(draft_tokens):
        accept_prob = acceptance_probability(p[i, x], q[i, x])
        if accept_prob >= 1.0:
            accepted = True  # no coin needed (greedy match, or p >= q)
        elif accept_prob <= 0.0:
            accepted = False
        else:
            r = torch.rand((), generator=generator, device=p.device)
            accepted = bool(r < accept_prob)
        if not accepted:
            return VerifyOutcome(i, sample(residual_distribution(p[i], q[i]), generator), is_bonus=False)
        if x in stop_token_ids:
            return VerifyOutcome(i + 1, NO_NEXT_TOKEN, is_bonus=False)
    return VerifyOutcome(k, sample(p[k], generator), is_bonus=True)


def verify_greedy(
    draft_tokens: list[int], target_argmax: list[int], stop_token_ids: frozenset[int] = frozenset()
) -> VerifyOutcome:
    """:func:`verify_block` for temperature 0, on token ids instead of one-hot distributions.

    With one-hot ``p`` and ``q``, ``min(1, p(x)/q(x))`` is 1 if ``x`` is the target's argmax and
    0 otherwise, and the residual ``norm(max(0, p − q))`` is the one-hot target argmax; so this
    is the same algorithm without building ``[k, V]`` tensors (one host read per step).

    Args:
        draft_tokens: the ``k`` proposed ids.
        target_argmax: ``k + 1`` ids, the target's argmax at each drafted position and at the
            bonus position (first index on exact ties, as :func:`logits_to_probs`).
        stop_token_ids: an accepted draft in this set ends the block (``next_token = NO_NEXT_TOKEN``).
    Returns:
        :class:`VerifyOutcome`.
    Raises:
        ValueError: if ``len(target_argmax) != len(draft_tokens) + 1``.
    """
    k = len(draft_tokens)
    if len(target_argmax) != k + 1:
        raise ValueError(f"need k+1 = {k + 1} target argmax ids, got {len(target_argmax)}")
    for i, x in enumerate(draft_tokens):
        if x != target_argmax[i]:
            return VerifyOutcome(i, target_argmax[i], is_bonus=False)  # recovered = target argmax
        if x in stop_token_ids:
            return VerifyOutcome(i + 1, NO_NEXT_TOKEN, is_bonus=False)
    return VerifyOutcome(k, target_argmax[k], is_bonus=True)


def sample_rows(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token id per row of ``probs`` (float ``[B, V]``, rows sum to 1).

    Returns:
        LongTensor ``[B]`` on ``probs.device``. If every row is one-hot (greedy), the argmax is
        returned without consuming randomness; otherwise ``torch.multinomial`` draws every row
        (a one-hot row still returns its index, since zero-probability ids are never drawn).
    """
    if probs.dim() != 2:
        raise ValueError(f"sample_rows expects [B, V], got shape {tuple(probs.shape)}")
    top = probs.max(dim=-1)
    if bool((top.values >= 1.0).all()):
        return top.indices
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


@dataclass
class BatchVerifyOutcome:
    """Per-row result of :func:`verify_batch` (all LongTensor/BoolTensor ``[B]``).

    Attributes:
        num_accepted: accepted draft tokens ``n_b`` (0..num_drafts_b).
        next_token: recovered or bonus token after the accepted prefix; :data:`NO_NEXT_TOKEN` where an accepted
            draft was a stop token (the row ends at that token).
        is_bonus: True where ``next_token`` is a bonus token (all of the row's drafts accepted).
        rejected: True where the row ended at a rejected draft (``next_token`` is recovered).
    """

    num_accepted: torch.Tensor
    next_token: torch.Tensor
    is_bonus: torch.Tensor
    rejected: torch.Tensor


def verify_batch(
    draft_tokens: torch.Tensor,
    num_drafts: torch.Tensor,
    p: torch.Tensor,
    q: torch.Tensor,
    generator: torch.Generator | None = None,
    stop_token_ids: frozenset[int] = frozenset(),
) -> BatchVerifyOutcome:
    """:func:`verify_block` for ``B`` independent rows at once, without a Python loop over tokens.

    Row ``b`` verifies its first ``num_drafts[b]`` drafts exactly as Leviathan Alg. 1: accept
    ``x_i`` iff ``r_i < min(1, p_i(x_i) / q_i(x_i))`` with ``r_i ~ U[0, 1)`` (strict), stop at the
    first rejection ``n`` and draw the recovered token from ``norm(max(0, p_n − q_n))``; if all
    ``num_drafts[b]`` were accepted, draw the bonus token from ``p_{num_drafts[b]}``. The bonus
    case uses the same formula with ``q`` set to 0 (``norm(max(0, p − 0)) = p``). Slots at or
    beyond ``num_drafts[b]`` are padding: never accepted, their ``q`` ignored.

    Args:
        draft_tokens: LongTensor ``[B, k]`` (k >= 0; padding slots hold any valid id).
        num_drafts: LongTensor ``[B]`` with values in ``0..k``.
        p: float32 ``[B, k + 1, V]`` target distributions (``p[:, i]`` scores slot i; slot k is
            the bonus position of a full row).
        q: float32 ``[B, k, V]`` draft distributions the drafts were drawn from.
        generator: source of the coins and of the recovered/bonus draws.
        stop_token_ids: an accepted draft in this set ends its row there (``next_token = NO_NEXT_TOKEN``).
    Returns:
        :class:`BatchVerifyOutcome`.
    Raises:
        ValueError: on inconsistent shapes.
    """
    B, k = draft_tokens.shape
    if p.shape[:2] != (B, k + 1) or q.shape[:2] != (B, k) or num_drafts.shape != (B,):
        raise ValueError(
            f"need draft_tokens [B, k], num_drafts [B], p [B, k+1, V], q [B, k, V]; got "
            f"{tuple(draft_tokens.shape)}, {tuple(num_drafts.shape)}, {tuple(p.shape)}, {tuple(q.shape)}"
        )
    check_token_range("draft_tokens", draft_tokens, p.shape[-1])
    device = p.device
    rows = torch.arange(B, device=device)
    drafted = torch.arange(k, device=device)[None, :] < num_drafts[:, None]  # [B, k]: real draft slots

    # 1. accepted: slot i passes iff r_i < min(1, p_i(x_i) / q_i(x_i)); the accepted prefix ends at
    #    the first rejection (Leviathan Alg. 1, "n = min({i - 1 | r_i > p/q} ∪ {γ})")
    num_accepted = torch.zeros(B, dtype=torch.long, device=device)
    if k:
        p_x = p[:, :k].gather(-1, draft_tokens[..., None]).squeeze(-1)
        q_x = q.gather(-1, draft_tokens[..., None]).squeeze(-1)
        coins = torch.rand((B, k), generator=generator, device=device)
        passed = (coins < acceptance_probability(p_x, q_x)) & drafted
        num_accepted = passed.long().cumprod(dim=1).sum(dim=1)
    # an accepted stop token ends its row right there: nothing is sampled after it
    num_accepted, stopped = _cut_at_stop(draft_tokens, num_accepted, stop_token_ids)
    rejected = (num_accepted < num_drafts) & ~stopped
    is_bonus = (num_accepted == num_drafts) & ~stopped

    # 2. recovered (rejected rows): sample norm(max(0, p_n − q_n)) at the rejected slot n
    # 3. bonus (fully accepted rows): sample p_{num_drafts}, which is the same formula with q = 0
    q_at_next = p.new_zeros(B, p.shape[-1])
    if k:
        q_rejected = q[rows, num_accepted.clamp(max=k - 1)].to(q_at_next.dtype)
        q_at_next = torch.where(rejected[:, None], q_rejected, q_at_next)
    sampled = sample_rows(residual_distribution(p[rows, num_accepted], q_at_next), generator)
    next_token = torch.where(stopped, torch.full_like(sampled, NO_NEXT_TOKEN), sampled)
    return BatchVerifyOutcome(num_accepted=num_accepted, next_token=next_token, is_bonus=is_bonus, rejected=rejected)


def _cut_at_stop(
    draft_tokens: torch.Tensor, num_accepted: torch.Tensor, stop_token_ids: frozenset[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Shorten each row's accepted prefix to end at its first accepted stop token.

    Returns ``(num_accepted [B], stopped [B] bool)``: ``stopped`` where an accepted draft was a stop token.
    """
    stopped = torch.zeros_like(num_accepted, dtype=torch.bool)
    if not stop_token_ids or draft_tokens.shape[1] == 0:
        return num_accepted, stopped
    slots = torch.arange(draft_tokens.shape[1], device=draft_tokens.device)
    stop = torch.tensor(sorted(stop_token_ids), device=draft_tokens.device)
    is_stop = torch.isin(draft_tokens, stop) & (slots[None, :] < num_accepted[:, None])
    stopped = is_stop.any(dim=1)
    return torch.where(stopped, is_stop.long().argmax(dim=1) + 1, num_accepted), stopped



def verify_drafts(
    drafts: list[list[int]],
    stop_token_ids: frozenset[int] = frozenset(),
    *,
    target_argmax: list[list[int]] | None = None,
    p: torch.Tensor | None = None,
    q: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> list[VerifyOutcome]:
    """The one verifier of the decoding loops and the replay: ``B`` rows' draft blocks at once.

    Greedy branch (``target_argmax`` given): :func:`verify_greedy` per row on token ids (a draft is
    accepted iff it equals the target's argmax; the recovered / bonus token is the argmax), no
    tensor work. Sampling branch (``p`` given): :func:`verify_batch` (Leviathan Alg. 1 per row),
    ``q`` one-hot on the drafts when None (a deterministic proposal: the argmax rule, a lookup).
    Both branches are the same algorithm (one-hot ``p`` and ``q`` under greedy decoding).

    Args:
        drafts: per row, its proposed ids (``len(drafts[b])`` = row b's number of drafts, may be 0).
        stop_token_ids: an accepted draft in this set ends its row (``next_token = NO_NEXT_TOKEN``).
        target_argmax: greedy branch: per row, ``len(drafts[b]) + 1`` target argmax ids.
        p: sampling branch: float32 ``[B, w + 1, V]`` target distributions, ``w >= max len(drafts[b])``
            (slots past a row's drafts are padding; ``p[b, len(drafts[b])]`` is its bonus distribution).
        q: float ``[B, >= w, V]`` draft distributions the drafts were drawn from, or None (one-hot).
        generator: coins and recovered / bonus draws of the sampling branch (the greedy branch draws none).
    Returns:
        one :class:`VerifyOutcome` per row.
    Raises:
        ValueError: neither or both of ``target_argmax`` and ``p``; shapes that do not match the drafts;
            a draft id outside ``[0, V)`` (sampling branch).
    """
    if (target_argmax is None) == (p is None):
        raise ValueError("verify_drafts needs exactly one of target_argmax (greedy) and p (sampling)")
    if target_argmax is not None:
        if len(target_argmax) != len(drafts):
            raise ValueError(f"{len(target_argmax)} target argmax rows for {len(drafts)} draft rows")
        return [verify_greedy(d, a, stop_token_ids) for d, a in zip(drafts, target_argmax)]
    width = p.shape[1] - 1
    if p.shape[0] != len(drafts) or any(len(d) > width for d in drafts):
        raise ValueError(f"p {tuple(p.shape)} does not cover {len(drafts)} rows of up to {width} drafts")
    tokens = torch.tensor([d + [0] * (width - len(d)) for d in drafts], dtype=torch.long, device=p.device)
    tokens = tokens.reshape(len(drafts), width)
    num_drafts = torch.tensor([len(d) for d in drafts], dtype=torch.long, device=p.device)
    q = one_hot_q(tokens, p.shape[-1]) if q is None else q[:, :width].to(p.device)
    out = verify_batch(tokens, num_drafts, p, q, generator, stop_token_ids)
    flat = torch.stack([out.num_accepted, out.next_token, out.is_bonus.long()]).tolist()  # one host read
    return [VerifyOutcome(n, x, bool(bonus)) for n, x, bonus in zip(*flat)]
