"""Engine profiles the product serves a pair on but does not ask (yet; vLLM: :mod:`specdec.engines.vllm`): their serving config, proposal
rule and ``/metrics`` names only; :meth:`~specdec.engines.profile.EngineProfile.connect` says the engine
check cannot ask them.

* SGLang: ``--speculative-algorithm`` and a top-1 chain of k (:data:`SGLANG_SERVING`); gauges only
  (``sglang:spec_accept_rate``/``length``).
* transformers: ``generate()`` keywords (``assistant_model``, ``prompt_lookup_num_tokens``, ``assistant_early_exit``;
  :data:`TRANSFORMERS_SERVING`); drafts sampled from q.
"""

from __future__ import annotations

from typing import Any

from specdec.engines.metrics import SGLANG_METRICS
from specdec.engines.profile import EngineProfile, Refusal, draft_of, no_early_exit
from specdec.kinds import DERIVED, EAGLE3, LAYERSKIP, MODEL, NGRAM, DrafterKind, KindTable, ServingRequest

__all__ = ["SGLangProfile", "TransformersProfile", "SGLANG_SERVING", "TRANSFORMERS_SERVING", "sglang_chain"]


def sglang_chain(k: int) -> list[str]:
    """SGLang's flags for a chain of ``k`` drafts (top-1 per step; the draft tokens plus the root)."""
    return ["--speculative-num-steps", str(k), "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(k + 1)]


def _sglang_draft(kind: DrafterKind, req: ServingRequest) -> dict[str, Any]:
    """``--speculative-algorithm`` the kind's ``sglang_algorithm`` with the draft's path. Raises ValueError: no draft."""
    return {"args": ["--speculative-algorithm", kind.sglang_algorithm, "--speculative-draft-model-path",
                     str(draft_of(req)), *sglang_chain(req.k)]}


def _sglang_lookup(kind: DrafterKind, req: ServingRequest) -> dict[str, Any]:
    """SGLang's n-gram algorithm (no draft model; its sizes are SGLang's own). Raises DrafterSpecError: a bad recipe."""
    kind.sizes_of(req.recipe)  # the pair's recipe is checked on every engine
    return {"args": ["--speculative-algorithm", kind.sglang_algorithm, *sglang_chain(req.k)]}


#: SGLang's arguments of each drafter kind
SGLANG_SERVING: KindTable = KindTable("the SGLang serving table", {
    NGRAM: _sglang_lookup, DERIVED: _sglang_draft, EAGLE3: _sglang_draft, LAYERSKIP: Refusal(no_early_exit),
    MODEL: _sglang_draft})


def _assistant(kind: DrafterKind, req: ServingRequest) -> dict[str, Any]:
    """``assistant_model`` = the draft, k drafts on a constant schedule, the validated tau if any.
    Raises ValueError: no draft reference."""
    kw: dict[str, Any] = {"assistant_model": draft_of(req), "num_assistant_tokens": req.k,
                          "num_assistant_tokens_schedule": "constant"}
    if req.tau is not None:
        kw["assistant_confidence_threshold"] = req.tau
    return {"generate_kwargs": kw}


def _prompt_lookup(kind: DrafterKind, req: ServingRequest) -> dict[str, Any]:
    """Prompt lookup of k tokens up to ``max_ngram``; a minimum n-gram above 1 is reported ``not_applied``.
    Raises DrafterSpecError: a bad recipe."""
    max_n, min_n = kind.sizes_of(req.recipe)
    out: dict[str, Any] = {"generate_kwargs": {"prompt_lookup_num_tokens": req.k, "max_matching_ngram_size": max_n}}
    if min_n > 1:  # transformers' prompt lookup matches down to 1 token: it proposes more
        out["not_applied"] = {"prompt_lookup_min": min_n}
    return out


def _early_exit(kind: DrafterKind, req: ServingRequest) -> dict[str, Any]:
    """``assistant_early_exit=N`` from the pair's recipe. Raises ValueError: no recipe."""
    if not req.recipe or "num_layers" not in req.recipe:
        raise ValueError("a layerskip pair needs its recipe {'num_layers': N} to be served")
    return {"generate_kwargs": {"assistant_early_exit": int(req.recipe["num_layers"]), "num_assistant_tokens": req.k,
                                "num_assistant_tokens_schedule": "constant"}}


def _no_head(kind: DrafterKind, req: ServingRequest) -> str:
    return (f"transformers' assisted generation cannot serve {kind.describe(req.label)}: serve this pair with vllm "
            "or sglang")


#: transformers' ``generate()`` keywords of each drafter kind (no EAGLE-3 drafter: refused after the draft check)
TRANSFORMERS_SERVING: KindTable = KindTable("the transformers serving table", {
    NGRAM: _prompt_lookup, DERIVED: _assistant, EAGLE3: Refusal(_no_head, lambda kind, req: draft_of(req)),
    LAYERSKIP: _early_exit, MODEL: _assistant})


class SGLangProfile(EngineProfile):
    """SGLang as a serving config (``--speculative-algorithm``) and its gauges."""

    name = "sglang"
    title = "SGLang"
    draft_sampling = "argmax"
    metrics = SGLANG_METRICS
    serving_table = SGLANG_SERVING


class TransformersProfile(EngineProfile):
    """transformers' assisted generation (``generate(assistant_model=...)``): the rule that samples drafts."""

    name = "transformers"
    title = "transformers"
    draft_sampling = "sampled"
    serving_table = TRANSFORMERS_SERVING

    def tau_applies(self, kind: DrafterKind) -> bool:
        """A drafter with a model: ``assistant_confidence_threshold`` stops its drafts (a lookup has no confidence)."""
        return not kind.model_free
