"""The exact speculative-decoding core: configuration, sampling math, decoding loops, drafters.

Modules: :mod:`~specdec.core.config` (SamplingConfig, SpeculativeConfig; no torch),
:mod:`~specdec.core.sampling` (the math, to check against the papers, and ``verify_drafts``, the one
verifier of the loop and the replay), :mod:`~specdec.core.loops` (the speculative loop and the target-only
reference, each one loop for B >= 1), :mod:`~specdec.core.target_cache` (the target's cache behind them: static
for B = 1, masked for B > 1), :mod:`~specdec.core.decoding` / :mod:`~specdec.core.batch` (the B = 1 / B > 1
entry points: input checks), :mod:`~specdec.core.drafters` (the one drafter protocol, B = 1 a batch of one), :mod:`~specdec.core.stats` (vLLM counters), :mod:`~specdec.core.inputs` (up-front checks),
:mod:`~specdec.core.kv` (KV-cache helpers), :mod:`~specdec.core.results` (results and
``GenerationResult.record_verified``, the per-row step bookkeeping every loop shares).
"""
