"""``speculation_profile.json``: a validation's acceptance in NVIDIA Model Optimizer's speculation-profile
schema (version 1.0, ``examples/specdec_bench/specdec_bench/speculation_profile.py`` in NVIDIA/Model-Optimizer),
so deployment tooling (dynamo's mocker, vLLM's synthetic rejection sampler) reads our measurement.

From counters every engine and our core keep (verification steps that proposed ``D`` = ``num_drafts`` and
``A_i`` = steps whose draft position i was accepted, ``accepted_per_position``), for longest-prefix
verification:

- histogram of acceptance lengths (tokens emitted per step, the bonus token included):
  ``steps(length j + 1) = A_j - A_{j+1}`` with ``A_0 = D``, ``A_{k+1} = 0``;
- ``marginal_accept_rates[i] = A_{i+1} / D`` = P(first i + 1 drafts all accepted) (vLLM's synthetic sampler);
- ``conditional_accept_rates[i] = A_{i+1} / A_i`` = P(draft i + 1 accepted | first i accepted) (dynamo);
- ``mean_accept_length`` per step = histogram mean = ``1 + A / D``; ``mean_accept_length_per_request`` the
  mean over prompts of each prompt's own;
- self-checks as Model Optimizer writes them: ``1 + sum(marginal) == mean_accept_length`` (within 0.02)
  and non-increasing marginals.

Pure functions, no I/O except :func:`write_profile`; the engine check's counts go through the same
:func:`profile_from_counts`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

#: the Model Optimizer schema this writes
SCHEMA_VERSION = "1.0"
PROFILE_FILE = "speculation_profile.json"
#: chain drafters (the k-token draft is a prefix of the (k+1)-token one): the marginals extrapolate over k
CHAIN_METHODS = {"draft_model", "eagle3"}
#: Model Optimizer's tolerance of the mean-consistency self-check
MEAN_TOLERANCE = 0.02


@dataclass(frozen=True)
class Counts:
    """Acceptance counters of one group of verification steps.

    Attributes:
        num_speculative_tokens: k (the vectors' length).
        num_drafts: D, verification steps that proposed at least one token.
        accepted_per_position: A_1..A_k, steps whose draft position i was accepted (length k; shorter is
            padded with zeros).
        per_request_lengths: each prompt's own mean accepted length (1 + accepted / drafts), for the
            per-request mean.
    """

    num_speculative_tokens: int
    num_drafts: int
    accepted_per_position: Sequence[int]
    per_request_lengths: Sequence[float] = field(default_factory=list)


def _vectors(counts: Counts) -> tuple[dict[str, int], list[float], list[float], float]:
    """(histogram {length: steps}, marginal, conditional, per-step mean) of ``counts``."""
    k, d = int(counts.num_speculative_tokens), int(counts.num_drafts)
    a = [d] + [int(x) for x in list(counts.accepted_per_position)[:k]] + [0] * max(0, k - len(counts.accepted_per_position))
    a.append(0)
    hist = {str(j + 1): a[j] - a[j + 1] for j in range(k + 1) if a[j] - a[j + 1] > 0}
    marginal = [a[i + 1] / d if d else 0.0 for i in range(k)]
    conditional = [a[i + 1] / a[i] if a[i] else 0.0 for i in range(k)]
    mean = sum(int(j) * n for j, n in hist.items()) / d if d else math.nan
    return hist, marginal, conditional, mean


def _checks(mean: float, marginal: list[float]) -> dict[str, Any]:
    implied = 1.0 + sum(marginal)
    delta = abs(implied - mean) if math.isfinite(mean) else math.inf
    violations = [{"position": i, "value": marginal[i], "previous": marginal[i - 1]}
                  for i in range(1, len(marginal)) if marginal[i] > marginal[i - 1] + 1e-9]
    return {"mean_consistency": {"implied_mean_accept_length": round(implied, 6),
                                 "reported_mean_accept_length": round(mean, 6) if math.isfinite(mean) else None,
                                 "abs_delta": round(delta, 6) if math.isfinite(delta) else None,
                                 "tolerance": MEAN_TOLERANCE, "passed": delta <= MEAN_TOLERANCE},
            "marginal_monotonicity": {"passed": not violations, "violations": violations}}


def profile_from_counts(c: Counts) -> dict[str, Any]:
    """The acceptance part of a profile (vectors, means, histogram, self-checks) from counters ``c``."""
    hist, marginal, conditional, mean = _vectors(c)
    per_req = [x for x in c.per_request_lengths if isinstance(x, (int, float)) and math.isfinite(x)]
    return {"conditional_accept_rates": [round(x, 6) for x in conditional],
            "marginal_accept_rates": [round(x, 6) for x in marginal],
            "mean_accept_length": round(mean, 6) if math.isfinite(mean) else None,
            "mean_accept_length_per_request": round(sum(per_req) / len(per_req), 6) if per_req else None,
            "acceptance_length_histogram": hist, "num_steps": int(c.num_drafts),
            "validation": _checks(mean, marginal)}


def method_of(drafter_kind: str) -> str:
    """Model Optimizer's method name of a drafter kind: ``draft_model`` (a model or derived draft),
    ``ngram``, ``eagle3``."""
    from specdec.kinds import kind_of_label

    kind = kind_of_label(drafter_kind)
    return "unknown" if kind is None else (kind.vllm_method or "draft_model")


def _counts(g: Any, k: int, prompts: Sequence[Any] = ()) -> Counts:
    lengths = [1 + p.num_accepted_tokens / p.num_drafts for p in prompts if getattr(p, "num_drafts", 0)]
    return Counts(k, int(g.num_drafts or 0), list(g.accepted_per_position or []), lengths)


def speculation_profile(report: Any, *, source: str = "specdec core") -> dict[str, Any]:
    """The ``speculation_profile.json`` payload of a :class:`~specdec.validation.report.ValidationReport`.

    Args:
        report: the validation (its overall and per-category counters, prompts, config, provenance).
        source: who counted: ``specdec core`` (our decoding / replay) or an engine (``llama.cpp``, ``vllm``).
    Returns:
        a JSON-ready dict in Model Optimizer's schema 1.0 (``schema_version``, ``measured``, ``method``,
        ``draft_checkpoint``, ``target_model``, ``num_speculative_tokens``, ``conditional_accept_rates``,
        ``marginal_accept_rates``, ``mean_accept_length`` (per step), ``mean_accept_length_per_request``,
        ``acceptance_length_histogram``, ``per_category``, ``measurement_conditions``, ``validation``).
    """
    g, k = report.overall, int(report.overall.num_speculative_tokens or report.config.get("num_speculative_tokens") or 0)
    ok = [p for p in report.prompts if p.status == "ok"]
    body = profile_from_counts(_counts(g, k, ok))
    cats = {name: profile_from_counts(_counts(cg, k, [p for p in ok if p.category == name]))
            for name, cg in sorted(report.categories.items())}
    method = method_of(report.drafter_kind)
    return {
        "schema_version": SCHEMA_VERSION, "measured": bool(g.num_drafts), "method": method,
        "draft_checkpoint": {"ref": report.drafter_ref, "kind": report.drafter_kind},
        "target_model": {"ref": report.target_ref}, "num_speculative_tokens": k, "block_size": None,
        "max_supported_k": k, "verification_method": "longest_prefix",
        **{key: body[key] for key in ("conditional_accept_rates", "marginal_accept_rates", "mean_accept_length",
                                      "mean_accept_length_per_request")},
        "accept_length_model": "chain_analytic" if method in CHAIN_METHODS else "measured_per_k",
        "accept_length_by_k": {str(k): body["mean_accept_length"]},
        "acceptance_length_histogram": body["acceptance_length_histogram"],
        "per_category": cats, "measurement_conditions": _conditions(report, source),
        "validation": body["validation"],
    }


def _conditions(report: Any, source: str) -> dict[str, Any]:
    cfg: Mapping[str, Any] = report.config or {}
    return {"dataset": f"{report.heldout_name}@{report.heldout_version}", "num_samples": len(report.prompts),
            "osl": cfg.get("max_new_tokens"), "temperature": cfg.get("temperature"), "top_k": cfg.get("top_k"),
            "top_p": cfg.get("top_p"), "seed": cfg.get("seed"), "device": report.device, "dtype": report.dtype,
            "engine": source, "validation": report.method, "code_version": report.code_version,
            "created_at": report.created_at}


def write_profile(report: Any, out_dir: str | Path, *, source: str = "specdec core") -> Path:
    """Write :func:`speculation_profile` of ``report`` to ``<out_dir>/speculation_profile.json``."""
    path = Path(out_dir) / PROFILE_FILE
    path.write_text(json.dumps(speculation_profile(report, source=source), indent=2))
    return path
