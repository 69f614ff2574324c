"""EAGLE-3 heads in a real SQLite MLflow store: lineage tags round-trip (target version, training data,
parent head), the eagle3 pair version, refusing a head trained on another target, and the head of a
pair alias downloaded back for a warm start."""

from __future__ import annotations

import json

import pytest

from tests.support.mlflow_server import sqlite_store
from tests.training.eagle3_support import TINY_LAYER_IDS, quick_config, tiny_target_dir
from tests.support.gate import policy_gate
from tests.support.store import model_store
from tests.support.registry import open_registry_at


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    """Target t1 and a head trained on it; t2 (t1 fine-tuned) and a head warm-started from the first."""
    from specdec.models import load_causal_lm
    from specdec.training import train_eagle3_head

    root = tmp_path_factory.mktemp("eagle3-reg")
    t1, t2 = tiny_target_dir(root / "t1"), tiny_target_dir(root / "t2", perturb=0.05)
    cfg = quick_config(epochs=1, num_sequences=8)
    h1 = train_eagle3_head(load_causal_lm(str(t1), store=model_store()), out_dir=root / "h1", config=cfg, layer_ids=TINY_LAYER_IDS,
                           progress=False)
    h2 = train_eagle3_head(load_causal_lm(str(t2), store=model_store()), out_dir=root / "h2", config=cfg, init_from=h1.out_dir,
                           progress=False)
    return {"t1": t1, "t2": t2, "h1": h1, "h2": h2}


@pytest.fixture()
def uri(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    return sqlite_store(tmp_path / "store")


def test_lineage_round_trips_through_the_store(uri, heads):
    import registry as R
    from registry.register import register_trained_head

    registry = open_registry_at(uri)
    pv1 = register_trained_head(heads["h1"].out_dir, "pair-e", str(heads["t1"]), registry=registry, gate=policy_gate(),
                                store=model_store())
    pv2 = register_trained_head(heads["h2"].out_dir, "pair-e", str(heads["t2"]), registry=registry, gate=policy_gate(),
                                store=model_store())
    assert (pv1.drafter_kind, pv2.drafter_kind) == ("eagle3", "eagle3")
    h1 = R.get_model_version(pv1.draft_uri, registry=registry)
    h2 = R.get_model_version(pv2.draft_uri, registry=registry)
    doc1 = json.loads((heads["h1"].out_dir / "training.json").read_text())
    assert h1.tags["eagle3.target"] == pv1.target_uri == "models:/pair-e-target/1"
    assert h1.tags["eagle3.target_weights_sha256"] == R.get_model_version(pv1.target_uri, registry=registry).weights_sha256
    assert h1.tags["eagle3.training_data_sha256"] == doc1["lineage"]["training_data_sha256"]
    assert (h1.tags["eagle3.parent"], h1.tags["eagle3.trained_by"]) == ("none", "specdec")
    assert h2.tags["eagle3.parent"] == pv1.draft_uri == "models:/pair-e-eagle3/1"
    assert (h2.tags["eagle3.target"], pv2.draft_uri) == ("models:/pair-e-target/2", "models:/pair-e-eagle3/2")
    back = R.get_pair_version("pair-e", "challenger", download=False, registry=registry)
    assert back.version == pv2.version and back.changed == "both"
    assert back.tags["draft.eagle3.parent"] == "models:/pair-e-eagle3/1"
    assert back.tags["draft.eagle3.target"] == "models:/pair-e-target/2"
    again = register_trained_head(heads["h2"].out_dir, "pair-e", str(heads["t2"]), registry=registry, gate=policy_gate(),
                                  store=model_store())
    assert again.reused and again.version == pv2.version


def test_a_head_registered_with_another_target_is_refused(uri, heads):
    from registry.register import register_trained_head

    with pytest.raises(ValueError, match="was trained on a target with weights"):
        register_trained_head(heads["h1"].out_dir, "pair-x", str(heads["t2"]), registry=open_registry_at(uri), gate=policy_gate(),
                              store=model_store())


def test_the_head_of_a_pair_alias_downloads_for_a_warm_start(uri, heads):
    import torch

    from registry.heads import head_directory
    from registry.register import register_trained_head
    from specdec.models.eagle3 import load_eagle3

    registry = open_registry_at(uri)
    register_trained_head(heads["h1"].out_dir, "pair-d", str(heads["t1"]), registry=registry, gate=policy_gate(),
                          store=model_store())
    for ref in ("models:/pair-d@challenger", "models:/pair-d-eagle3/1"):
        head = load_eagle3(head_directory(ref, registry=registry))
        assert torch.equal(head.fc.weight, heads["h1"].head.fc.weight.cpu()), ref
    from registry.register import register_pair_from_refs

    pv = register_pair_from_refs(str(heads["t1"]), "ngram", name="pair-n", registry=registry, store=model_store())
    with pytest.raises(ValueError, match="is a ngram pair, not an EAGLE-3 head"):
        head_directory(f"models:/pair-n/{pv.pair.version}", registry=registry)


def test_pair_register_takes_an_eagle3_draft_spec(uri, heads):
    from registry.register import register_pair_from_refs

    registry = open_registry_at(uri)
    r1 = register_pair_from_refs(str(heads["t1"]), f"eagle3:{heads['h1'].out_dir}", name="pair-s", registry=registry,
                                 store=model_store())
    assert (r1.drafter_kind, r1.draft.uri, r1.pair.changed) == ("eagle3", "models:/pair-s-eagle3/1", "initial")
    # the target-only fine-tune: the old head with the new target (its lineage still says t1)
    r2 = register_pair_from_refs(str(heads["t2"]), "eagle3:models:/pair-s-eagle3/1", name="pair-s", registry=registry,
                                 store=model_store())
    assert (r2.pair.changed, r2.pair.draft_uri) == ("target", "models:/pair-s-eagle3/1")
    assert r2.pair.tags["draft.eagle3.target"] == "models:/pair-s-target/1" != r2.pair.target_uri
    with pytest.raises(ValueError, match="is not a registered EAGLE-3 head"):
        register_pair_from_refs(str(heads["t2"]), "eagle3:models:/pair-s-target/1", name="pair-s", registry=registry,
                                store=model_store())
