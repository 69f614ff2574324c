"""Typer options shared by every command that builds a :class:`specdec.SpeculativeConfig`
(``specdec validate``, ``specdec pair register``): one help text, one range check."""

from __future__ import annotations

from typing import Annotated

import typer

DraftSamplingOption = Annotated[str, typer.Option(
    "--draft-sampling", help="Proposal rule of model drafts: sampled (x ~ q; transformers) or argmax (the draft's "
    "argmax verified with one-hot q; what vLLM and SGLang serve). Same output; acceptance differs at T > 0.")]
ConfidenceThresholdOption = Annotated[float | None, typer.Option(
    "--assistant-confidence-threshold", min=0.0, max=1.0, help="Stop drafting within a step after a draft whose "
    "probability is below this (transformers' name; llama.cpp --draft-p-min). Default: always draft k.")]
TargetAdapterOption = Annotated[str | None, typer.Option(
    "--target-adapter", help="A PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors) merged "
    "into --target: the pair's target is the adapted model; a base it does not fit is refused. docs/adapters.md")]
DraftAdapterOption = Annotated[str | None, typer.Option(
    "--draft-adapter", help="A PEFT LoRA adapter merged into the draft model (a model:REF draft). Default: the "
    "draft as it is (one shared, unadapted draft for every target adapter).")]
