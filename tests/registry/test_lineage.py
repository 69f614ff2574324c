"""Lineage and idempotency on a real SQLite MLflow store: which side of a pair changed, and
re-registration of identical weights / identical pairs reusing versions."""

from __future__ import annotations

import json

import pytest

from tests.support.mlflow_server import sqlite_store
from tests.support.models import save_tiny_checkpoint
from tests.support.registry import open_registry_at


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("lineage-ckpts")
    return {
        "t1": save_tiny_checkpoint(root / "t1", seed=0),
        "t2": save_tiny_checkpoint(root / "t2", seed=0, perturb=0.05),  # "fine-tuned" target
        "d1": save_tiny_checkpoint(root / "d1", seed=7),
        "d2": save_tiny_checkpoint(root / "d2", seed=8),
    }


@pytest.fixture()
def uri(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    return sqlite_store(tmp_path / "store")


def test_same_weights_reuse_the_version(uri, ckpts, tmp_path):
    import shutil

    import registry as R

    registry = open_registry_at(uri)
    a = R.register_model_version("target", ckpts["t1"], registry=registry)
    copy = shutil.copytree(ckpts["t1"], tmp_path / "t1-copy")  # same bytes, another directory
    b = R.register_model_version("target", copy, registry=registry)
    assert (a.version, a.reused) == ("1", False)
    assert (b.version, b.reused, b.weights_sha256) == ("1", True, a.weights_sha256)
    c = R.register_model_version("target", ckpts["t2"], registry=registry)
    assert (c.version, c.reused) == ("2", False) and c.weights_sha256 != a.weights_sha256
    # same weights from a different kind of source is a different lineage record
    e = R.register_model_version("target", ckpts["t1"], source={"kind": "hub", "ref": "org/t", "revision": "r1"}, registry=registry)
    assert (e.version, e.reused) == ("3", False)
    from mlflow import MlflowClient

    assert len(MlflowClient(uri, uri).search_model_versions("name='target'")) == 3

    # derived draft: same (target version, recipe) reuses; a new target version gives a new identity
    from specdec.models.derived import DerivedDraftRecipe

    r8 = DerivedDraftRecipe(kind="int8").to_dict()
    d1 = R.register_derived_draft(a, r8, registry=registry)
    d1b = R.register_derived_draft(a.uri, r8, registry=registry)
    d2 = R.register_derived_draft(c, r8, registry=registry)
    assert d1.name == "target-derived-int8" and d1b.reused and d1b.version == d1.version
    assert (d2.version, d2.derived_from) == ("2", "models:/target/2") and d2.weights_sha256 != d1.weights_sha256


def test_lineage_detects_which_side_changed(uri, ckpts):
    import registry as R
    from specdec.models.derived import DerivedDraftRecipe

    registry = open_registry_at(uri)
    t1 = R.register_model_version("target", ckpts["t1"], registry=registry)
    t2 = R.register_model_version("target", ckpts["t2"], registry=registry)
    d1 = R.register_model_version("draft", ckpts["d1"], registry=registry)
    d2 = R.register_model_version("draft", ckpts["d2"], registry=registry)
    cfg = R.SpeculativeConfig(4)

    def pair(t, d, kind="model", config=cfg):
        return R.register_pair(t, d, drafter_kind=kind, config=config, registry=open_registry_at(uri))

    v1 = pair(t1, d1)
    v2 = pair(t2, d1)   # target-only fine-tune
    v3 = pair(t2, d2)   # new draft
    v4 = pair(t1, d1)   # identical to v1: reused, no new version
    v5 = pair(t2, d2, config=R.SpeculativeConfig(6))  # config only, vs v3
    v6 = pair(t1, d1, config=R.SpeculativeConfig(6))  # both sides, vs v5
    v7 = pair(t1, None, kind="ngram", config=R.SpeculativeConfig(6))
    assert [(v.version, v.changed) for v in (v1, v2, v3, v5, v6, v7)] == [
        ("1", "initial"), ("2", "target"), ("3", "draft"), ("4", "config"), ("5", "both"), ("6", "draft")]
    assert (v4.version, v4.reused) == ("1", True)
    assert v2.previous_version == "1" and not v2.config_changed and v5.config_changed and not v6.config_changed

    # the pair.json artifact holds exact references, and the version tags mirror them for the UI
    back = R.get_pair_version("specdec-pair", "2", download=False, registry=registry)
    assert (back.target_uri, back.draft_uri, back.changed) == ("models:/target/2", "models:/draft/1", "target")
    assert back.tags["changed"] == "target" and back.tags["target"] == "models:/target/2"
    assert back.target_weights_sha256 == t2.weights_sha256 and back.draft_weights_sha256 == d1.weights_sha256
    ngram = R.get_pair_version("specdec-pair", "6", download=True, registry=registry)
    assert ngram.draft_uri is None and ngram.draft_path is None and ngram.target_path is not None

    # derived drafts: a draft derived from the old target, paired with the fine-tuned target, is a
    # target-only change; re-deriving from the new target then changes the draft side
    r8 = DerivedDraftRecipe(kind="int8").to_dict()
    old = R.register_derived_draft(t1, r8, registry=registry)
    new = R.register_derived_draft(t2, r8, registry=registry)
    p1 = R.register_pair(t1, old, drafter_kind="derived:int8", name="derived-pair", registry=registry)
    p2 = R.register_pair(t2, old, drafter_kind="derived:int8", name="derived-pair", registry=registry)
    p3 = R.register_pair(t2, new, drafter_kind="derived:int8", name="derived-pair", registry=registry)
    assert [p.changed for p in (p1, p2, p3)] == ["initial", "target", "draft"]
    assert p2.tags["draft.derived_from"] == "models:/target/1" and p3.tags["draft.derived_from"] == "models:/target/2"
    doc_pv = R.get_pair_version("derived-pair", "3", registry=registry)
    assert json.loads((doc_pv.draft_path / "recipe.json").read_text())["recipe"] == r8

    again = R.register_pair(t1, old, drafter_kind="derived:int8", name="derived-pair", registry=registry)
    assert (again.version, again.reused, again.recipe, again.changed) == ("1", True, r8, "initial")
    with pytest.raises(ValueError, match="incompatible pair: vocab differs"):
        R.register_pair(t1, d2, compatibility={"compatible": False, "problems": ["vocab differs"]}, registry=registry)

    with pytest.raises(ValueError, match="derived:int4"):
        R.register_pair(t2, new, drafter_kind="derived:int4", name="derived-pair", registry=registry)
    with pytest.raises(ValueError, match="derived-recipe"):
        R.register_pair(t2, new, drafter_kind="model", name="derived-pair", registry=registry)
    with pytest.raises(ValueError, match="no draft model"):
        R.register_pair(t2, d1, drafter_kind="ngram", registry=registry)


def test_compute_changed_table():
    import registry as R
    from registry.changes import compute_changed

    base = {"target.weights_sha256": "t", "target.tokenizer_sha256": "k", "drafter_kind": "model",
            "draft.weights_sha256": "d", "draft.tokenizer_sha256": "k", "config_sha256": "c"}
    assert compute_changed(None, base) == ("initial", False)
    assert compute_changed(base, dict(base)) == ("none", False)
    assert compute_changed(base, {**base, "target.tokenizer_sha256": "k2"})[0] == "target"
    assert compute_changed(base, {**base, "target.weights_sha256": "t2", "config_sha256": "c2"}) == ("target", True)
    assert compute_changed(base, {**base, "draft.weights_sha256": "d2", "target.weights_sha256": "t2"})[0] == "both"
    # a version tagged before k was renamed and one tagged after record the same config
    legacy = {**base, "num_draft_tokens": "4", "temperature": "0.0", "top_k": "none", "top_p": "none",
              "max_new_tokens": "128", "config_sha256": "old-form"}
    renamed = {**base, **R.SpeculativeConfig(4).to_tags(), "config_sha256": R.SpeculativeConfig(4).sha256()}
    assert compute_changed(legacy, renamed) == ("none", False)
    assert compute_changed(legacy, {**renamed, **R.SpeculativeConfig(5).to_tags()}) == ("config", True)
    assert compute_changed(base, {**base, "drafter_kind": "ngram", "draft.weights_sha256": "none",
                                  "draft.tokenizer_sha256": "none"})[0] == "draft"
