"""Hand-built :class:`~specdec.validation.report.ValidationReport` objects (no models).

:func:`make_report`: a consistent report around one acceptance rate, with per-prompt rows drawn
around each category's rate (monitoring's rules, history and alerts).
:func:`tiny_report`: a small report with the headline numbers a registry test names (CI,
exactness mismatches, predicted speedup, per-position acceptance).
"""

from __future__ import annotations

import math
import random

from specdec.validation.report import GroupMetrics, PromptResult, ValidationReport


def _group(acc: float, ci_half: float, n_tokens: int, k: int, *, alpha_tf: float | None = None,
           tf_half: float = 0.02, alpha_hat: float | None = None, hat_half: float | None = None,
           tokens_per_step: float | None = None, prompts: int = 0) -> GroupMetrics:
    tps = float(k) if tokens_per_step is None else tokens_per_step
    drafts = max(int(round(n_tokens / tps)) if tps > 0 else n_tokens, 1)
    accepted = int(round(acc * n_tokens))
    a_tf = acc if alpha_tf is None else alpha_tf
    a_hat = acc if alpha_hat is None else alpha_hat  # alpha_hat and the floor's per-token metric; = acc unless given
    hat_half = (ci_half if alpha_hat is None else 0.02) if hat_half is None else hat_half
    return GroupMetrics(
        num_prompts=prompts, num_speculative_tokens=k, num_drafts=drafts, num_draft_tokens=n_tokens,
        num_accepted_tokens=accepted, accepted_per_position=[accepted // max(k, 1)] * k,
        num_emitted_tokens=64 * prompts, acceptance_rate=acc,  # 64 new tokens per prompt, as the rows say
        acceptance_rate_ci=[max(acc - ci_half, 0.0), min(acc + ci_half, 1.0)],
        mean_accepted_length=1 + accepted / drafts, draft_tokens_per_step=n_tokens / drafts,
        alpha_hat=a_hat, alpha_hat_ci=[max(a_hat - hat_half, 0.0), min(a_hat + hat_half, 1.0)],
        per_token_acceptance=a_hat, per_token_acceptance_ci=[max(a_hat - hat_half, 0.0), min(a_hat + hat_half, 1.0)],
        num_tf_positions=n_tokens, alpha_tf=a_tf,
        alpha_tf_ci=[max(a_tf - tf_half, 0.0), min(a_tf + tf_half, 1.0)],
        top1_agreement=min(a_tf + 0.05, 1.0), total_variation=1 - a_tf, kl_divergence=0.1,
        speedup=1.0 + acc, predicted_speedup=1.0 + acc,
    )


def make_report(
    acceptance: float = 0.63, *, ci_half: float = 0.03, num_draft_tokens: int = 2000, k: int = 4,
    categories: dict[str, float] | None = None, category_tokens: int = 500,
    num_prompts: int = 40, prompt_spread: float = 0.05, seed: int = 0,
    heldout_name: str = "spec-bench-mini", heldout_version: str = "1", code_version: str = "0.1.0",
    **group_kw,
) -> ValidationReport:
    """A consistent :class:`ValidationReport` built from the dataclasses (no models).

    Args:
        acceptance: pooled acceptance rate; CI is ``acceptance +- ci_half``. The per-token
            acceptance ``per_token_acceptance`` (the policy's default metric) and ``alpha_hat`` are
            the same value and CI unless ``alpha_hat`` (CI +- ``hat_half``, default 0.02) is given.
        num_draft_tokens: evidence size overall (drafted tokens). k: num_speculative_tokens.
        categories: name -> acceptance rate per category (``category_tokens`` tokens each).
        num_prompts / prompt_spread / seed: per-prompt rows drawn around their category's rate.
        group_kw: ``alpha_tf``, ``alpha_hat``, ``tf_half``, ``hat_half``, ``tokens_per_step``.
    """
    categories = categories if categories is not None else {"chat": acceptance}
    rng = random.Random(seed)
    names = sorted(categories)
    prompts = []
    for i in range(num_prompts):
        cat = names[i % len(names)]
        base = categories[cat]
        acc = min(max(base + rng.uniform(-prompt_spread, prompt_spread), 0.0), 1.0)
        ndt = max(num_draft_tokens // max(num_prompts, 1), 1)
        prompts.append(PromptResult(
            prompt_id=f"p{i:03d}", category=cat, prompt_tokens=20, new_tokens=64, num_drafts=ndt // k or 1,
            num_draft_tokens=ndt, num_accepted_tokens=int(acc * ndt), acceptance_rate=acc, alpha_hat=acc, per_token_acceptance=acc,
            num_tf_positions=64, alpha_tf=min(acc + 0.02, 1.0), top1_agreement=min(acc + 0.05, 1.0),
            total_variation=1 - acc, kl_divergence=0.1, target_only_seconds=1.0, speculative_seconds=0.8,
            exact_match=True,
        ))
    per_cat = max(num_prompts // max(len(names), 1), 1)
    return ValidationReport(
        heldout_name=heldout_name, heldout_version=heldout_version, target_ref="tiny/target",
        drafter_kind="derived:int8", drafter_ref=None,
        config={"num_speculative_tokens": k, "max_new_tokens": 64, "temperature": 0.0, "top_k": None,
                "top_p": None, "seed": 0, "limit": num_prompts},
        device="cpu", dtype="float32", code_version=code_version, created_at="2026-11-29T02:00:00+00:00",
        overall=_group(acceptance, ci_half, num_draft_tokens, k, prompts=num_prompts, **group_kw),
        categories={c: _group(a, ci_half * 2, category_tokens, k, prompts=per_cat) for c, a in categories.items()},
        prompts=prompts, wall_seconds=12.5,
    )


def tiny_report(
    acceptance_rate: float = 0.7,
    ci: tuple[float, float] | None = None,
    *,
    exactness_mismatches: int = 0,
    predicted_speedup: float = 1.5,
    categories: dict[str, float] | None = None,
    num_speculative_tokens: int = 4,
    heldout_name: str = "tiny-heldout",
    heldout_version: str = "sha256:0000",
):
    """A hand-built :class:`~specdec.validation.report.ValidationReport` with the given headline numbers.

    Args:
        acceptance_rate: pooled acceptance rate in [0, 1].
        ci: 95% CI (default ``rate ± 0.05`` clipped to [0, 1]).
        exactness_mismatches: greedy exactness-audit failures (of 3 audited prompts).
        categories: category -> acceptance rate (default summarization/coding/qa around ``acceptance_rate``).
    """
    lo, hi = ci if ci else (max(acceptance_rate - 0.05, 0.0), min(acceptance_rate + 0.05, 1.0))
    k = num_speculative_tokens
    per_pos = [acceptance_rate ** (0.5 + 0.5 * i) for i in range(k)]
    cats = categories if categories is not None else {
        "summarization": acceptance_rate, "coding": min(acceptance_rate + 0.1, 1.0), "qa": max(acceptance_rate - 0.1, 0.0)}

    def group(rate: float, n: int) -> GroupMetrics:
        drafted = 40 * n
        return GroupMetrics(
            num_prompts=n, num_speculative_tokens=k, num_drafts=10 * n, num_draft_tokens=drafted,
            num_accepted_tokens=round(rate * drafted), accepted_per_position=[round(p * 10 * n) for p in per_pos],
            num_emitted_tokens=round(rate * drafted) + 10 * n, acceptance_rate=rate,
            acceptance_rate_ci=[max(rate - (acceptance_rate - lo), 0.0), min(rate + (hi - acceptance_rate), 1.0)],
            mean_accepted_length=1 + rate * k, per_position_acceptance=per_pos, draft_tokens_per_step=float(k),
            alpha_hat=rate, per_token_acceptance=rate, alpha_tf=rate, top1_agreement=min(rate + 0.05, 1.0), total_variation=1 - rate,
            kl_divergence=-math.log(max(rate, 1e-6)), speedup=predicted_speedup * 0.9, cost_ratio=0.3,
            predicted_speedup=predicted_speedup, recommended_num_speculative_tokens=k,
            exactness_checked=3 if n > 1 else 1, exactness_mismatches=exactness_mismatches if n > 1 else 0,
        )

    overall = group(acceptance_rate, 3 * max(len(cats), 1))
    cat_groups = {c: group(r, 3) for c, r in cats.items()}
    overall.acceptance_rate_ci = [lo, hi]
    for g in (overall, *cat_groups.values()):  # the floor's per-token metric: the same numbers here
        g.alpha_hat_ci = list(g.acceptance_rate_ci)
        g.per_token_acceptance_ci = list(g.acceptance_rate_ci)
    prompts = [PromptResult(prompt_id=f"{c}-{i}", category=c, prompt_tokens=12, new_tokens=32, acceptance_rate=r,
                            exact_match=True) for c, r in cats.items() for i in range(3)]
    return ValidationReport(
        heldout_name=heldout_name, heldout_version=heldout_version, target_ref="tiny-target", drafter_kind="model",
        drafter_ref="tiny-draft",
        config={"num_speculative_tokens": k, "max_new_tokens": 32, "temperature": 0.0, "top_k": None, "top_p": None, "seed": 0},
        device="cpu", dtype="float32", code_version="test", created_at="2026-01-01T00:00:00+00:00",
        overall=overall, categories=cat_groups, prompts=prompts, wall_seconds=1.0,
    )
