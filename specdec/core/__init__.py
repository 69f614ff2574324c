"""The exact speculative-decoding core: configuration, sampling math, decoding loops, drafters.

Modules: :mod:`~specdec.core.config` (SamplingConfig, SpeculativeConfig; no torch),
:mod:`~specdec.core.sampling` (the math, to check against the papers, and ``verify_drafts``, the one
verifier of both loops and the replay), :mod:`~specdec.core.decoding` (B = 1 loops),
:mod:`~specdec.core.batch` (B > 1 loops), :mod:`~specdec.core.drafters` (the one drafter protocol, B = 1 a
batch of one), :mod:`~specdec.core.stats` (vLLM counters), :mod:`~specdec.core.inputs` (up-front checks),
:mod:`~specdec.core.kv` (KV-cache helpers), :mod:`~specdec.core.results` (results and
``GenerationResult.record_verified``, the per-row step bookkeeping every loop shares).
"""
