"""What the engine check reports: the engine's acceptance, the core's for the same prompts, their
paired difference, the exactness audit, and the engine's speed with and without speculation.

Definitions (docs/metrics.md, "Engine check"):

* acceptance = accepted / drafted tokens, pooled over prompts (vLLM's and llama.cpp's counters);
  the 95% CI is the percentile bootstrap over prompts (:func:`specdec.validation.metrics.bootstrap_ratio_ci`);
* the **paired difference** is engine minus core, both pooled, resampling prompts jointly (the same
  prompts in each replicate), so prompt difficulty cancels;
* the core's figure for a prompt is its exact greedy replay along the engine's own output tokens
  (under the argmax rule the counters of a run are a function of its output,
  ``docs/metrics.md``): the same prompt, the same emitted tokens, the core's draft and verification;
* the audit compares the engine's greedy output with the core's target-only continuation; at the
  first differing token the core's target logit margin (its top-1 minus the engine's token, in
  logits) says whether it is a near-tie flip (kernels and quantized activations round differently)
  or a real divergence.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from specdec.validation.engine_delivery import Delivery, EngineFinding, StepFigures
from specdec.validation.metrics import bootstrap_ratio_ci
from specdec.validation.jsonsafe import nan_to_none

__all__ = ["ENGINE_CHECK_SCHEMA", "NEAR_TIE_LOGITS", "EnginePromptResult", "EngineGroup", "EngineCheckReport",
           "summarize", "paired_difference_ci"]

ENGINE_CHECK_SCHEMA = 2  # 2: findings, delivery, rule
#: a first divergence where the core's target prefers its token by at most this many logits is a
#: near-tie flip: llama.cpp's quantized-activation kernels move logits by up to a few tenths
NEAR_TIE_LOGITS = 0.5


@dataclass
class EnginePromptResult:
    """One prompt through the engine and the core.

    Counters are tokens; ``*_tokens_per_second`` are the engine's own generation rates (``timings``);
    ``first_divergence`` is the 0-based index of the first output token where the engine and the
    core's target-only continuation differ (None: identical, or not audited at T > 0);
    ``divergence_margin`` the core target's logit margin there and ``divergence`` ``near-tie`` |
    ``divergence``.
    """

    prompt_id: str
    category: str
    status: str = "ok"
    skip_reason: str | None = None
    prompt_tokens: int = 0
    new_tokens: int = 0
    engine_draft_tokens: int = 0
    engine_accepted_tokens: int = 0
    core_drafts: int = 0
    core_draft_tokens: int = 0
    core_accepted_tokens: int = 0
    core_accepted_per_position: list[int] = field(default_factory=list)
    engine_tokens_per_second: float = math.nan
    baseline_tokens_per_second: float = math.nan
    engine_seconds: float = math.nan
    baseline_seconds: float = math.nan
    exact_match: bool | None = None
    first_divergence: int | None = None
    divergence_margin: float | None = None
    divergence: str | None = None


@dataclass
class EngineGroup:
    """Pooled figures of one group of prompts (overall or a category)."""

    num_prompts: int = 0
    engine_draft_tokens: int = 0
    engine_accepted_tokens: int = 0
    engine_acceptance_rate: float = math.nan
    engine_acceptance_rate_ci: list[float] = field(default_factory=lambda: [math.nan, math.nan])
    core_draft_tokens: int = 0
    core_accepted_tokens: int = 0
    core_acceptance_rate: float = math.nan
    core_acceptance_rate_ci: list[float] = field(default_factory=lambda: [math.nan, math.nan])
    difference: float = math.nan
    difference_ci: list[float] = field(default_factory=lambda: [math.nan, math.nan])


@dataclass
class EngineCheckReport:
    """The engine check of one pair on one held-out set (JSON via :meth:`to_dict`).

    Attributes:
        engine / url: the engine profile and its endpoint (no credentials).
        fingerprint: what the engine says about itself (build, model file, context, slots) plus the
            flags and file hashes when known (:func:`specdec.validation.engine_check.engine_fingerprint`).
        counters_source: ``per-request timings`` (llama.cpp) or ``/metrics deltas`` (said so).
        overall / categories: :class:`EngineGroup`; engine_per_position: the engine's accepted tokens
            per draft position over the run (``/metrics`` delta; empty when not available) and
            core_per_position: the core's, pooled; engine_num_drafts: the engine's verification steps
            that drafted (``/metrics`` delta; None when not available).
        audit: ``{"checked", "identical", "near_tie", "divergent"}`` (greedy only).
        speed: engine tokens/s with speculation, the baseline's, the paired speedup and its CI.
        verdict: ``agrees`` (the difference CI contains 0), ``engine accepts less`` / ``engine accepts more``
            (the CI excludes 0), ``insufficient evidence``, or ``not compared`` (the engine serves another
            target: no number was compared).
        findings: serving-stack findings (:class:`~specdec.validation.engine_delivery.EngineFinding`): the
            fingerprint against the registered pair, the declared rule, the per-step delivery, the audit.
        delivery: engine vs core per step (:class:`~specdec.validation.engine_delivery.Delivery`), None when
            not compared.
        rule: the validated proposal rule the core replayed and the one the engine declares
            (``{"validated": {...}, "served": {...} | None}``).
    """

    engine: str
    url: str
    heldout_name: str
    heldout_version: str
    target_ref: str
    drafter_ref: str | None
    config: dict[str, Any]
    concurrency: int
    fingerprint: dict[str, Any]
    counters_source: str
    overall: EngineGroup
    categories: dict[str, EngineGroup]
    engine_per_position: list[int]
    core_per_position: list[int]
    engine_num_drafts: int | None
    audit: dict[str, int]
    speed: dict[str, Any]
    verdict: str
    prompts: list[EnginePromptResult]
    notes: list[str] = field(default_factory=list)
    wall_seconds: float = math.nan
    findings: list[EngineFinding] = field(default_factory=list)
    delivery: Delivery | None = None
    rule: dict[str, Any] = field(default_factory=dict)
    schema_version: int = ENGINE_CHECK_SCHEMA

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-safe dict (NaN becomes None)."""
        return nan_to_none(asdict(self))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EngineCheckReport":
        """Inverse of :meth:`to_dict` (``None`` back to nan where a float was; unknown keys dropped).

        Raises:
            KeyError / TypeError: ``d`` is not an engine check report's dict.
        """
        d = _restored(cls, d)
        d["overall"] = EngineGroup(**_restored(EngineGroup, d["overall"]))
        d["categories"] = {k: EngineGroup(**_restored(EngineGroup, v)) for k, v in (d.get("categories") or {}).items()}
        d["prompts"] = [EnginePromptResult(**_restored(EnginePromptResult, r)) for r in d.get("prompts") or []]
        d["findings"] = [EngineFinding(**f) for f in d.get("findings") or []]
        d["speed"] = {k: [math.nan if x is None else x for x in v] if isinstance(v, list) else
                      (math.nan if v is None else v) for k, v in (d.get("speed") or {}).items()}
        if d.get("delivery") is not None:
            dl = _restored(Delivery, d["delivery"])
            dl["engine"], dl["core"] = (StepFigures(**_restored(StepFigures, dl[side])) for side in ("engine", "core"))
            d["delivery"] = Delivery(**dl)
        return cls(**d)


def _restored(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    """``d``'s keys that are fields of the dataclass ``cls``, with ``None`` back to nan in its ``float`` and
    ``list[float]`` fields (JSON has no NaN: :func:`~specdec.validation.jsonsafe.nan_to_none`)."""
    out: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in d:
            continue
        v = d[f.name]
        if f.type == "float" and v is None:
            v = math.nan
        elif f.type == "list[float]" and v is not None:
            v = [math.nan if x is None else x for x in v]
        out[f.name] = v
    return out


def paired_difference_ci(a_num: list[float], a_den: list[float], b_num: list[float], b_den: list[float], *,
                         n_resamples: int = 2000, seed: int = 0) -> list[float]:
    """95% percentile bootstrap CI of ``Σa_num/Σa_den - Σb_num/Σb_den``, resampling prompts jointly.

    Returns ``[nan, nan]`` with fewer than 2 prompts.
    """
    arrs = [np.asarray(v, dtype=np.float64) for v in (a_num, a_den, b_num, b_den)]
    n = arrs[0].shape[0]
    if n < 2:
        return [math.nan, math.nan]
    idx = np.random.default_rng(seed).integers(0, n, size=(n_resamples, n))
    an, ad, bn, bd = (a[idx].sum(1) for a in arrs)
    ok = (ad > 0) & (bd > 0)
    d = an[ok] / ad[ok] - bn[ok] / bd[ok]
    if d.size == 0:
        return [math.nan, math.nan]
    lo, hi = np.percentile(d, [2.5, 97.5])
    return [float(lo), float(hi)]


def summarize(rows: list[EnginePromptResult], *, n_resamples: int = 2000, seed: int = 0) -> EngineGroup:
    """Pool the ``ok`` rows into an :class:`EngineGroup` with bootstrap CIs."""
    ok = [r for r in rows if r.status == "ok"]
    g = EngineGroup(num_prompts=len(ok))
    if not ok:
        return g
    en, ed = [r.engine_accepted_tokens for r in ok], [r.engine_draft_tokens for r in ok]
    cn, cd = [r.core_accepted_tokens for r in ok], [r.core_draft_tokens for r in ok]
    g.engine_accepted_tokens, g.engine_draft_tokens = int(sum(en)), int(sum(ed))
    g.core_accepted_tokens, g.core_draft_tokens = int(sum(cn)), int(sum(cd))
    boot = dict(n_resamples=n_resamples, seed=seed)
    if g.engine_draft_tokens:
        g.engine_acceptance_rate = g.engine_accepted_tokens / g.engine_draft_tokens
        g.engine_acceptance_rate_ci = bootstrap_ratio_ci(en, ed, **boot)
    if g.core_draft_tokens:
        g.core_acceptance_rate = g.core_accepted_tokens / g.core_draft_tokens
        g.core_acceptance_rate_ci = bootstrap_ratio_ci(cn, cd, **boot)
    if g.engine_draft_tokens and g.core_draft_tokens:
        g.difference = g.engine_acceptance_rate - g.core_acceptance_rate
        g.difference_ci = paired_difference_ci(en, ed, cn, cd, **boot)
    return g


def verdict_of(g: EngineGroup) -> str:
    """``agrees`` / ``engine accepts less`` / ``engine accepts more`` from the difference CI."""
    lo, hi = g.difference_ci
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "insufficient evidence"
    if hi < 0:
        return "engine accepts less"
    if lo > 0:
        return "engine accepts more"
    return "agrees"
