"""Engine profiles the product serves a pair on but does not ask (yet): their serving config, proposal
rule and ``/metrics`` names only; :meth:`~specdec.engines.profile.EngineProfile.connect` says the engine
check cannot ask them.

* vLLM: ``--speculative-config`` JSON (the kinds spell ``method``), argmax drafting, the ``vllm:spec_decode_*``
  counters. (Its client and fingerprint: the vLLM profile module, where it exists.)
* SGLang: ``--speculative-algorithm`` and a top-1 chain of k; gauges only (``sglang:spec_accept_rate``/``length``).
* transformers: ``generate()`` keywords (``assistant_model``, ``prompt_lookup_num_tokens``); drafts sampled from q.
"""

from __future__ import annotations

from specdec.engines.metrics import ENGINES
from specdec.engines.profile import EngineProfile

__all__ = ["VllmServingProfile", "SGLangProfile", "TransformersProfile"]


class VllmServingProfile(EngineProfile):
    """vLLM as a serving config (``vllm serve --speculative-config``) and its counters."""

    name = "vllm"
    title = "vLLM"
    draft_sampling = "argmax"
    metrics = ENGINES["vllm"]


class SGLangProfile(EngineProfile):
    """SGLang as a serving config (``--speculative-algorithm``) and its gauges."""

    name = "sglang"
    title = "SGLang"
    draft_sampling = "argmax"
    metrics = ENGINES["sglang"]


class TransformersProfile(EngineProfile):
    """transformers' assisted generation (``generate(assistant_model=...)``): the rule that samples drafts."""

    name = "transformers"
    title = "transformers"
    draft_sampling = "sampled"
