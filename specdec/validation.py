"""Validate a (target, drafter) pair on a held-out set, with the same core that serves it.

For every prompt :func:`validate_pair` runs, in this order:

1. target-only decoding (:func:`specdec.autoregressive_generate`): the reference tokens, the
   target's own continuation for teacher forcing, and the target-only time;
2. speculative decoding (:func:`specdec.speculative_generate`) on the same prompt and settings:
   the pooled counters and the speculative time;
3. one teacher-forced forward pass of each model over prompt + the target's continuation,
   giving p and q at every continuation position (the n-gram drafter has no model: its q is the
   one-hot lookup proposal, see :func:`specdec.metrics.onehot_agreement_sums`);
4. greedy only: the exactness audit (speculative tokens == target-only tokens).

With ``ValidationConfig.batch_size`` B > 1, steps 1 and 2 run once per group of B prompts as
batched calls (:mod:`specdec.validation_batch`); steps 3 and 4 stay per prompt.

Then it pools counters per category and overall (never averaging per-prompt ratios), bootstraps
95% CIs over prompts, and fits Leviathan's speedup model. Definitions: ``docs/metrics.md``.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from specdec.decoding import autoregressive_generate, speculative_generate
from specdec.drafters import NgramDrafter, fit_vocab, model_device, sync
from specdec.heldout import HeldoutPrompt, HeldoutSet, prompt_token_ids
from specdec.metrics import (
    AgreementSums,
    agreement_sums,
    bootstrap_ratio_ci,
    expected_tokens_per_step,
    onehot_agreement_sums,
    predicted_speedup,
    recommend_num_draft_tokens,
)
from specdec.machine import usable_cpus
from specdec.report import GroupMetrics, PromptResult, ValidationReport
from specdec.speed import bootstrap_speedup_ci
from specdec.sampling import SamplingConfig, logits_to_probs
from specdec.stats import DecodingStats

__all__ = ["ValidationConfig", "validate_pair", "validate_pairs", "ALPHA_HAT_ESTIMATOR", "aggregate"]

ALPHA_HAT_ESTIMATOR = (
    "i.i.d. maximum likelihood: num_accepted_tokens / (num_accepted_tokens + num_rejected_steps) "
    "(every verified position counts; fully accepted steps are censored); Leviathan's alpha"
)
SLOWER_NOTE = (
    "speculative decoding is SLOWER than target-only for this pair on this device: "
    "measured speedup {speedup:.2f}x, predicted {pred:.2f}x at k={k} (best k={best_k}: {best:.2f}x; "
    "{adj:.2f}x at k={k} counting the verification pass's real cost); draft/target cost per pass c={c:.2f}, "
    "verification pass / one-token target pass = {v:.2f}"
)


@dataclass
class ValidationConfig:
    """Settings of one validation run.

    Attributes:
        num_draft_tokens: k, draft tokens per speculative step (>= 1).
        max_new_tokens: new tokens per prompt, for both target-only and speculative decoding.
        sampling: :class:`SamplingConfig` used by decoding *and* by the teacher-forced p and q.
        seed: seeds the subset choice, the per-prompt ``torch.Generator`` s and the bootstrap.
        limit: number of prompts (stratified subset, :meth:`HeldoutSet.subset`); ``None`` = all.
        bootstrap_resamples: bootstrap replicates for the 95% CIs.
        warmup: run one short untimed generation of each kind first (lazy init, allocator).
        batch_size: prompts decoded together (>= 1). With 1 (default) every prompt runs alone.
            With B > 1 the prompts that are not skipped are taken in held-out order (after
            ``limit``) in groups of B, left-padded, and each group gets ONE batched target-only
            call and ONE batched speculative call per drafter (:mod:`specdec.batch`); the
            teacher-forced agreement stays per prompt. Then the measured ``speedup`` is batched
            speculative vs batched target-only at the same B, and ĉ / v are measured on batched
            passes (mean seconds per batched forward pass). Each group's wall seconds are split
            across its rows in proportion to their emitted tokens, so per-prompt seconds sum to
            the batch wall times. Sampling uses one ``torch.Generator`` per group, seeded from
            ``seed`` and the group's first prompt id: a prompt's sampled tokens then depend on
            the grouping (B, ``limit``, skipped prompts), not on the prompt alone. Greedy rows
            equal their B = 1 outputs, so counters and agreement do not depend on B. Larger B
            raises throughput on GPUs; on a small CPU B > 1 mostly adds padding cost.
    """

    num_draft_tokens: int = 4
    max_new_tokens: int = 64
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    seed: int = 0
    limit: int | None = None
    bootstrap_resamples: int = 2000
    warmup: bool = True
    batch_size: int = 1

    def __post_init__(self) -> None:
        if self.num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be >= 1, got {self.num_draft_tokens}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1, got {self.limit}")
        if self.bootstrap_resamples < 1:
            raise ValueError(f"bootstrap_resamples must be >= 1, got {self.bootstrap_resamples}")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {self.batch_size!r}")

    def to_dict(self) -> dict[str, Any]:
        """Flat JSON-ready dict (the report's ``config``)."""
        return {
            "num_draft_tokens": self.num_draft_tokens,
            "max_new_tokens": self.max_new_tokens,
            **self.sampling.to_dict(),
            "seed": self.seed,
            "limit": self.limit,
            "bootstrap_resamples": self.bootstrap_resamples,
            "batch_size": self.batch_size,
        }


# --------------------------------------------------------------------------- pass timing
class _PassTimer:
    """Forward hooks that time every call of a model, split into prefill and later passes.

    The decoding core times whole steps; Leviathan's c is a ratio of *per-pass* costs in the
    decode loop, which the prompt prefill (hundreds of tokens for Spec-Bench summarization/RAG)
    would bias. The first call after :meth:`new_generation` is the prefill.
    """

    def __init__(self, model: torch.nn.Module | None) -> None:
        self.model = model
        self.handles: list[Any] = []
        self.decode_seconds = 0.0
        self.decode_passes = 0
        self.prefill_seconds = 0.0
        self._t0 = 0.0
        self._first = True
        self.device = model_device(model) if model is not None else torch.device("cpu")

    def __enter__(self) -> "_PassTimer":
        if self.model is not None:
            self.handles = [
                self.model.register_forward_pre_hook(self._pre),
                self.model.register_forward_hook(self._post),
            ]
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    def new_generation(self) -> None:
        self._first = True

    def _pre(self, module: Any, args: Any) -> None:
        sync(self.device)
        self._t0 = time.perf_counter()

    def _post(self, module: Any, args: Any, output: Any) -> None:
        sync(self.device)
        dt = time.perf_counter() - self._t0
        if self._first:
            self.prefill_seconds += dt
            self._first = False
        else:
            self.decode_seconds += dt
            self.decode_passes += 1


# --------------------------------------------------------------------------- per prompt
@dataclass
class _Run:
    """One prompt's raw outcome (what the aggregation pools)."""

    row: PromptResult
    stats: DecodingStats | None = None
    agree: AgreementSums = field(default_factory=AgreementSums)
    tf_total: int = 0  # continuation positions (denominator of tf_coverage)
    target_only_seconds: float = 0.0
    speculative_seconds: float = 0.0
    target_only_tokens: int = 0
    speculative_tokens: int = 0
    target_pass_s: float = 0.0  # speculative run: target verification passes (prefill excluded)
    target_passes: int = 0
    target_step_s: float = 0.0  # target-only run: one-token passes (prefill excluded)
    target_steps: int = 0
    draft_pass_s: float = 0.0
    draft_passes: int = 0

    @property
    def ok(self) -> bool:
        return self.row.status == "ok"


def _prompt_seed(seed: int, prompt_id: str) -> int:
    """A per-prompt seed that does not depend on which other prompts are in the subset."""
    h = hashlib.sha256(f"{seed}:{prompt_id}".encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


def _context_limit(*models: torch.nn.Module | None) -> int | None:
    limits = [getattr(m.config, "max_position_embeddings", None) for m in models if m is not None and hasattr(m, "config")]
    limits = [int(x) for x in limits if x]
    return min(limits) if limits else None


@torch.inference_mode()
def _teacher_forced_logits(model: torch.nn.Module, ids: list[int], num_positions: int) -> torch.Tensor:
    """Logits ``[num_positions, V]`` (float32, CPU) of the last ``num_positions`` positions of
    ``ids`` from one full forward pass without a cache."""
    x = torch.tensor([ids], dtype=torch.long, device=model_device(model))
    try:
        out = model(input_ids=x, use_cache=False, logits_to_keep=num_positions)
    except TypeError:  # models without logits_to_keep
        out = model(input_ids=x, use_cache=False)
    return out.logits[0, -num_positions:].float().cpu()


def _kl_logprobs(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """Log-probabilities for KL: the untruncated softmax at the sampling temperature (T=1 if greedy)."""
    t = sampling.temperature if not sampling.is_greedy else 1.0
    return torch.log_softmax(logits.double() / t, dim=-1)


@dataclass
class _TargetTF:
    """The target's teacher-forced pass over prompt + its own continuation (shared by all drafters)."""

    seq: list[int]  # prompt + continuation[:-1]: the model inputs
    prompt_len: int
    continuation: list[int]
    z_p: torch.Tensor  # [T, V] raw logits
    p: torch.Tensor  # [T, V] at the configured sampling
    kl_logp: torch.Tensor  # [T, V] untruncated log-probs for KL


def _target_tf(target: torch.nn.Module, prompt_ids: list[int], continuation: list[int], sampling: SamplingConfig) -> _TargetTF:
    """Position t scores the distribution of ``continuation[t]`` given ``prompt + continuation[:t]``."""
    T = len(continuation)
    seq = prompt_ids + continuation[:-1]  # the last token is never an input
    z_p = _teacher_forced_logits(target, seq, T)
    return _TargetTF(seq, len(prompt_ids), continuation, z_p, logits_to_probs(z_p, sampling), _kl_logprobs(z_p, sampling))


def _draft_tf(tf: _TargetTF, draft_model: torch.nn.Module | None, ngram: NgramDrafter | None, sampling: SamplingConfig) -> AgreementSums:
    """Agreement of the drafter's q with the target's p at every continuation position."""
    T, vocab = tf.z_p.shape
    if draft_model is not None:
        z_q = fit_vocab(_teacher_forced_logits(draft_model, tf.seq, T), vocab)
        return agreement_sums(tf.p, logits_to_probs(z_q, sampling), tf.kl_logp, _kl_logprobs(z_q, sampling))
    assert ngram is not None
    full = tf.seq + tf.continuation[-1:]
    proposals: list[int | None] = []
    for t in range(T):
        look = ngram.lookup(full[: tf.prompt_len + t], 1)
        proposals.append(look[0] if look and look[0] < vocab else None)
    return onehot_agreement_sums(tf.p, proposals)


def _timed(fn: Callable[[], Any], device: torch.device) -> tuple[Any, float]:
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t0


@dataclass
class _DrafterCtx:
    """One drafter under validation: the object decoding uses, its model (None for n-gram), timers."""

    obj: Any
    model: torch.nn.Module | None
    kind: str
    ref: str | None
    recipe: dict | None
    timer: _PassTimer


def _skip_reason(prompt: HeldoutPrompt, ids: list[int], config: ValidationConfig, ctx_limit: int | None) -> str | None:
    if prompt.is_empty:
        return "empty prompt"
    if not ids:
        return "empty prompt (no tokens)"
    if ctx_limit is not None and len(ids) + config.max_new_tokens > ctx_limit:
        return f"prompt too long: {len(ids)} tokens + max_new_tokens {config.max_new_tokens} > context {ctx_limit}"
    return None


def _run_prompt(
    prompt: HeldoutPrompt,
    target: torch.nn.Module,
    tokenizer: Any,
    drafters: list[_DrafterCtx],
    config: ValidationConfig,
    eos: Any,
    ctx_limit: int | None,
    t_timer: _PassTimer,
    spec_first: bool = False,
) -> list[_Run]:
    """Target-only once and each drafter's speculative run, back to back (target-only first, or
    last with ``spec_first``: the caller alternates, so neither side always runs on a warmer
    machine), then the teacher-forced passes; the 1-minute load average is sampled after."""
    from specdec.machine import load_average

    ids = [] if prompt.is_empty else prompt_token_ids(prompt, tokenizer)
    reason = _skip_reason(prompt, ids, config, ctx_limit)
    if reason is not None:
        return [
            _Run(row=PromptResult(prompt.id, prompt.category, status="skipped", skip_reason=reason, prompt_tokens=len(ids)))
            for _ in drafters
        ]
    device = model_device(target)
    input_ids = torch.tensor([ids], dtype=torch.long, device=device)
    pseed = _prompt_seed(config.seed, prompt.id)
    kw = dict(max_new_tokens=config.max_new_tokens, sampling=config.sampling, eos_token_id=eos)

    def target_only():
        t_timer.new_generation()
        before = (t_timer.decode_seconds, t_timer.decode_passes)
        ref, t_ref = _timed(lambda: autoregressive_generate(target, input_ids, generator=_gen(pseed, device), **kw), device)
        return ref, t_ref, (t_timer.decode_seconds - before[0], t_timer.decode_passes - before[1])

    if spec_first:
        specs = [_spec_timed(prompt, ids, input_ids, target, d, config, kw, pseed, t_timer) for d in drafters]
        ref, t_ref, step = target_only()
    else:
        ref, t_ref, step = target_only()
        specs = [_spec_timed(prompt, ids, input_ids, target, d, config, kw, pseed, t_timer) for d in drafters]
    load = load_average()
    tf = _target_tf(target, ids, ref.token_ids, config.sampling) if ref.token_ids else None
    runs = []
    for d, (run, spec, t_spec) in zip(drafters, specs):
        _fill_run(run, spec.token_ids, spec.stats, ref.token_ids, t_ref, t_spec, tf, d, config)
        run.target_step_s, run.target_steps = step
        run.row.load_avg_1m = load
        runs.append(run)
    return runs


def _spec_timed(
    prompt: HeldoutPrompt,
    ids: list[int],
    input_ids: torch.Tensor,
    target: torch.nn.Module,
    d: _DrafterCtx,
    config: ValidationConfig,
    kw: dict[str, Any],
    pseed: int,
    t_timer: _PassTimer,
) -> tuple[_Run, Any, float]:
    """One drafter's timed speculative run: (its _Run with pass timings, the result, seconds)."""
    row = PromptResult(prompt_id=prompt.id, category=prompt.category, prompt_tokens=len(ids))
    run = _Run(row=row)
    device = model_device(target)
    t_timer.new_generation()
    d.timer.new_generation()
    before = (t_timer.decode_seconds, t_timer.decode_passes, d.timer.decode_seconds, d.timer.decode_passes)
    spec, t_spec = _timed(
        lambda: speculative_generate(
            target, d.obj, input_ids, num_draft_tokens=config.num_draft_tokens, generator=_gen(pseed + 1, device), **kw
        ),
        device,
    )
    s = spec.stats
    run.target_pass_s = t_timer.decode_seconds - before[0]
    run.target_passes = t_timer.decode_passes - before[1]
    if d.model is not None:
        run.draft_pass_s = d.timer.decode_seconds - before[2]
        run.draft_passes = d.timer.decode_passes - before[3]
    else:  # n-gram: one lookup per target pass, timed by the core as draft_seconds
        run.draft_pass_s, run.draft_passes = s.draft_seconds, s.target_forward_passes
    return run, spec, t_spec


def _fill_run(
    run: _Run,
    spec_tokens: list[int],
    s: DecodingStats,
    ref_tokens: list[int],
    t_ref: float,
    t_spec: float,
    tf: _TargetTF | None,
    d: _DrafterCtx,
    config: ValidationConfig,
) -> None:
    """Fill ``run`` and its row from one prompt's speculative outcome (tokens, own counters ``s``),
    its target-only tokens, the seconds charged to it, the drafter's teacher-forced agreement and,
    greedy only, the exactness audit against ``ref_tokens``."""
    row = run.row
    run.stats = s
    run.target_only_seconds, run.speculative_seconds = t_ref, t_spec
    run.target_only_tokens, run.speculative_tokens = len(ref_tokens), len(spec_tokens)
    row.new_tokens, row.target_only_tokens = len(spec_tokens), len(ref_tokens)
    row.num_drafts, row.num_draft_tokens, row.num_accepted_tokens = s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens
    row.acceptance_rate = s.acceptance_rate
    row.mean_accepted_length = s.mean_accepted_length
    row.alpha_hat = s.alpha_hat
    row.target_only_seconds, row.speculative_seconds = t_ref, t_spec

    if tf is not None:
        run.agree = _draft_tf(tf, d.model, d.obj if d.model is None else None, config.sampling)
        run.tf_total = len(ref_tokens)
    row.num_tf_positions = run.agree.positions
    row.alpha_tf = run.agree.mean("alpha")
    row.top1_agreement = run.agree.mean("top1")
    row.total_variation = run.agree.mean("tv")
    row.kl_divergence = run.agree.mean("kl")
    row.tf_coverage = run.agree.positions / run.tf_total if run.tf_total else math.nan

    if config.sampling.is_greedy:
        row.exact_match = spec_tokens == ref_tokens
        if not row.exact_match:
            a, b = spec_tokens, ref_tokens
            i = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
            row.first_divergence = i
            if tf is not None and i < tf.z_p.shape[0]:
                top2 = torch.topk(tf.z_p[i], 2).values
                row.divergence_logit_margin = float(top2[0] - top2[1])


def _gen(seed: int, device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device) if device.type == "cuda" else torch.Generator()
    return g.manual_seed(seed)


# --------------------------------------------------------------------------- aggregation
def _ratio(num: float, den: float) -> float:
    return num / den if den else math.nan


def aggregate(runs: list[_Run], k: int, *, seed: int = 0, n_resamples: int = 2000) -> GroupMetrics:
    """Pool per-prompt outcomes into one :class:`GroupMetrics` (sums first, then ratios).

    Bootstrap CIs resample the prompts that ran (status ``ok``) and recompute each pooled ratio.
    """
    g = GroupMetrics(num_prompts=sum(r.ok for r in runs), num_draft_tokens_k=k, num_skipped=sum(not r.ok for r in runs))
    ok = [r for r in runs if r.ok and r.stats is not None]
    if not ok:
        return g
    st = DecodingStats(num_draft_tokens_k=k)
    for r in ok:
        st = st.merge(r.stats)
    g.num_drafts, g.num_draft_tokens, g.num_accepted_tokens = st.num_drafts, st.num_draft_tokens, st.num_accepted_tokens
    g.accepted_per_position = list(st.accepted_per_position)
    g.drafted_per_position = list(st.drafted_per_position)
    g.num_emitted_tokens = st.num_emitted_tokens
    g.acceptance_rate = st.acceptance_rate
    g.mean_accepted_length = st.mean_accepted_length
    g.per_position_acceptance = st.per_position_acceptance
    g.conditional_per_position_acceptance = st.conditional_per_position_acceptance
    g.draft_tokens_per_step = st.draft_tokens_per_step
    g.alpha_hat = st.alpha_hat

    ag = AgreementSums()
    for r in ok:
        ag = ag + r.agree
    g.num_tf_positions = ag.positions
    g.alpha_tf, g.top1_agreement = ag.mean("alpha"), ag.mean("top1")
    g.total_variation, g.kl_divergence = ag.mean("tv"), ag.mean("kl")
    g.tf_coverage = _ratio(ag.positions, sum(r.tf_total for r in ok))

    ci = dict(seed=seed, n_resamples=n_resamples)
    g.acceptance_rate_ci = bootstrap_ratio_ci(
        [r.stats.num_accepted_tokens for r in ok], [r.stats.num_draft_tokens for r in ok], **ci
    )
    g.alpha_hat_ci = bootstrap_ratio_ci(
        [r.stats.num_accepted_tokens for r in ok],
        [r.stats.num_accepted_tokens + r.stats.num_rejected_steps for r in ok],
        **ci,
    )
    g.alpha_tf_ci = bootstrap_ratio_ci([r.agree.alpha for r in ok], [r.agree.positions for r in ok], **ci)

    g.target_only_seconds = sum(r.target_only_seconds for r in ok)
    g.speculative_seconds = sum(r.speculative_seconds for r in ok)
    g.target_only_tokens = sum(r.target_only_tokens for r in ok)
    g.speculative_tokens = sum(r.speculative_tokens for r in ok)
    rate_ref = _ratio(g.target_only_tokens, g.target_only_seconds)
    rate_spec = _ratio(g.speculative_tokens, g.speculative_seconds)
    g.speedup = _ratio(rate_spec, rate_ref) if not math.isnan(rate_ref) else math.nan
    g.speedup_ci = bootstrap_speedup_ci(
        [r.target_only_tokens for r in ok], [r.target_only_seconds for r in ok],
        [r.speculative_tokens for r in ok], [r.speculative_seconds for r in ok], **ci,
    )
    loads = [r.row.load_avg_1m for r in ok if not math.isnan(r.row.load_avg_1m)]
    if loads:
        g.load_avg_1m, g.load_avg_1m_max = sum(loads) / len(loads), max(loads)
    g.num_cpus = usable_cpus()
    g.target_step_seconds = _ratio(sum(r.target_step_s for r in ok), sum(r.target_steps for r in ok))
    g.target_pass_seconds = _ratio(sum(r.target_pass_s for r in ok), sum(r.target_passes for r in ok))
    g.draft_pass_seconds = _ratio(sum(r.draft_pass_s for r in ok), sum(r.draft_passes for r in ok))
    g.cost_ratio = _ratio(g.draft_pass_seconds, g.target_step_seconds)
    g.verify_cost_ratio = _ratio(g.target_pass_seconds, g.target_step_seconds)
    if st.draft_forward_passes and st.target_forward_passes:
        g.cost_ratio_with_prefill = _ratio(
            st.draft_seconds / st.draft_forward_passes, st.target_seconds / st.target_forward_passes
        )
    if not (math.isnan(g.alpha_hat) or math.isnan(g.cost_ratio)):
        g.predicted_speedup = predicted_speedup(g.alpha_hat, g.cost_ratio, k)
        if not math.isnan(g.verify_cost_ratio):
            g.predicted_speedup_verify_adjusted = expected_tokens_per_step(g.alpha_hat, k) / (
                g.cost_ratio * k + g.verify_cost_ratio
            )
        g.recommended_num_draft_tokens, g.predicted_speedup_at_recommended = recommend_num_draft_tokens(
            g.alpha_hat, g.cost_ratio
        )
    audited = [r for r in ok if r.row.exact_match is not None]
    g.exactness_checked = len(audited)
    g.exactness_mismatches = sum(not r.row.exact_match for r in audited)
    return g


# --------------------------------------------------------------------------- entry point
def _drafter_parts(drafter: Any) -> tuple[Any, torch.nn.Module | None, str, str | None, dict | None]:
    """(object for speculative_generate, draft model or None, kind, ref, recipe)."""
    from specdec.drafters import ModelDrafter

    kind = getattr(drafter, "kind", None)
    if kind is not None and hasattr(drafter, "drafter"):  # a ResolvedDrafter
        obj, ref, recipe = drafter.drafter, drafter.ref, getattr(drafter, "recipe", None)
    else:
        obj, ref, recipe = drafter, None, None
    if isinstance(obj, NgramDrafter):
        return obj, None, kind or "ngram", ref, recipe
    if isinstance(obj, ModelDrafter):
        return obj, obj.model, kind or "model", ref, recipe
    if isinstance(obj, torch.nn.Module):
        return obj, obj, kind or "model", ref, recipe
    raise TypeError(f"drafter must be a causal LM, an NgramDrafter or a ResolvedDrafter, got {type(obj).__name__}")


def _eos_ids(tokenizer: Any, model: torch.nn.Module) -> Any:
    gc = getattr(model, "generation_config", None)
    eos = getattr(gc, "eos_token_id", None) if gc is not None else None
    if eos is None:
        eos = getattr(tokenizer, "eos_token_id", None)
    return eos


def environment() -> dict[str, Any]:
    """Where the numbers were measured: torch version, CPU model, cores, threads, GPU name."""
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": cpu,
        "nproc": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


def code_version() -> str:
    """Installed ``specdec`` version plus the git commit when run from a checkout."""
    import subprocess
    from importlib.metadata import PackageNotFoundError, version
    from pathlib import Path

    try:
        v = version("specdec")
    except PackageNotFoundError:  # pragma: no cover
        v = "0+unknown"
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except Exception:
        sha = ""
    return f"{v}+g{sha}" if sha else v


def validate_pair(
    target: Any,
    drafter: Any,
    heldout: HeldoutSet,
    config: ValidationConfig | None = None,
    *,
    tokenizer: Any = None,
    target_ref: str | None = None,
    progress: Callable[[int, int, PromptResult], None] | None = None,
) -> ValidationReport:
    """Measure how well ``drafter`` serves ``target`` on a held-out set.

    Args:
        target: a :class:`specdec.models.LoadedModel` (model + tokenizer), or a bare transformers
            causal LM together with ``tokenizer=``.
        drafter: a draft causal LM (``kind="model"``), an :class:`~specdec.NgramDrafter`
            (``"ngram"``), or a :class:`specdec.drafter_spec.ResolvedDrafter` (which carries its
            kind, ref and derivation recipe).
        heldout: the prompts; ``config.limit`` takes a stratified subset (seeded by ``config.seed``).
        config: :class:`ValidationConfig` (defaults: k=4, 64 new tokens, greedy).
        tokenizer: required when ``target`` is a bare model.
        target_ref: name recorded in the report (default: the LoadedModel's source ref or path).
        progress: called after each prompt as ``progress(done, total, row)`` (with
            ``config.batch_size`` > 1: once per prompt after its group is done).
    Returns:
        :class:`~specdec.report.ValidationReport` with ``overall`` and per-category
        :class:`~specdec.report.GroupMetrics` and one :class:`~specdec.report.PromptResult` per
        prompt (skipped prompts carry ``status="skipped"`` and the reason). Rates are in [0, 1],
        lengths in tokens, times in seconds, KL in nats.
    Raises:
        ValueError: bad config, or no tokenizer for a bare model.
        TypeError: unsupported drafter type.
    """
    cb = None if progress is None else (lambda done, total, rows: progress(done, total, rows[0]))
    return validate_pairs(target, [drafter], heldout, config, tokenizer=tokenizer, target_ref=target_ref, progress=cb)[0]


def validate_pairs(
    target: Any,
    drafters: list[Any],
    heldout: HeldoutSet,
    config: ValidationConfig | None = None,
    *,
    tokenizer: Any = None,
    target_ref: str | None = None,
    progress: Callable[[int, int, list[PromptResult]], None] | None = None,
) -> list[ValidationReport]:
    """:func:`validate_pair` for several drafters of one target, sharing the target's work.

    Per prompt, target-only decoding and the target's teacher-forced pass run once; each
    drafter's speculative run follows right after, so all speed ratios compare runs made under
    the same machine conditions. With ``config.batch_size`` B > 1 the same happens per group of
    B prompts (one batched target-only call, then one batched speculative call per drafter; see
    :class:`ValidationConfig`). Returns one report per drafter, in order; ``prompts`` keep the
    held-out order either way. ``progress`` gets the list of per-drafter rows of the prompt just
    done (with B > 1: of each prompt of the group just done, and of skipped prompts as they are
    found).

    Raises:
        ValueError: bad config, no drafter, no tokenizer for a bare model.
        TypeError: unsupported drafter type.
    """
    config = config or ValidationConfig()
    if not drafters:
        raise ValueError("validate_pairs needs at least one drafter")
    t_wall = time.perf_counter()
    bare = isinstance(target, torch.nn.Module)  # note: a causal LM also has a `.model` (its body)
    model = target if bare else target.model
    tok = tokenizer if tokenizer is not None else (None if bare else getattr(target, "tokenizer", None))
    if tok is None:
        raise ValueError("validate_pair needs a tokenizer: pass a LoadedModel or tokenizer=")
    if target_ref is None:
        source = getattr(target, "source", None) or {}
        target_ref = str(source.get("ref") or getattr(target, "path", None) or type(model).__name__)
    ctxs: list[_DrafterCtx] = []
    for drafter in drafters:
        obj, draft_model, kind, dref, recipe = _drafter_parts(drafter)
        if draft_model is model:  # same module as both: a copy, so the pass timers can tell them apart
            import copy

            draft_model = copy.deepcopy(model)
            obj = draft_model
        if draft_model is not None:
            draft_model.eval()
        ctxs.append(_DrafterCtx(obj, draft_model, kind, dref, recipe, _PassTimer(draft_model)))
    subset = heldout.subset(config.limit, seed=config.seed)
    eos = _eos_ids(tok, model)
    ctx_limit = _context_limit(model, *[c.model for c in ctxs])
    was_training = model.training
    model.eval()

    if config.warmup:
        _warmup(model, [c.obj for c in ctxs], subset, tok, config, eos, ctx_limit)
        if config.batch_size > 1:
            from specdec.validation_batch import warmup_batched

            warmup_batched(model, [c.obj for c in ctxs], subset, tok, config, eos, ctx_limit)

    per_drafter: list[list[_Run]] = [[] for _ in ctxs]
    t_timer = _PassTimer(model)
    try:
        t_timer.__enter__()
        for c in ctxs:
            c.timer.__enter__()
        if config.batch_size == 1:
            for i, prompt in enumerate(subset.prompts):
                runs = _run_prompt(prompt, model, tok, ctxs, config, eos, ctx_limit, t_timer, spec_first=i % 2 == 1)
                for acc, run in zip(per_drafter, runs):
                    acc.append(run)
                if progress is not None:
                    progress(i + 1, len(subset.prompts), [r.row for r in runs])
        else:
            from specdec.validation_batch import run_batched

            for runs in run_batched(subset.prompts, model, tok, ctxs, config, eos, ctx_limit, t_timer, progress):
                for acc, run in zip(per_drafter, runs):
                    acc.append(run)
    finally:
        t_timer.__exit__()
        for c in ctxs:
            c.timer.__exit__()
        model.train(was_training)

    k = config.num_draft_tokens
    agg = dict(seed=config.seed, n_resamples=config.bootstrap_resamples)
    common = dict(
        heldout_name=subset.name,
        heldout_version=subset.version,
        target_ref=target_ref,
        config=config.to_dict(),
        device=str(model_device(model)),
        dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
        code_version=code_version(),
        created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        alpha_hat_estimator=ALPHA_HAT_ESTIMATOR,
        heldout_source_version=subset.source_version,
        environment=environment(),
    )
    wall = time.perf_counter() - t_wall
    reports = []
    for c, runs in zip(ctxs, per_drafter):
        cats = sorted({r.row.category for r in runs})
        report = ValidationReport(
            **common,
            drafter_kind=c.kind,
            drafter_ref=c.ref,
            drafter_recipe=c.recipe,
            overall=aggregate(runs, k, **agg),
            categories={cat: aggregate([r for r in runs if r.row.category == cat], k, **agg) for cat in cats},
            prompts=[r.row for r in runs],
        )
        report.notes = _notes(report)
        report.wall_seconds = wall
        reports.append(report)
    return reports


def _warmup(model, drafters: list[Any], subset: HeldoutSet, tok, config: ValidationConfig, eos, ctx) -> None:
    """One short untimed generation of each kind on the shortest of the first prompts (not recorded)."""
    cands = [p for p in subset.prompts[:8] if not p.is_empty]
    if not cands:
        return
    ids = min((prompt_token_ids(p, tok) for p in cands), key=len)
    if not ids or (ctx is not None and len(ids) + 4 > ctx):
        return
    x = torch.tensor([ids], dtype=torch.long, device=model_device(model))
    n = min(4, config.max_new_tokens)
    autoregressive_generate(model, x, max_new_tokens=n, sampling=config.sampling, eos_token_id=eos)
    for d in drafters:
        speculative_generate(
            model, d, x, num_draft_tokens=config.num_draft_tokens, max_new_tokens=n, sampling=config.sampling,
            eos_token_id=eos,
        )


def _fmt_ci(ci: list[float]) -> str:
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]"


def _notes(r: ValidationReport) -> list[str]:
    """Plain-language findings for the summary and the report."""
    g = r.overall
    notes: list[str] = []
    if g.num_prompts == 0:
        notes.append("no prompt ran: every prompt was skipped (see prompts.csv skip_reason)")
        return notes
    if g.num_skipped:
        notes.append(f"{g.num_skipped} prompt(s) skipped (empty or too long); see prompts.csv")
    slow_measured = not math.isnan(g.speedup) and g.speedup < 1
    slow_pred = not math.isnan(g.predicted_speedup_at_recommended) and g.predicted_speedup_at_recommended < 1
    if slow_measured or slow_pred:
        notes.append(
            SLOWER_NOTE.format(
                speedup=g.speedup,
                pred=g.predicted_speedup,
                k=g.num_draft_tokens_k,
                best_k=g.recommended_num_draft_tokens,
                best=g.predicted_speedup_at_recommended,
                adj=g.predicted_speedup_verify_adjusted,
                c=g.cost_ratio,
                v=g.verify_cost_ratio,
            )
        )
    if all(not math.isnan(x) for x in (*g.alpha_hat_ci, *g.alpha_tf_ci)) and (
        g.alpha_hat_ci[1] < g.alpha_tf_ci[0] or g.alpha_tf_ci[1] < g.alpha_hat_ci[0]
    ):
        notes.append(
            f"alpha_hat {g.alpha_hat:.3f} {_fmt_ci(g.alpha_hat_ci)} and alpha_tf {g.alpha_tf:.3f} "
            f"{_fmt_ci(g.alpha_tf_ci)} disagree beyond their 95% CIs: acceptance is not i.i.d. along the "
            "sequence (expected for n-gram copy runs, see docs/metrics.md) or the pair/decoding is off"
        )
    if r.drafter_kind == "ngram":
        notes.append(
            "n-gram drafter: alpha_tf/top-1/TV are over the positions where the lookup proposes "
            f"(coverage {g.tf_coverage:.0%}); KL is undefined for a one-hot q; the predicted speedup "
            f"assumes a full proposal every step, but only {g.draft_tokens_per_step:.2f} of k={g.num_draft_tokens_k} "
            "tokens are proposed per step on average and misses are plain target steps"
        )
    if g.exactness_mismatches:
        bad = [p for p in r.prompts if p.exact_match is False]
        margins = [p.divergence_logit_margin for p in bad if p.divergence_logit_margin is not None]
        notes.append(
            f"exactness audit: {g.exactness_mismatches}/{g.exactness_checked} greedy outputs differ from "
            f"target-only; largest target logit margin at the divergence "
            f"{max(margins) if margins else float('nan'):.3g} (small = numeric near-tie, large = bug)"
        )
    return notes
