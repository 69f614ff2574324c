"""One serving answer per drafter kind, whoever asks (issue 43, item 8): ``specdec validate`` (from the
report, :func:`specdec.validation.serving.report_serving_config`) and ``specdec pair show`` (the validation
run's ``serving_config.json``, :func:`registry.runs.serving_config_for`) agree on whether there is a
configuration and on the model an engine loads as the draft. Before: for ``derived:bf16`` ``validate`` said
"none" while ``pair show`` gave a vLLM flag whose draft was the target's own file; for the other derived
kinds ``validate`` said "none" while ``pair show`` named the target checkpoint with the recipe."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from registry.pairs import serve_tags
from registry.runs import serving_config_for
from specdec.validation.serving import report_serving_config

TARGET = "org/target"


def _draft_model(sc: dict) -> str | None:
    return (sc.get("speculative_config") or {}).get("model")


@pytest.mark.parametrize("kind", ["model", "ngram", "derived:int8", "derived:int4", "derived:bf16"])
def test_validate_and_pair_show_give_the_same_answer(kind):
    draft_ref = "org/draft" if kind == "model" else None
    report = SimpleNamespace(config={"num_speculative_tokens": 3, "temperature": 0.0}, drafter_kind=kind,
                             drafter_ref=draft_ref, target_ref=TARGET,
                             drafter_recipe={"max_ngram": 3, "min_ngram": 2} if kind == "ngram" else None)
    tags = {"engine": "vllm", "drafter_kind": kind, "target": "models:/t/1",
            "draft": "models:/d/1" if kind == "model" else "none",
            **serve_tags("target", {"kind": "hub", "repo_id": TARGET}),
            **(serve_tags("draft", {"kind": "hub", "repo_id": "org/draft"}) if kind == "model" else {})}
    if kind == "ngram":
        tags["drafter_recipe"] = '{"max_ngram":3,"min_ngram":2}'
    from_validate, from_registry = report_serving_config(report), serving_config_for(tags, report)
    assert from_validate is not None and from_registry is not None
    assert bool(from_validate.get("none")) == bool(from_registry.get("none")) == (kind == "derived:bf16")
    assert _draft_model(from_validate) == _draft_model(from_registry)
    if kind.startswith("derived:") and kind != "derived:bf16":
        assert _draft_model(from_validate) == TARGET and from_validate["derived"] == from_registry["derived"]
