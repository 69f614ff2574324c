"""What the user copies into serving: the engine's speculative-decoding settings for a validated pair.

:func:`serving_config` turns a validated pair (drafter kind, draft reference, validated k) into the
configuration of one serving engine profile:

* ``vllm``: the ``--speculative-config`` JSON (``vllm serve ... --speculative-config '<json>'`` or
  ``LLM(speculative_config=...)``): ``method`` ``draft_model`` with ``model`` for a draft model,
  ``ngram`` with ``prompt_lookup_max`` / ``prompt_lookup_min`` for the n-gram drafter, and
  ``num_speculative_tokens`` = k (vLLM ``vllm/config/speculative.py``, ``SpeculativeMethod``).
* ``sglang``: ``--speculative-algorithm`` ``STANDALONE`` (a separate small draft LLM) or ``NGRAM``,
  ``--speculative-draft-model-path``, ``--speculative-num-steps`` k, ``--speculative-eagle-topk`` 1
  (a chain, as validated here) and ``--speculative-num-draft-tokens`` k + 1 (the draft tokens plus the
  root; SGLang docs, "Speculative Decoding", full parameter reference).
* ``transformers``: ``generate()`` keywords: ``assistant_model`` + ``num_assistant_tokens`` k with a
  ``constant`` schedule, or ``prompt_lookup_num_tokens`` k for the n-gram drafter.

A derived draft (a quantized/cast copy of the target) is served as a draft model: ``model`` is the
registered draft (its recipe re-derives it); the engine must be able to load that checkpoint.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["ENGINES", "DEFAULT_ENGINE", "serving_config"]

ENGINES = ("vllm", "sglang", "transformers")
DEFAULT_ENGINE = "vllm"


def serving_config(engine: str, drafter_kind: str, num_speculative_tokens: int, *, draft: str | None,
                   prompt_lookup_max: int = 4, prompt_lookup_min: int = 1) -> dict[str, Any]:
    """The serving settings of one engine profile for a validated pair.

    Args:
        engine: ``vllm``, ``sglang`` or ``transformers``.
        drafter_kind: ``model``, ``ngram`` or ``derived:<kind>``.
        num_speculative_tokens: the validated k (>= 1).
        draft: the draft model reference (path, Hub id or ``models:/`` URI); ignored for ``ngram``.
        prompt_lookup_max, prompt_lookup_min: the n-gram drafter's suffix lengths (tokens).
    Returns:
        ``{"engine", "num_speculative_tokens", "drafter_kind", ...}`` plus, per engine,
        ``speculative_config`` and ``args`` (vLLM), ``args`` (SGLang) or ``generate_kwargs``
        (transformers). ``args`` is a list of command-line arguments, ready for ``shlex.join``.
    Raises:
        ValueError: unknown engine, k < 1, or a model drafter without ``draft``.
    """
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}")
    k = int(num_speculative_tokens)
    if k < 1:
        raise ValueError(f"num_speculative_tokens must be >= 1, got {k}")
    ngram = drafter_kind == "ngram"
    if not ngram and not draft:
        raise ValueError(f"a {drafter_kind} drafter needs its draft model reference")
    out: dict[str, Any] = {"engine": engine, "num_speculative_tokens": k, "drafter_kind": drafter_kind}
    if engine == "vllm":
        spec = ({"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": prompt_lookup_max,
                 "prompt_lookup_min": prompt_lookup_min} if ngram
                else {"method": "draft_model", "model": draft, "num_speculative_tokens": k})
        out.update(speculative_config=spec, args=["--speculative-config", json.dumps(spec, separators=(",", ":"))])
    elif engine == "sglang":
        args = ["--speculative-algorithm", "NGRAM" if ngram else "STANDALONE"]
        if not ngram:
            args += ["--speculative-draft-model-path", str(draft)]
        args += ["--speculative-num-steps", str(k), "--speculative-eagle-topk", "1",
                 "--speculative-num-draft-tokens", str(k + 1)]
        out["args"] = args
    else:
        out["generate_kwargs"] = ({"prompt_lookup_num_tokens": k, "max_matching_ngram_size": prompt_lookup_max}
                                  if ngram else {"assistant_model": draft, "num_assistant_tokens": k,
                                                 "num_assistant_tokens_schedule": "constant"})
    return out
