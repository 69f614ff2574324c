"""What the user copies into serving: the engine's speculative-decoding settings for a validated pair.

:func:`serving_config` turns a validated pair (drafter kind, draft reference, validated k) into the
configuration of one serving engine profile:

* ``vllm``: the ``--speculative-config`` JSON (``vllm serve ... --speculative-config '<json>'`` or
  ``LLM(speculative_config=...)``): ``method`` ``draft_model`` (``eagle3`` for an EAGLE-3 head) with ``model``,
  ``ngram`` with ``prompt_lookup_max`` / ``prompt_lookup_min`` for the n-gram drafter, and
  ``num_speculative_tokens`` = k (vLLM ``vllm/config/speculative.py``, ``SpeculativeMethod``).
* ``sglang``: ``--speculative-algorithm`` ``STANDALONE`` (a separate small draft LLM), ``EAGLE3`` or ``NGRAM``,
  ``--speculative-draft-model-path``, ``--speculative-num-steps`` k, ``--speculative-eagle-topk`` 1
  (a chain, as validated here) and ``--speculative-num-draft-tokens`` k + 1 (the draft tokens plus the
  root; SGLang docs, "Speculative Decoding", full parameter reference).
* ``transformers``: ``generate()`` keywords: ``assistant_model`` + ``num_assistant_tokens`` k with a
  ``constant`` schedule, or ``prompt_lookup_num_tokens`` k for the n-gram drafter.
* ``llamacpp``: the ``llama-server`` command (:class:`specdec.engines.llama_server.LlamaServerFlags`):
  ``-m <target.gguf> --spec-type draft-simple --spec-draft-model <draft.gguf> --spec-draft-n-max k
  --spec-draft-n-min 0 --spec-draft-p-min 0 --spec-draft-sampling greedy``: the rule the core validated
  (fixed k, argmax drafts). llama.cpp serves GGUF files only; its n-gram types are its own lookups.

Every model reference is what the engine loads: a Hub id or a local path (a GGUF file for llama.cpp),
never an MLflow URI; a registered checkpoint without one comes with the command that downloads it
(``download``). A derived draft (a cast/quantized copy of the target) is the target's checkpoint
with the derivation recipe: the engine loads the target as the draft and casts/quantizes it
(``derived`` says how; ``derived:bf16`` is the target itself on an engine that runs it in bf16).
"""

from __future__ import annotations

from typing import Any

__all__ = ["ENGINES", "DEFAULT_ENGINE", "serving_config"]

from specdec.core.config import SpeculativeConfig
from specdec.engines.profiles import DEFAULT_ENGINE, engine_for_rule, engine_names, engine_profile
from specdec.kinds import ServingRequest, kind_of

#: the engine profiles (:data:`specdec.engines.profiles.ENGINE_PROFILES`; each says its proposal rule)
ENGINES = engine_names()


def serving_config(engine: str, drafter_kind: str, num_speculative_tokens: int, *, draft: str | None,
                   drafter_recipe: dict | None = None, assistant_confidence_threshold: float | None = None, target: str | None = None,
                   target_adapter: str | None = None) -> dict[str, Any]:
    """The serving settings of one engine profile for a validated pair.

    Args:
        engine: ``vllm``, ``sglang``, ``transformers`` or ``llamacpp``.
        drafter_kind: a stored label (``model``, ``ngram``, ``derived:<kind>``, ``eagle3``): its kind
            (:func:`specdec.kinds.kind_of`) is looked up in the engine profile's serving table
            (:meth:`~specdec.engines.profile.EngineProfile.serving_config`).
        num_speculative_tokens: the validated k (>= 1).
        draft: the draft model reference the engine loads (path or Hub id; llama.cpp: a GGUF file);
            ignored for ``ngram``.
        drafter_recipe: what a model-free drafter was validated or registered with beyond its label
            (``ngram``: ``{"max_ngram", "min_ngram"}``, vLLM's ``prompt_lookup_max`` / ``prompt_lookup_min``);
            None for the kind's defaults.
        assistant_confidence_threshold: the validated tau, if any: transformers takes it as is; vLLM and
            SGLang have no per-token confidence stop, so it is reported under ``not_applied``.
        target: the target reference (llama.cpp: the target GGUF, required there).
        target_adapter: the target's LoRA adapter as the engine loads it (llama.cpp: a GGUF LoRA file from
            ``convert_lora_to_gguf.py``, served with ``--lora``; docs/adapters.md, Engines); None: no adapter.
    Returns:
        ``{"engine", "num_speculative_tokens", "drafter_kind", ...}`` plus, per engine,
        ``speculative_config`` and ``args`` (vLLM), ``args`` (SGLang) or ``generate_kwargs``
        (transformers). ``args`` is a list of command-line arguments, ready for ``shlex.join``;
        llama.cpp: ``args`` and ``command`` (the whole ``llama-server`` line).
    Raises:
        ValueError: unknown engine, k < 1, a model drafter without ``draft``, an EAGLE-3 head on transformers,
            llama.cpp without GGUF files or with a drafter kind it cannot serve as validated, a target adapter on an
            engine whose serving config does not carry one yet or that is not a GGUF file for llama.cpp.
        MissingKindEntry: the drafter kind has no entry in the engine's serving table.
    """
    profile = engine_profile(engine)
    k = int(num_speculative_tokens)
    if k < 1:
        raise ValueError(f"num_speculative_tokens must be >= 1, got {k}")
    kind = kind_of(drafter_kind)
    if target_adapter is not None and not profile.serves_target_adapter:
        raise ValueError(f"the {profile.title} serving config does not carry a target adapter yet (docs/adapters.md, "
                         "Engines): serve the adapter {target_adapter} with the engine's own LoRA flags")
    out: dict[str, Any] = {"engine": engine, "num_speculative_tokens": k, "drafter_kind": drafter_kind,
                           "draft_sampling": profile.draft_sampling}
    tau = assistant_confidence_threshold
    if tau is not None and not profile.tau_applies(kind):
        out["not_applied"] = {"assistant_confidence_threshold": tau}
    req = ServingRequest(engine=engine, label=drafter_kind, k=k, draft=None if kind.model_free else draft, target=target,
                         recipe=drafter_recipe,
                         tau=tau if profile.tau_applies(kind) else None, target_adapter=target_adapter)
    served = profile.serving_config(kind, req)
    if "not_applied" in out and "not_applied" in served:
        served["not_applied"] = {**out["not_applied"], **served["not_applied"]}
    return {**out, **served}


def engine_config(engine: str | None, config: SpeculativeConfig) -> tuple[str, SpeculativeConfig]:
    """The engine profile of a pair and its config under that engine's proposal rule, so the nightly
    measures acceptance as the engine counts it (docs/metrics.md, "proposal rule").

    ``engine=None``: the first engine of the registry with the config's rule
    (:func:`~specdec.engines.profiles.engine_for_rule`): ``transformers`` for a sampling config with the sampled
    rule (the one engine that samples drafts from q), else ``vllm``. A named engine whose rule differs from a config left at the
    default rule (``sampled``) gets its rule (``vllm``/``sglang``: ``argmax``).

    Raises:
        ValueError: unknown engine; an explicit ``draft_sampling`` the engine does not use.
    """
    from dataclasses import replace

    if engine is None:
        sampled = not config.sampling.is_greedy and config.draft_sampling == "sampled"
        return engine_for_rule("sampled" if sampled else "argmax"), config
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}: use {', '.join(ENGINES[:-1])} or {ENGINES[-1]}")
    rule = engine_profile(engine).draft_sampling
    if config.draft_sampling == rule or config.sampling.is_greedy and config.draft_sampling == "sampled":
        return engine, config  # greedy: both rules are the same algorithm; the default tag set stays as it was
    if config.draft_sampling != "sampled":
        raise ValueError(f"engine {engine} proposes drafts by {rule}, but the config says draft_sampling="
                         f"{config.draft_sampling}: drop one of them")
    return engine, replace(config, draft_sampling=rule)


def report_serving_config(report: Any) -> dict[str, Any] | None:
    """The serving configuration a validation report supports: its engine from its proposal rule
    (:func:`engine_config` with no engine), its validated k and draft reference. None for a drafter
    an engine cannot serve here (no draft reference, e.g. a bare model object).

    Args:
        report: a :class:`specdec.validation.report.ValidationReport`.
    """
    cfg = SpeculativeConfig.from_dict(report.config or {})
    engine, cfg = engine_config(None, cfg)
    kind = report.drafter_kind
    refused = not_served(kind, cfg.num_speculative_tokens) or _adapter_not_printed(report, cfg.num_speculative_tokens)
    if refused is not None:
        return refused
    dkind = kind_of(kind)
    if not engine_profile(engine).serves(dkind):  # e.g. transformers has no EAGLE-3 drafter: the first engine that
        engine = engine_for_rule(engine_profile(engine).draft_sampling, dkind)  # has; its rule differs only at T > 0
    target = getattr(report, "target_ref", None)
    draft = target if dkind.derives_from_target else report.drafter_ref  # as `pair show` (registry.runs)
    try:
        out = serving_config(engine, kind, cfg.num_speculative_tokens, draft=draft, target=target,
                             drafter_recipe=report.drafter_recipe,
                             assistant_confidence_threshold=cfg.assistant_confidence_threshold)
    except ValueError:
        return None
    note = dkind.serving_note(kind)
    return {**out, "derived": note} if note else out


def _adapter_not_printed(report: Any, k: int | None) -> dict[str, Any] | None:
    """``{"none": why, ...}`` for a report of an adapted target (the base's flags alone would serve the base; the
    engine needs the adapter in its own format, docs/adapters.md), else None."""
    adapter = getattr(report, "target_adapter", None)
    if not adapter:
        return None
    name = adapter.get("name") or "adapter"
    return {"none": f"the target carries LoRA adapter {name}: serve it with llama.cpp's --lora <adapter GGUF> "
                    f"(`specdec engine serve --lora`) or vLLM's --enable-lora --lora-modules {name}=<dir> "
                    "(docs/adapters.md, Engines)", "num_speculative_tokens": k}


def not_served(kind: str, k: int | None) -> dict[str, Any] | None:
    """``{"none": why, "num_speculative_tokens": k}`` for a drafter no engine should be configured with as
    validated, else None: ``derived:bf16`` is the target itself to an engine that runs the target in bf16
    (c = 1, it cannot pay). The one answer ``validate`` and ``pair show`` (:mod:`registry.runs`) both give."""
    dkind = kind_of(kind)
    if dkind.derives_from_target and getattr(dkind, "precision", lambda _k: None)(kind) == "bf16":
        return {"none": dkind.serving_note(kind), "num_speculative_tokens": k}
    return None
