"""One prompt's outcome under one drafter: counters, seconds, teacher-forced agreement, exactness audit."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from specdec.core.stats import DecodingStats
from specdec.validation.config import ValidationConfig
from specdec.validation.heldout import HeldoutPrompt
from specdec.validation.metrics import AgreementSums
from specdec.validation.report import PromptResult
from specdec.validation.teacher_forcing import TargetTeacherForcing, draft_agreement
from specdec.validation.timing import PassTimer


@dataclass
class PromptRun:
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
    remeasured: bool = False  # re-timed because one side ran under load (runner.remeasure_if_loaded)
    # prompt tokens the draft model prefilled itself (0: it adopted the target's prompt KV, or no draft model)
    draft_prefill_tokens: int = 0

    @property
    def ok(self) -> bool:
        """True if the prompt ran (not skipped)."""
        return self.row.status == "ok"


def prompt_seed(seed: int, prompt_id: str) -> int:
    """A per-prompt seed that does not depend on which other prompts are in the subset."""
    h = hashlib.sha256(f"{seed}:{prompt_id}".encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


def context_limit(*models: torch.nn.Module | None) -> int | None:
    """The smallest ``max_position_embeddings`` of the models (tokens), or None if none declares one."""
    limits = [getattr(m.config, "max_position_embeddings", None) for m in models if m is not None and hasattr(m, "config")]
    limits = [int(x) for x in limits if x]
    return min(limits) if limits else None


@dataclass
class DrafterUnderTest:
    """One drafter under validation: the object decoding uses, its model (None for n-gram and heads),
    its pass timer (on the draft model, or on an EAGLE-3 head's module: c is per head pass)."""

    obj: Any
    model: torch.nn.Module | None
    kind: str
    ref: str | None
    recipe: dict | None
    timer: PassTimer


def skip_reason(prompt: HeldoutPrompt, ids: list[int], config: ValidationConfig, ctx_limit: int | None) -> str | None:
    """Why ``prompt`` (tokenized as ``ids``) cannot be validated (empty, too long), or None."""
    if prompt.is_empty:
        return "empty prompt"
    if not ids:
        return "empty prompt (no tokens)"
    if ctx_limit is not None and len(ids) + config.max_new_tokens > ctx_limit:
        return f"prompt too long: {len(ids)} tokens + max_new_tokens {config.max_new_tokens} > context {ctx_limit}"
    return None


@dataclass
class Outcome:
    """One prompt's two timed generations: the speculative tokens and their counters, the target-only
    tokens, and the wall seconds charged to each (its token share of a batched call)."""

    spec_tokens: list[int]
    stats: DecodingStats
    ref_tokens: list[int]
    target_only_seconds: float
    speculative_seconds: float


def record_counters(row: PromptResult, s: DecodingStats) -> None:
    """A prompt row's counters and rates from its :class:`DecodingStats` (decoded or replayed)."""
    row.num_drafts, row.num_draft_tokens, row.num_accepted_tokens = s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens
    row.acceptance_rate, row.mean_accepted_length = s.acceptance_rate, s.mean_accepted_length
    row.alpha_hat, row.per_token_acceptance = s.alpha_hat, s.per_token_acceptance


def fill_run(run: PromptRun, out: Outcome, tf: TargetTeacherForcing | None, d: DrafterUnderTest,
             config: ValidationConfig) -> None:
    """Fill ``run`` and its row from one prompt's :class:`Outcome`, the drafter's teacher-forced
    agreement and, greedy only, the exactness audit against the target-only tokens."""
    row, spec_tokens, ref_tokens = run.row, out.spec_tokens, out.ref_tokens
    run.stats = out.stats
    run.target_only_seconds, run.speculative_seconds = out.target_only_seconds, out.speculative_seconds
    run.target_only_tokens, run.speculative_tokens = len(ref_tokens), len(spec_tokens)
    row.new_tokens, row.target_only_tokens = len(spec_tokens), len(ref_tokens)
    record_counters(row, out.stats)
    row.target_only_seconds, row.speculative_seconds = out.target_only_seconds, out.speculative_seconds

    if tf is not None:
        run.agree = draft_agreement(tf, d.model, d.obj if d.model is None else None, config.sampling,
                                    chain=config.num_speculative_tokens)
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


def seeded_generator(seed: int, device: torch.device) -> torch.Generator:
    """A ``torch.Generator`` on ``device`` (CPU unless CUDA) seeded with ``seed``."""
    g = torch.Generator(device=device) if device.type == "cuda" else torch.Generator()
    return g.manual_seed(seed)
