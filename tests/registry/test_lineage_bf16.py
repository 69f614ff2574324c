"""derived:bf16 through the registry, like int8: the recipe (with its dtype) is stored, lineage
says which side changed, and the worker re-derives the draft from the target it was derived from."""

from __future__ import annotations

import json

import pytest
import torch

from tests.support.mlflow_server import sqlite_store
from tests.support.models import save_tiny_checkpoint
from tests.support.store import model_store
from tests.support.registry import open_registry_at


@pytest.fixture()
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    uri = sqlite_store(tmp_path / "store")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    t1 = save_tiny_checkpoint(tmp_path / "t1", seed=0, hidden_size=64)
    t2 = save_tiny_checkpoint(tmp_path / "t2", seed=0, hidden_size=64, perturb=0.05)  # "fine-tuned"
    return uri, t1, t2


def test_bf16_pair_lineage_and_rederivation(env):
    import registry as R
    from flows import model_cache
    from flows.loading import cached_drafter, load_pair_models
    from registry.register import register_pair_from_refs
    from specdec.models.derived import DerivedDraftRecipe

    uri, t1, t2 = env
    registry = open_registry_at(uri)
    v1 = register_pair_from_refs(str(t1), "derived:bf16", name="p", registry=registry, store=model_store())
    assert v1.drafter_kind == "derived:bf16" and v1.pair.changed == "initial"
    assert v1.draft.name.endswith("-derived-bf16") and v1.draft.recipe["dtype"] == "bfloat16"
    recipe = DerivedDraftRecipe.from_dict(v1.draft.recipe)
    assert recipe.kind == "bf16" and recipe.keep_lm_head_fp32 is False
    # the fine-tuned target keeps the old bf16 draft: a target-only change, draft derived from t1
    v2 = register_pair_from_refs(str(t2), v1.draft.uri, name="p", registry=registry, store=model_store())
    assert (v2.drafter_kind, v2.pair.changed) == ("derived:bf16", "target")
    assert v2.pair.tags["draft.derived_from"] == v1.pair.target_uri
    # re-derived from t2: the draft side changes
    v3 = register_pair_from_refs(v2.pair.target_uri, "derived:bf16", name="p", registry=registry, store=model_store())
    assert v3.pair.changed == "draft" and v3.draft.derived_from == v2.pair.target_uri
    pv = R.get_pair_version("p", v3.pair.version, registry=registry)
    assert json.loads((pv.draft_path / "recipe.json").read_text())["recipe"]["dtype"] == "bfloat16"

    # the worker derives each draft from the target it was derived from, in bf16
    model_cache.clear()
    drafts = {}
    for v in (v2, v3):
        pv = R.get_pair_version("p", v.pair.version, download=False, registry=registry)
        _, dkey = load_pair_models(pv, device="cpu", dtype="float32")
        d = cached_drafter(dkey)
        assert d.kind == "derived:bf16" and all(p.dtype is torch.bfloat16 for p in d.drafter.parameters())
        drafts[v.pair.version] = d.drafter
    w2 = drafts[v2.pair.version].model.layers[0].mlp.up_proj.weight
    w3 = drafts[v3.pair.version].model.layers[0].mlp.up_proj.weight
    assert not torch.equal(w2, w3)  # stale (from t1) vs re-derived (from t2)
    from specdec import load_causal_lm

    old = load_causal_lm(str(t1), dtype="float32", device="cpu",
                         store=model_store()).model.model.layers[0].mlp.up_proj.weight
    assert torch.equal(w2, old.to(torch.bfloat16))
    model_cache.clear()
