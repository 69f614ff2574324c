"""Draft candidates of ``specdec draft recommend``: which drafts are tried on a device, how each
resolves against the target, and the result types (:class:`CandidateResult`, :class:`Recommendation`)
that :func:`specdec.validation.recommend.recommend_draft` fills and ``recommend_cli`` prints."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from specdec.models.store import ModelStore
from specdec.validation.report import nan_to_none
from specdec.validation.speed import PAYS_ABOVE

__all__ = ["CandidateResult", "Recommendation", "default_candidates", "resolve_candidates", "CPU_CANDIDATES",
           "CUDA_CANDIDATES"]

CPU_CANDIDATES = ("derived:bf16", "derived:int8", "derived:int4", "ngram")
CUDA_CANDIDATES = ("derived:fp8", "derived:int8", "ngram")


def default_candidates(device: str | torch.device) -> tuple[str, ...]:
    """bf16/int8/int4 copies and n-gram on a CPU; fp8/int8 copies and n-gram on CUDA."""
    return CUDA_CANDIDATES if torch.device(device).type == "cuda" else CPU_CANDIDATES


@dataclass
class CandidateResult:
    """One candidate: ``cost_ratio`` c, ``alpha`` replayed acceptance at its best ``k``, ``verify_cost``
    v(k), ``predicted_speedup`` (decoded counters at k), ``measured_speedup`` / ``speedup_ci`` (paired
    median, 95% CI), the timing check, ``reason`` (why unavailable, or a finding), ``best_k_tau``
    the replayed best draft-length policy ``{num_speculative_tokens, assistant_confidence_threshold,
    predicted_speedup}`` (greedy; tau None when no threshold beats the best fixed k), ``acceptance_by_k`` the
    replayed acceptance rate (accepted / drafted) at each k considered."""

    spec: str
    kind: str = ""
    available: bool = True
    cost_ratio: float = math.nan
    alpha: float = math.nan
    k: int | None = None
    verify_cost: float = math.nan
    predicted_speedup: float = math.nan
    measured_speedup: float = math.nan
    speedup_ci: list[float] = field(default_factory=lambda: [math.nan, math.nan])
    alpha_hat: float = math.nan
    acceptance_rate: float = math.nan
    identical_outputs: int = 0
    compared_outputs: int = 0
    reason: str | None = None
    measured_over_predicted: float = math.nan
    timing_suspect: bool | None = None
    best_k_tau: dict[str, Any] | None = None
    acceptance_by_k: dict[int, float] = field(default_factory=dict)

    @property
    def speedup_ci_low(self) -> float:
        """Lower end of the measured speedup's 95% CI (NaN when none was computed)."""
        return self.speedup_ci[0] if self.speedup_ci else math.nan

    @property
    def pays(self) -> bool:
        """Credibly faster than target-only (speedup and CI low above 1.0), every output identical,
        and the timing not suspect."""
        lo = self.speedup_ci_low
        return (self.available and not math.isnan(self.measured_speedup) and self.measured_speedup > PAYS_ABOVE
                and (math.isnan(lo) or lo > PAYS_ABOVE) and self.identical_outputs == self.compared_outputs
                and not self.timing_suspect)


@dataclass
class Recommendation:
    """What :func:`recommend_draft` found: ``best`` (None when nothing pays; ``summary`` says why),
    ``fallback`` the best-ranked measured candidate, ``verify_cost_by_k`` v(k) for the k considered."""

    target_ref: str
    device: str
    dtype: str
    native_bf16: dict[str, Any]
    candidates: list[CandidateResult]
    best: str | None
    fallback: str | None
    summary: str
    num_prompts: int
    categories: list[str]
    max_new_tokens: int
    target_step_ms: float
    verify_cost_by_k: dict[int, float]
    load_avg_1m: list[float]
    num_cpus: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (NaN -> None)."""
        d = asdict(self)
        d["candidates"] = [{**asdict(c), "pays": c.pays} for c in self.candidates]
        return nan_to_none(d)


def resolve_candidates(target: Any, specs: Sequence[str], *, store: ModelStore
                       ) -> tuple[list[CandidateResult], dict[str, Any]]:
    """One :class:`CandidateResult` per spec (unavailable ones say why) and ``{spec: resolved drafter}``
    for the available ones (:func:`specdec.kinds.resolve_drafter`; a draft reference fetched into ``store``)."""
    from specdec.models.derived import UnsupportedRecipeError
    from specdec.kinds import kind_of
    from specdec.kinds import DrafterSpecError, resolve_drafter

    results, drafters = [], {}
    target_dtype = next(target.model.parameters()).dtype
    for spec in specs:
        try:
            r = resolve_drafter(spec, target, store=store)
        except (UnsupportedRecipeError, DrafterSpecError) as e:
            results.append(CandidateResult(spec=spec, available=False, reason=str(e)))
            continue
        res = CandidateResult(spec=spec, kind=r.kind)
        same = kind_of(r).same_as_target(r.kind, target_dtype)
        if same:
            res.available, res.reason = False, same
        else:
            drafters[spec] = r
        results.append(res)
    return results, drafters
