"""How many prompts and new tokens ``make demo`` can afford on this CPU, and whether night 2's floor can decide.

The demo must finish within :data:`BUDGET_S` (10 minutes) on the slowest 2-core CPU the project runs on, and
its night 2 (the stale pair) must be *decided* by the 40% floor: the upper end of the acceptance rate's 95% CI
below the floor, not a CI that straddles it. Before sizing itself the demo measures the unit costs of this
machine (:func:`measure`): the fp32 target's one-token pass ``t1``, its prefill per prompt token ``p``, and the
story draft's one-token pass and prefill over the target's (``c``, ``c_p``). A bf16 draft on a CPU without
native bf16 is emulated and costs several target passes (c > 1): the old model counted every prompt-token at
2.5 ``t1`` whatever the draft cost, and predicted 516 s for a run of 1,173 s there.

Cost model (:func:`phase_seconds`), per phase, in seconds; ``P`` prompts of ``L_i`` prompt tokens, ``T`` new
tokens, the draft proposing k per step with per-token acceptance α:

- a validation of one pair (a night; recommend's speed check of one candidate): per prompt, target-only
  ``(T - 1) t1``, the speculative run ``(T - 1) / (accepted + 1 per step) x (c k + v) t1`` (the one speed model,
  :func:`specdec.validation.speed.predicted_speedup` of i.i.d. counters), and the prefills: the target's on
  both runs and its teacher-forced pass over ``L + T`` (``p (3 L + T)``), the draft's teacher-forced pass
  (``c_p p (L + T)``) and, for a draft that cannot adopt the target's prompt KV (the stale pair), its own
  prompt (``c_p p L``); plus the pass-cost calibration (``CALIBRATION_ROUNDS (k + 1) (v + c) t1``) and
  :data:`NIGHT_FIXED_S` (Prefect flow, model loads, report, Evidently, history);
- recommend (none where bf16 is emulated and the draft's c >= :data:`CANNOT_PAY_C`: no k can pay): the pass
  costs of the target and the draft at every k (``COST_ROUNDS x sum_k (v(k) + c) t1``), the
  replay on one prompt per category (the pair's continuation, its teacher-forced passes), and on those prompts
  the speed check of the draft (at the k it would pick) and of the n-gram drafter;
- the fine-tune: ``steps x (FINETUNE_PREFILLS batch seq p + OPTIMIZER_T1 t1)`` (forward and backward over the
  batch at the prefill rate, the fused AdamW step over every weight at the memory-bound rate of a one-token pass);
- :data:`FIXED_S`: model load and conversion cache hit, MLflow and Prefect, registrations, promotions.

The constants are fitted to idle demo runs and checked against them in ``benchmarks/results/demo.md``; every
run records each phase's prediction next to its measured time (``demo_summary.json``: ``budget.phases``).

The floor (:func:`floor_upper`): night 2's acceptance rate at k and the spread of its per-prompt rates were
measured for :data:`flows.finetune.DEMO_RECIPE` on the demo's prompts (:data:`STALE_RATE`,
:data:`STALE_PROMPT_SD`); the CI's upper end is about ``rate + 1.96 sd / sqrt(P)``. A size decides when that
is below the floor by :data:`FLOOR_MARGIN`. The demo takes the first of :data:`CHOICES` that decides, fits
``MARGIN x BUDGET_S`` and gives the promotion gate its evidence; else the most decisive one that fits the
budget; else the cheapest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

BUDGET_S = 600.0
#: share of the budget the prediction may use (the rest absorbs re-timed prompts and load noise)
MARGIN = 0.85
#: model load (cache hit), MLflow and Prefect start, three registrations and two promotions
FIXED_S = 40.0
#: per night: the Prefect flow, loading the pair, the report, Evidently, the history row and alerts
NIGHT_FIXED_S = 14.0
#: the calibration's timed rounds per width (specdec.validation.timing.calibrate: reps 7, one warm-up)
CALIBRATION_ROUNDS = 8
#: recommend's pass-cost rounds (cost_reps 10, one warm-up) at every k
COST_ROUNDS = 11
#: v(k): the target's pass over k + 1 tokens, in one-token passes (SmolLM2 fp32, 2 threads, AMD EPYC: v(4) = 1.25,
#: v(5) = 1.35, v(6) = 1.7 measured, docs/metrics.md; the smaller k interpolated)
VERIFY_T1 = {1: 1.1, 2: 1.15, 3: 1.2, 4: 1.25, 5: 1.35, 6: 1.7}
#: a fused AdamW step plus zeroing and clipping the gradients, in one-token passes (memory-bound: ~7 weight copies)
OPTIMIZER_T1 = 10.0
#: a training step's forward and backward over its batch, in prefills of as many tokens (fitted: 40 x 4 x 64
#: took 75 s at t1 59.5 ms and 112 s at 82.5 ms with a prefill of about 0.045 t1 per token)
FINETUNE_PREFILLS = 2.0
#: per-token acceptance of the healthy pair (nights 1 and 3: 0.978-0.997 measured) and of the stale one
HEALTHY_ALPHA = 0.98
STALE_ALPHA = 0.5
#: the n-gram drafter's speculative run costs about a target-only run on these prompts (speedup 0.86-1.16 measured)
NGRAM_T1_PER_TOKEN = 1.0
#: k when no draft pays here (the story's k; flows.demo uses it too)
NO_SPEED_K = 4
#: a draft whose one-token pass costs this many target passes cannot pay at any k (a step of k drafts costs at
#: least k + 1 passes for at most k + 1 tokens): without native bf16 the demo does not time the candidates
CANNOT_PAY_C = 1.0
#: recommend's k candidates
K_VALUES = tuple(range(1, 7))
#: night 2's acceptance rate at k = 4 and the SD of its per-prompt rates with DEMO_RECIPE on the demo's prompts
#: (0.192 [0.139, 0.271], SD 0.176 over 2 x 32; benchmarks/results/2026-12-07-demo-floor-cpu.md)
STALE_RATE = 0.20
STALE_PROMPT_SD = 0.17
FLOOR = 0.40
#: the CI's upper end must be this far below the floor for a size to count as deciding (a run's rate varies)
FLOOR_MARGIN = 0.05
#: (prompts per category, new tokens), most informative first
CHOICES = ((4, 32), (4, 24), (3, 32), (3, 24), (2, 32), (2, 24), (1, 48))
CATEGORIES = 6
#: drafted tokens per emitted token of a healthy pair at k >= 4 (k / (k + 1))
DRAFTED_PER_TOKEN = 0.8
#: tokens of the prefill probe (:func:`measure`)
PROBE_TOKENS = 256
FINETUNE_SHAPE = ("steps", "batch_size", "seq_len")


@dataclass(frozen=True)
class UnitCosts:
    """This machine's unit costs (:func:`measure`): ``t1_s`` the fp32 target's one-token pass (s), ``prefill_s``
    its prefill per prompt token (s, a pass over :data:`PROBE_TOKENS`), ``c`` the story draft's one-token pass
    over ``t1_s`` and ``c_prefill`` its prefill over the target's (both 0 for a drafter without a model);
    ``native_bf16``: the CPU runs bf16 natively (then the demo times the candidates whatever c reads)."""

    t1_s: float
    prefill_s: float
    c: float
    c_prefill: float
    native_bf16: bool = False

    def __post_init__(self) -> None:
        if not (self.t1_s > 0 and self.prefill_s > 0 and self.c >= 0 and self.c_prefill >= 0):
            raise ValueError(f"unit costs must be positive (t1, prefill) and >= 0 (c, c_prefill), got {self}")

    def scaled(self, factor: float) -> "UnitCosts":
        """The same machine idle: the seconds divided by ``factor`` (:func:`busy_factor`), the ratios kept."""
        return UnitCosts(self.t1_s / factor, self.prefill_s / factor, self.c, self.c_prefill, self.native_bf16)


@dataclass(frozen=True)
class Size:
    """A held-out size: ``per_category`` prompts of each category, ``max_new_tokens`` each, and the prompts'
    token counts (``prompt_tokens``, chat template applied: their prefills)."""

    per_category: int
    max_new_tokens: int
    prompt_tokens: tuple[int, ...]

    @property
    def prompts(self) -> int:
        return len(self.prompt_tokens)


@dataclass(frozen=True)
class DemoBudget:
    """The demo's held-out size (``per_category`` x ``max_new_tokens``), the unit costs it was chosen with,
    ``predicted_s`` (the cost model's total) and ``phases`` (per phase), ``fits`` (within ``BUDGET_S``),
    ``floor_upper`` (night 2's predicted CI upper end) and ``decides`` (below the floor by the margin)."""

    per_category: int
    max_new_tokens: int
    units: UnitCosts
    k: int
    predicted_s: float
    phases: dict = field(default_factory=dict)
    fits: bool = True
    floor_upper: float = math.nan
    decides: bool = True

    @property
    def t1_ms(self) -> float:
        return self.units.t1_s * 1e3

    def to_dict(self) -> dict:
        """Plain dict (``demo_summary.json``)."""
        return {"per_category": self.per_category, "max_new_tokens": self.max_new_tokens, "t1_ms": self.t1_ms,
                "prefill_ms_per_token": self.units.prefill_s * 1e3, "draft_cost_ratio": self.units.c,
                "draft_prefill_ratio": self.units.c_prefill, "native_bf16": self.units.native_bf16, "k": self.k,
                "predicted_s": self.predicted_s,
                "phases": {k: round(v, 1) for k, v in self.phases.items()}, "fits": self.fits,
                "floor_upper": self.floor_upper, "decides": self.decides, "budget_s": BUDGET_S}


def _speculative_t1_per_token(alpha: float, k: int, c: float) -> float:
    """One emitted token of a speculative run, in one-token target passes: the i.i.d. counters of one step at
    per-token acceptance ``alpha`` costed by the one speed model (``c k + v`` per step, ``accepted + 1`` tokens)."""
    from specdec.validation.speed import StepCounters, VerifyCost, predicted_speedup

    return 1.0 / predicted_speedup(StepCounters.iid(alpha, k), c, VerifyCost.fit(VERIFY_T1))


def story_k(units: UnitCosts) -> tuple[int, int]:
    """``(k recommend picks for the draft, k the nights run at)``: the best k of the speed model at
    :data:`HEALTHY_ALPHA` and this machine's c; the nights run at it when it pays, else at :data:`NO_SPEED_K`."""
    cost = {k: _speculative_t1_per_token(HEALTHY_ALPHA, k, units.c) for k in K_VALUES}
    best = min(cost, key=cost.get)
    return best, best if cost[best] < 1.0 else NO_SPEED_K


def validation_seconds(units: UnitCosts, size: Size, *, alpha: float, k: int, adopts: bool = True,
                       ngram: bool = False) -> float:
    """One pair's decode validation of ``size`` (module docstring), without :data:`NIGHT_FIXED_S`:
    target-only and speculative runs, the prefills and teacher-forced passes, the pass-cost calibration.
    ``adopts``: the draft adopts the target's prompt KV (False: a draft of an earlier target prefills the
    prompt itself); ``ngram``: the n-gram drafter (no draft model)."""
    t, p, n, T = units.t1_s, units.prefill_s, size.prompts, size.max_new_tokens
    L = sum(size.prompt_tokens)
    c, cp = (0.0, 0.0) if ngram else (units.c, units.c_prefill)
    spec = NGRAM_T1_PER_TOKEN if ngram else _speculative_t1_per_token(alpha, k, c)
    decode = n * (T - 1) * t * (1.0 + spec)
    prefill = p * (3 * L + n * T) + cp * p * (L + n * T + (0 if adopts else L))
    return decode + prefill + CALIBRATION_ROUNDS * (k + 1) * (VERIFY_T1[k] + c) * t


def _one_per_category(size: Size) -> tuple[float, Size]:
    """The prompt tokens of one prompt per category, each of the held-out set's mean length, and that subset's
    :class:`Size` (what recommend's replay and speed check run on)."""
    one = CATEGORIES * sum(size.prompt_tokens) / size.prompts
    return one, Size(1, size.max_new_tokens, (round(one / CATEGORIES),) * CATEGORIES)


def recommend_seconds(units: UnitCosts, size: Size) -> float:
    """``specdec draft recommend`` as the demo runs it: the pass costs at every k, then on one prompt per category
    the replay and the speed check of the draft (at the k it picks) and of the n-gram drafter."""
    t, p, T = units.t1_s, units.prefill_s, size.max_new_tokens
    k_draft, _ = story_k(units)
    costs = COST_ROUNDS * sum(VERIFY_T1[k] + units.c for k in K_VALUES) * t
    one, sub = _one_per_category(size)
    replay = (CATEGORIES * (T - 1) * t * _speculative_t1_per_token(HEALTHY_ALPHA, k_draft, units.c)
              + p * (2 * one + CATEGORIES * T) + units.c_prefill * p * (one + CATEGORIES * T))
    check = (validation_seconds(units, sub, alpha=HEALTHY_ALPHA, k=k_draft)
             + validation_seconds(units, sub, alpha=0.0, k=NO_SPEED_K, ngram=True))
    return costs + replay + check


def finetune_seconds(units: UnitCosts, recipe: dict) -> float:
    """The fine-tune's training loop: per step, forward and backward over ``batch_size x seq_len`` tokens
    (:data:`FINETUNE_PREFILLS` prefills' worth) and the optimizer step (:data:`OPTIMIZER_T1` one-token passes)."""
    steps, batch, seq = (int(recipe[k]) for k in FINETUNE_SHAPE)
    return steps * (FINETUNE_PREFILLS * batch * seq * units.prefill_s + OPTIMIZER_T1 * units.t1_s)


def phase_seconds(units: UnitCosts, size: Size, recipe: dict) -> dict[str, float]:
    """The predicted seconds of each phase of the demo (module docstring), keyed as ``demo_summary.json``'s
    ``timings_s`` (``fixed`` stands for the model fetch, the registrations and the promotions)."""
    _, k = story_k(units)
    healthy = validation_seconds(units, size, alpha=HEALTHY_ALPHA, k=k) + NIGHT_FIXED_S
    stale = validation_seconds(units, size, alpha=STALE_ALPHA, k=k, adopts=False) + NIGHT_FIXED_S
    rec = recommend_seconds(units, size) if units.c < CANNOT_PAY_C or units.native_bf16 else 0.0
    return {"fixed": FIXED_S, "recommend": rec, "nightly_1": healthy,
            "finetune": finetune_seconds(units, recipe), "nightly_2": stale, "nightly_3": healthy}


def floor_upper(size: Size) -> float:
    """Night 2's predicted 95% CI upper end of the acceptance rate: :data:`STALE_RATE` plus 1.96 standard
    errors of a mean over the size's prompts (:data:`STALE_PROMPT_SD`); the bootstrap over prompts is about
    that wide."""
    return STALE_RATE + 1.96 * STALE_PROMPT_SD / math.sqrt(size.prompts)


def has_evidence(size: Size, min_draft_tokens: int) -> bool:
    """Whether a night of this size drafts at least ``min_draft_tokens`` tokens (module docstring of
    :mod:`flows.demo`: the promotion gate's evidence); the first token of each prompt comes from the prefill."""
    return size.prompts * (size.max_new_tokens - 1) * DRAFTED_PER_TOKEN >= min_draft_tokens


def budget_for(units: UnitCosts, size: Size, recipe: dict) -> DemoBudget:
    """The :class:`DemoBudget` of one size (its phases, total, floor)."""
    phases = phase_seconds(units, size, recipe)
    total = sum(phases.values())
    upper = floor_upper(size)
    return DemoBudget(size.per_category, size.max_new_tokens, units, story_k(units)[1], total, phases,
                      total <= BUDGET_S, upper, upper <= FLOOR - FLOOR_MARGIN)


def choose(units: UnitCosts, sizes: list[Size], recipe: dict, min_draft_tokens: int = 0) -> DemoBudget:
    """Among ``sizes`` (most informative first) with the gate's evidence (:func:`has_evidence`; all of them
    when none has it): the first that decides the floor within ``MARGIN x BUDGET_S``; else the most decisive
    (lowest :func:`floor_upper`) within ``BUDGET_S``; else the cheapest.

    Raises:
        ValueError: no sizes.
    """
    if not sizes:
        raise ValueError("choose needs at least one held-out size")
    sized = [budget_for(units, s, recipe) for s in sizes if has_evidence(s, min_draft_tokens)] or \
        [budget_for(units, s, recipe) for s in sizes]
    for b in sized:
        if b.decides and b.predicted_s <= MARGIN * BUDGET_S:
            return b
    within = [b for b in sized if b.fits]
    if within:
        return min(within, key=lambda b: (b.floor_upper, b.predicted_s))
    return min(sized, key=lambda b: b.predicted_s)


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


def measure(target, draft=None, reps: int = 9) -> UnitCosts:
    """This machine's :class:`UnitCosts`: ``target`` the fp32 target model, ``draft`` the story draft's model
    (a derived copy; None for a drafter without one, whose c is 0). One-token passes by the validations' own
    timer (:func:`specdec.validation.timing.pass_costs`: warm KV cache, target and draft interleaved, medians of
    ``reps`` rounds), prefills by :func:`specdec.validation.timing.prefill_seconds` over :data:`PROBE_TOKENS`."""
    from specdec.validation.machine import native_bf16
    from specdec.validation.timing import pass_costs, prefill_seconds

    vocab = target.get_input_embeddings().num_embeddings
    ids = [i % max(1, vocab - 1) + 1 for i in range(PROBE_TOKENS)]  # any ids: a pass costs the same
    models = {"target": (target, [1])} | ({"draft": (draft, [1])} if draft is not None else {})
    one = pass_costs(models, ids[:32], reps)
    t1, p = one["target"][1], prefill_seconds(target, ids) / PROBE_TOKENS
    nb = bool(native_bf16("cpu")["native"])
    if draft is None:
        return UnitCosts(t1, p, 0.0, 0.0, nb)
    return UnitCosts(t1, p, one["draft"][1] / t1, prefill_seconds(draft, ids) / PROBE_TOKENS / p, nb)
