"""A registered n-gram pair keeps its sizes: ``ngram:3:1`` is stored as label ``ngram`` plus the recipe
``{"max_ngram": 3, "min_ngram": 1}`` (tag ``drafter_recipe``), loads as those sizes, serves as those sizes, and
differs from ``ngram`` (now 3:2); a version registered before recipes were stored loads the classic 3:1 it
ran. Real SQLite MLflow store."""

from __future__ import annotations

import pytest

from registry.changes import compute_changed, drafter_recipe_of
from tests.support.mlflow_server import sqlite_store
from tests.support.models import save_tiny_checkpoint
from tests.support.store import model_store
from tests.support.registry import open_registry_at

CLASSIC = {"max_ngram": 3, "min_ngram": 1}
DEFAULT = {"max_ngram": 3, "min_ngram": 2}


@pytest.fixture()
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    return sqlite_store(tmp_path / "store"), save_tiny_checkpoint(tmp_path / "t", seed=5)


def test_register_keeps_the_sizes_and_they_are_part_of_the_identity(store):
    from registry import get_pair_version, list_pair_versions
    from registry.register import register_pair_from_refs

    uri, ckpt = store
    registry = open_registry_at(uri)
    classic = register_pair_from_refs(str(ckpt), "ngram:3:1", name="ng", registry=registry, store=model_store()).pair
    assert (classic.drafter_kind, classic.recipe) == ("ngram", CLASSIC)
    again = register_pair_from_refs(str(ckpt), "ngram:3:1", name="ng", registry=registry, store=model_store()).pair
    assert again.reused and again.version == classic.version
    default = register_pair_from_refs(str(ckpt), "ngram", name="ng", registry=registry, store=model_store()).pair
    assert not default.reused and default.recipe == DEFAULT and default.changed == "draft"
    read = get_pair_version("ng", default.version, download=False, registry=registry)
    assert read.recipe == DEFAULT and read.tags["drafter_recipe"] == '{"max_ngram":3,"min_ngram":2}'
    assert {v.version: v.recipe for v in list_pair_versions("ng", registry=registry)} == {
        classic.version: CLASSIC, default.version: DEFAULT}


def test_the_nightly_loads_and_serves_the_registered_sizes(store, monkeypatch):
    from flows.loading import cached_drafter, load_pair_models
    from registry import get_pair_version
    from registry.register import register_pair_from_refs
    from specdec.validation.serving import serving_config

    uri, ckpt = store
    monkeypatch.setenv("SPECDEC_TRACKING_URI", uri)  # the loader reads the settings' URI, as the nightly does
    registry = open_registry_at(uri)
    pv = register_pair_from_refs(str(ckpt), "ngram:4:1", name="ng4", registry=registry, store=model_store()).pair
    pv = get_pair_version("ng4", pv.version, download=False, registry=registry)
    _, key = load_pair_models(pv, device="cpu", dtype="float32")
    d = cached_drafter(key).drafter
    assert (d.max_ngram, d.min_ngram) == (4, 1)
    spec = serving_config("vllm", pv.drafter_kind, 3, draft=None, drafter_recipe=pv.recipe)["speculative_config"]
    assert (spec["prompt_lookup_max"], spec["prompt_lookup_min"]) == (4, 1)


def test_a_version_registered_before_recipes_is_the_classic_lookup():
    legacy = {"drafter_kind": "ngram", "draft": "none", "draft.weights_sha256": "none", "draft.tokenizer_sha256": "none",
              "target.weights_sha256": "w", "target.tokenizer_sha256": "t"}
    assert drafter_recipe_of(legacy) == CLASSIC
    assert drafter_recipe_of({"drafter_kind": "model"}) is None
    assert compute_changed(legacy, {**legacy, "drafter_recipe": '{"max_ngram":3,"min_ngram":1}'})[0] == "none"
    assert compute_changed(legacy, {**legacy, "drafter_recipe": '{"max_ngram":3,"min_ngram":2}'})[0] == "draft"


def test_a_model_pair_takes_no_drafter_recipe(store):
    import registry as R

    uri, ckpt = store
    registry = open_registry_at(uri)
    t = R.register_model_version("target", ckpt, registry=registry)
    with pytest.raises(ValueError, match="keeps its recipe on its draft version"):
        R.register_pair(t, t, drafter_kind="model", drafter_recipe=CLASSIC, registry=registry)


@pytest.mark.parametrize("edit", ["not json", '{"max_ngram": 100000, "min_ngram": 1}'])
def test_a_hand_edited_recipe_tag_changes_nothing_served_or_validated(store, monkeypatch, caplog, edit):
    """Issue 43: a recipe tag edited in the MLflow UI used to be loaded and served (a non-JSON one as the kind's
    default, absurd sizes as they were) while the night had validated the registered recipe, and re-registering
    the pair then made a duplicate version. The registration (``pair.json``) holds; the edit is logged."""
    from mlflow import MlflowClient

    from flows.loading import cached_drafter, load_pair_models
    from registry import get_pair_version, list_pair_versions
    from registry.register import register_pair_from_refs

    uri, ckpt = store
    monkeypatch.setenv("SPECDEC_TRACKING_URI", uri)
    registry = open_registry_at(uri)
    pv = register_pair_from_refs(str(ckpt), "ngram:4:1", name="ng-edit", registry=registry, store=model_store()).pair
    MlflowClient(tracking_uri=uri).set_model_version_tag("ng-edit", pv.version, "drafter_recipe", edit)
    read = get_pair_version("ng-edit", pv.version, download=False, registry=registry)
    assert read.recipe == {"max_ngram": 4, "min_ngram": 1} and read.tags["drafter_recipe"] == '{"max_ngram":4,"min_ngram":1}'
    assert [v.recipe for v in list_pair_versions("ng-edit", registry=registry)] == [read.recipe]
    d = cached_drafter(load_pair_models(read, device="cpu", dtype="float32")[1]).drafter
    assert (d.max_ngram, d.min_ngram) == (4, 1)
    again = register_pair_from_refs(str(ckpt), "ngram:4:1", name="ng-edit", registry=registry, store=model_store()).pair
    assert again.reused and again.version == pv.version  # no duplicate version
    assert any("drafter_recipe was edited in MLflow" in r.getMessage() for r in caplog.records)
