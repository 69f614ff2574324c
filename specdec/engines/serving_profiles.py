"""Engine profiles the product serves a pair on but does not ask (yet; vLLM: :mod:`specdec.engines.vllm`): their serving config, proposal
rule and ``/metrics`` names only; :meth:`~specdec.engines.profile.EngineProfile.connect` says the engine
check cannot ask them.

* SGLang: ``--speculative-algorithm`` and a top-1 chain of k; gauges only (``sglang:spec_accept_rate``/``length``).
* transformers: ``generate()`` keywords (``assistant_model``, ``prompt_lookup_num_tokens``); drafts sampled from q.
"""

from __future__ import annotations

from specdec.engines.metrics import ENGINES
from specdec.engines.profile import EngineProfile

__all__ = ["SGLangProfile", "TransformersProfile"]


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
