"""How many prompts and new tokens ``make demo`` can afford on this CPU.

The demo must finish within :data:`BUDGET_S` (10 minutes) on the slowest CPU the project runs on.
Almost all of its time is decoding, which scales with the target's one-token pass time ``t1``; so the
demo measures ``t1`` first (:func:`one_token_pass_seconds`, median of warm fp32 passes) and picks the
largest held-out size (prompts per category, new tokens) whose predicted time fits
(:func:`choose`), instead of a fixed prompt count.

Cost model (:func:`predicted_seconds`), in seconds::

    FIXED_S + t1 * (FINETUNE_T1 + T1_PER_PROMPT_TOKEN * prompt_runs * max_new_tokens)

``prompt_runs`` counts prompt validations: recommend's replay on one prompt per category, its speed
check of each candidate on the nightly's prompts, and three nights. The constants are fitted to idle
demo runs; their derivation and the runs that check them: ``benchmarks/results/demo.md``.
Night 2's stale pair costs a quarter more than a healthy night (short blocks), and a timing-suspect
night re-times its slow prompts once: :data:`MARGIN` keeps room for both.

A size must also give the promotion gate its evidence (``GateConfig.min_draft_tokens`` drafted tokens
in night 1): a healthy pair drafts about :data:`DRAFTED_PER_TOKEN` tokens per emitted token at the k
recommend picks (k/(k + 1), k >= 4), so a night must emit ``min_draft_tokens / DRAFTED_PER_TOKEN``
tokens. On a CPU too slow for any such size within the margin, the cheapest one with the evidence is
taken if it fits the whole budget (a demo that cannot promote tells no story).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

BUDGET_S = 600.0
#: share of the budget the prediction may use (the rest absorbs night 2, re-timing and load noise)
MARGIN = 0.85
FIXED_S = 35.0
FINETUNE_T1 = 1200.0
T1_PER_PROMPT_TOKEN = 2.5
#: (prompts per category, new tokens), most informative first; the demo takes the first that fits
CHOICES = ((2, 48), (2, 40), (2, 32), (1, 48), (1, 40), (1, 32))
CATEGORIES = 6
NUM_CANDIDATES = 2
NIGHTS = 3
#: drafted tokens per emitted token of a healthy pair at k >= 4 (k / (k + 1))
DRAFTED_PER_TOKEN = 0.8


@dataclass(frozen=True)
class DemoBudget:
    """The demo's held-out size: ``per_category`` prompts of each of the 6 categories, ``max_new_tokens``
    per prompt; ``t1_ms`` the measured one-token pass, ``predicted_s`` the cost model's total, and
    ``fits`` whether it is within ``MARGIN * BUDGET_S`` (False: even the smallest choice does not fit)."""

    per_category: int
    max_new_tokens: int
    t1_ms: float
    predicted_s: float
    fits: bool

    def to_dict(self) -> dict:
        """Plain dict (``demo_summary.json``)."""
        return {"per_category": self.per_category, "max_new_tokens": self.max_new_tokens, "t1_ms": self.t1_ms,
                "predicted_s": self.predicted_s, "fits": self.fits, "budget_s": BUDGET_S}


def predicted_seconds(t1_s: float, per_category: int, max_new_tokens: int) -> float:
    """The cost model (module docstring): predicted demo seconds for this held-out size at ``t1_s``."""
    prompts = per_category * CATEGORIES
    prompt_runs = CATEGORIES + NUM_CANDIDATES * prompts + NIGHTS * prompts
    return FIXED_S + t1_s * (FINETUNE_T1 + T1_PER_PROMPT_TOKEN * prompt_runs * max_new_tokens)


def has_evidence(per_category: int, max_new_tokens: int, min_draft_tokens: int) -> bool:
    """Whether a night of this size drafts at least ``min_draft_tokens`` tokens (module docstring);
    the first token of each prompt comes from the prefill."""
    return per_category * CATEGORIES * (max_new_tokens - 1) * DRAFTED_PER_TOKEN >= min_draft_tokens


def choose(t1_s: float, min_draft_tokens: int = 0) -> DemoBudget:
    """The first of :data:`CHOICES` with the gate's evidence (:func:`has_evidence`) whose predicted time
    is within ``MARGIN * BUDGET_S``; else the cheapest with the evidence, ``fits`` saying whether it is
    within ``BUDGET_S``. When no choice has the evidence, the largest choice stands in for them.

    Raises:
        ValueError: ``t1_s`` not positive.
    """
    if not t1_s > 0:
        raise ValueError(f"one-token pass time must be > 0 s, got {t1_s!r}")
    sized = [(pc, new, predicted_seconds(t1_s, pc, new)) for pc, new in CHOICES
             if has_evidence(pc, new, min_draft_tokens)] or [(*CHOICES[0], predicted_seconds(t1_s, *CHOICES[0]))]
    for per_cat, new, s in sized:
        if s <= MARGIN * BUDGET_S:
            return DemoBudget(per_cat, new, t1_s * 1e3, s, True)
    per_cat, new, s = min(sized, key=lambda x: x[2])
    return DemoBudget(per_cat, new, t1_s * 1e3, s, s <= BUDGET_S)


#: a busy factor above this is announced at the demo's start (other work lengthens it by more than a quarter)
BUSY_ABOVE = 1.25


def busy_factor(load_1m: float, cpus: int) -> float:
    """How much longer the demo takes than on an idle machine when other work already keeps ``load_1m``
    (the 1-minute load average before the demo starts) runnable threads on ``cpus`` CPUs: the demo runs
    one thread per CPU, so ``cpus`` threads of its own share the CPUs with ``load_1m`` others, a factor
    ``(load_1m + cpus) / cpus`` (1.0 idle; 2.25 at load 2.5 on 2 CPUs). An approximation: fair-share
    scheduling of CPU-bound threads, memory bandwidth not counted.

    Raises:
        ValueError: ``cpus`` < 1.
    """
    if cpus < 1:
        raise ValueError(f"cpus must be >= 1, got {cpus!r}")
    return max(1.0, (max(load_1m, 0.0) + cpus) / cpus)


def busy_note(load_1m: float, cpus: int, idle_s: float) -> str | None:
    """``the machine is busy: load 2.5 on 2 CPUs from other work; expect the demo to take about 2.2x as long
    as on an idle machine (~22 min instead of ~10)`` when :func:`busy_factor` exceeds :data:`BUSY_ABOVE`,
    else None. ``idle_s``: the demo's predicted seconds on the idle machine."""
    f = busy_factor(load_1m, cpus)
    if f <= BUSY_ABOVE:
        return None
    return (f"the machine is busy: load {load_1m:.1f} on {cpus} CPUs from other work; expect the demo to take about "
            f"{f:.1f}x as long as on an idle machine (~{f * idle_s / 60:.0f} min instead of ~{idle_s / 60:.0f})")


def one_token_pass_seconds(model, reps: int = 9) -> float:
    """Median wall seconds of a warm one-token forward pass of ``model`` (fp32, a 32-token KV cache),
    the unit the cost model counts in."""
    import torch

    from specdec.core.kv import new_cache

    ids = torch.zeros(1, 32, dtype=torch.long)
    with torch.inference_mode():
        cache = new_cache(model)
        model(input_ids=ids, past_key_values=cache, use_cache=True)
        times = []
        for _ in range(reps + 2):
            t0 = time.perf_counter()
            model(input_ids=ids[:, :1], past_key_values=cache, use_cache=True)
            times.append(time.perf_counter() - t0)
    return statistics.median(times[2:])
