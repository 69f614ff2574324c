"""What the engine delivers per step, against the core under the validated rule, and the engine check's
findings (docs/engine-check.md, "Per-step comparison" and "Findings").

An acceptance *rate* can rise while speculation stops paying: an engine that drafts only its most
confident tokens (a larger ``--spec-draft-p-min``), a smaller k or no drafts at all accepts a larger
share of far fewer drafts. So the check compares, for the same prompts and the engine's own output
tokens, the engine's counters with the core's replay of the *validated* rule:

* drafts per request, drafted tokens per draft, mean accepted length (``1 + accepted / drafts``,
  vLLM's definition, the bonus token included) and accepted tokens per draft position;
* the pooled ratio of drafted tokens, engine / core, with a 95% bootstrap CI over prompts: when its
  upper end is below ``1 - DELIVERY_TOLERANCE`` the engine drafts less than the validated rule, a
  serving-stack finding whatever its rate does.

Findings (:class:`EngineFinding`) are what the nightly alerts on besides the acceptance gap:
``fingerprint`` (the engine serves another model/draft/vocabulary than the pair's), ``served rule``
(its declared flags draft less than the validated rule), ``delivery`` (it measurably drafts less) and
``audit`` (its greedy output leaves the target's beyond near-ties on many prompts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from specdec.validation.metrics import bootstrap_ratio_ci

__all__ = ["DELIVERY_TOLERANCE", "AUDIT_DIVERGENT_SHARE", "EngineFinding", "StepFigures", "Delivery", "delivery_of",
           "delivery_finding", "audit_finding"]

#: the engine may draft this share fewer tokens than the core's replay before it is a finding (near-tie
#: flips in the draft move a few steps; a threshold or a smaller k moves many)
DELIVERY_TOLERANCE = 0.10
#: the share of audited prompts whose greedy output leaves the target's beyond a near-tie that makes an
#: ``audit`` finding (with at least 2 such prompts)
AUDIT_DIVERGENT_SHARE = 0.25


@dataclass
class EngineFinding:
    """One serving-stack finding: ``kind`` (``fingerprint`` | ``served rule`` | ``delivery`` | ``audit``) and
    one line for the user."""

    kind: str
    message: str


@dataclass
class StepFigures:
    """One side's per-step figures over the run (tokens; None/nan where unknown).

    Attributes:
        requests: prompts counted; drafts: verification steps that drafted; draft_tokens, accepted: tokens;
        per_position: accepted tokens per 0-based draft position; drafts_per_request, draft_tokens_per_draft,
        mean_accepted_length (``1 + accepted / drafts``).
    """

    requests: int = 0
    drafts: int | None = None
    draft_tokens: int = 0
    accepted: int = 0
    per_position: list[int] = field(default_factory=list)
    drafts_per_request: float = math.nan
    draft_tokens_per_draft: float = math.nan
    mean_accepted_length: float = math.nan


def step_figures(requests: int, drafts: int | None, draft_tokens: int, accepted: int,
                 per_position: list[int] | None) -> StepFigures:
    """:class:`StepFigures` with its ratios filled in."""
    s = StepFigures(requests=requests, drafts=drafts, draft_tokens=int(draft_tokens), accepted=int(accepted),
                    per_position=list(per_position or []))
    if drafts:
        s.drafts_per_request = drafts / requests if requests else math.nan
        s.draft_tokens_per_draft = draft_tokens / drafts
        s.mean_accepted_length = 1 + accepted / drafts
    return s


@dataclass
class Delivery:
    """Engine vs core per step (module docstring): ``draft_tokens_ratio`` = engine / core drafted tokens,
    pooled, and its 95% bootstrap CI over prompts."""

    engine: StepFigures
    core: StepFigures
    draft_tokens_ratio: float = math.nan
    draft_tokens_ratio_ci: list[float] = field(default_factory=lambda: [math.nan, math.nan])


def delivery_of(rows: list[Any], engine_drafts: int | None, engine_per_position: list[int] | None, *,
                seed: int = 0) -> Delivery:
    """The per-step comparison of the ``ok`` rows (:class:`~specdec.validation.engine_report.EnginePromptResult`).

    Args:
        engine_drafts / engine_per_position: the engine's drafts and per-position counts over the run
            (per-request sums, or the ``/metrics`` delta when it is this run's alone), None when unknown.
    """
    ok = [r for r in rows if r.status == "ok"]
    n = len(ok)
    core_k = max((len(r.core_accepted_per_position) for r in ok), default=0)
    core_pp = [sum(r.core_accepted_per_position[i] for r in ok if i < len(r.core_accepted_per_position))
               for i in range(core_k)]
    e = step_figures(n, engine_drafts, sum(r.engine_draft_tokens for r in ok), sum(r.engine_accepted_tokens for r in ok),
                     engine_per_position)
    c = step_figures(n, sum(r.core_drafts for r in ok), sum(r.core_draft_tokens for r in ok),
                     sum(r.core_accepted_tokens for r in ok), core_pp)
    d = Delivery(engine=e, core=c)
    if c.draft_tokens:
        d.draft_tokens_ratio = e.draft_tokens / c.draft_tokens
        d.draft_tokens_ratio_ci = bootstrap_ratio_ci([r.engine_draft_tokens for r in ok],
                                                     [r.core_draft_tokens for r in ok], seed=seed)
    return d


def _f(x: float | None, d: int = 2) -> str:
    return "?" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{d}f}"


def delivery_finding(d: Delivery, k: int, engine_rate: float, core_rate: float) -> EngineFinding | None:
    """A ``delivery`` finding when the engine credibly drafts less than the core's replay of the validated rule
    (the ratio CI's upper end below ``1 - DELIVERY_TOLERANCE``), else None."""
    hi = d.draft_tokens_ratio_ci[1]
    if not math.isfinite(hi) or hi >= 1 - DELIVERY_TOLERANCE:
        return None
    e, c = d.engine, d.core
    return EngineFinding("delivery", (
        f"the engine drafts less than the validated rule (k={k}): {e.draft_tokens} drafted tokens vs the core's "
        f"{c.draft_tokens} for the same prompts and tokens (ratio {_f(d.draft_tokens_ratio)}, 95% CI "
        f"[{_f(d.draft_tokens_ratio_ci[0])}, {_f(hi)}]); drafts per request {_f(e.drafts_per_request, 1)} vs "
        f"{_f(c.drafts_per_request, 1)}, tokens per draft {_f(e.draft_tokens_per_draft)} vs {_f(c.draft_tokens_per_draft)}, "
        f"mean accepted length {_f(e.mean_accepted_length)} vs {_f(c.mean_accepted_length)}, per position "
        f"{e.per_position or '?'} vs {c.per_position}; its acceptance rate {_f(engine_rate, 3)} vs {_f(core_rate, 3)} "
        "does not show it: a serving-stack change (a drafting threshold, a smaller k, drafting off)"))


def audit_finding(audit: dict[str, int]) -> EngineFinding | None:
    """An ``audit`` finding when the engine's greedy output leaves the target's beyond a near-tie on at least
    2 prompts and more than :data:`AUDIT_DIVERGENT_SHARE` of those audited, else None."""
    checked, bad = audit.get("checked", 0), audit.get("divergent", 0)
    if bad < 2 or bad <= AUDIT_DIVERGENT_SHARE * checked:
        return None
    return EngineFinding("audit", (
        f"the engine's greedy output leaves the pair's target on {bad} of {checked} prompts beyond a near-tie: it "
        "serves another model (or computes this one differently) than the pair's target"))
