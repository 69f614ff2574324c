"""``specdec pair register --target BASE --target-adapter DIR`` on a real SQLite MLflow store: the adapter is its own
model version with lineage to its base; the pair version names base + adapter (tags, description, pair.json); a new
adapter of the same base changes the target side only; an adapter of another base is refused in one line, with
nothing written."""

from __future__ import annotations

import pytest
import torch
from mlflow import MlflowClient
from typer.testing import CliRunner

from specdec.models.hashes import weights_sha256
from tests.support.adapters import save_lora_adapter
from tests.support.mlflow_server import sqlite_store
from tests.support.models import save_tiny_checkpoint
from tests.support.registry import open_registry_at


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapter-pair")
    base = save_tiny_checkpoint(root / "base", seed=0)
    return {"base": base, "draft": save_tiny_checkpoint(root / "draft", seed=0, perturb=0.1),
            "v3": save_lora_adapter(base, root / "support-v3", seed=1),
            "v4": save_lora_adapter(base, root / "support-v4", seed=2, rank=8),
            "wider": save_tiny_checkpoint(root / "wider", seed=0, hidden_size=48)}


@pytest.fixture()
def cli(tmp_path, monkeypatch):
    from specdec.cli import app

    uri = sqlite_store(tmp_path / "store")
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("SPECDEC_TRACKING_URI", uri)
    runner = CliRunner()

    def invoke(*args):
        return runner.invoke(app, ["pair", *map(str, args)], catch_exceptions=False)

    invoke.uri = uri
    return invoke


def test_an_adapter_pair_registers_with_lineage_to_its_base(cli, dirs):
    import registry as R

    r = cli("register", "--target", dirs["base"], "--target-adapter", dirs["v3"], "--draft", dirs["draft"], "-k", 3)
    assert r.exit_code == 0, r.output
    assert "registered models:/specdec-pair/1" in r.output
    assert "target adapter models:/support-v3/1  support-v3 r=4  on models:/specdec-pair-target/1" in r.output
    registry = open_registry_at(cli.uri)
    adapter = R.get_model_version("models:/support-v3/1", registry=registry)
    base_hash = weights_sha256(dirs["base"])
    assert adapter.artifact == "lora-adapter" and adapter.weights_sha256 == weights_sha256(dirs["v3"])
    assert {k: adapter.tags[k] for k in ("adapter.base", "adapter.base_weights_sha256", "adapter.rank",
                                         "adapter.target_modules")} == {
        "adapter.base": "models:/specdec-pair-target/1", "adapter.base_weights_sha256": base_hash,
        "adapter.rank": "4", "adapter.target_modules": "q_proj,v_proj"}
    pv = R.get_pair_version("specdec-pair", "1", download=False, registry=registry)
    assert pv.target_uri == "models:/specdec-pair-target/1" and pv.target_weights_sha256 == base_hash
    assert pv.target_adapter == {"uri": "models:/support-v3/1", "name": "support-v3", "base": pv.target_uri,
                                 "weights_sha256": adapter.weights_sha256, "base_weights_sha256": base_hash,
                                 "rank": 4, "target_modules": ["q_proj", "v_proj"]}
    assert pv.draft_adapter is None
    mv = MlflowClient(cli.uri, cli.uri).get_model_version("specdec-pair", "1")
    assert mv.tags["target"] == "models:/specdec-pair-target/1" and mv.tags["target_adapter"] == "models:/support-v3/1"
    assert ("base models:/specdec-pair-target/1 + adapter support-v3 (models:/support-v3/1); draft shared, unadapted"
            in pv.description)
    shown = cli("show", "specdec-pair", "1")
    assert "target adapter" in shown.output and "models:/support-v3/1  support-v3" in shown.output
    # the same registration again reuses every version; the adapter is downloaded as the two PEFT files
    again = cli("register", "--target", dirs["base"], "--target-adapter", dirs["v3"], "--draft", dirs["draft"], "-k", 3)
    assert "already registered as models:/specdec-pair/1" in again.output and "(reused)" in again.output
    files = sorted(p.name for p in R.download_model_version(adapter, registry=registry).iterdir() if p.name[0] != ".")
    assert files == ["adapter_config.json", "adapter_model.safetensors"]


def test_a_new_adapter_of_the_base_changes_the_target_side_only(cli, dirs):
    import registry as R

    for adapter in ("v3", "v4"):
        r = cli("register", "--target", dirs["base"], "--target-adapter", dirs[adapter], "--draft", "ngram", "-k", 3)
        assert r.exit_code == 0, r.output
    r = cli("register", "--target", dirs["base"], "--draft", "ngram", "-k", 3)  # the base as it is: a third pair
    registry = open_registry_at(cli.uri)
    v1, v2, v3 = (R.get_pair_version("specdec-pair", v, download=False, registry=registry) for v in "123")
    assert (v1.changed, v2.changed, v3.changed) == ("initial", "target", "target")
    assert v1.target_uri == v2.target_uri == v3.target_uri  # one base version, shared
    assert (v2.target_adapter["name"], v2.target_adapter["rank"], v3.target_adapter) == ("support-v4", 8, None)


def test_an_adapter_of_another_base_is_refused_in_one_line_before_anything_is_written(cli, dirs):
    r = cli("register", "--target", dirs["wider"], "--target-adapter", dirs["v3"], "--draft", "ngram")
    assert r.exit_code == 1
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: adapter support-v3 does not fit base LlamaForCausalLM: "
                                                   "model.layers.0.self_attn.q_proj is 48x48"), r.output
    assert MlflowClient(cli.uri, cli.uri).search_registered_models() == []
    r = cli("register", "--target", dirs["base"], "--target-adapter", dirs["v3"], "--draft", f"eagle3:{dirs['base']}")
    assert r.exit_code == 1 and "a pair with a LoRA adapter takes a draft model, an n-gram, a derived" in r.output
    r = cli("register", "--target", dirs["base"], "--draft-adapter", dirs["v3"], "--draft", "ngram")
    assert r.exit_code == 1 and "--draft-adapter adapts a draft model; ngram has no draft checkpoint" in r.output


def test_a_derived_draft_of_an_adapter_pair_derives_from_base_plus_adapter(cli, dirs):
    import registry as R
    from flows import model_cache
    from flows.loading import cached_drafter, cached_target, load_pair_models
    from specdec.models import load_causal_lm
    from specdec.models.adapters import attach_adapter
    from specdec.models.derived import DerivedDraftRecipe, derive_draft
    from specdec.models.store import ModelStore

    r = cli("register", "--target", dirs["base"], "--target-adapter", dirs["v3"], "--draft", "derived:bf16", "-k", 3)
    assert r.exit_code == 0, r.output
    registry = open_registry_at(cli.uri)
    pv = R.get_pair_version("specdec-pair", "1", download=False, registry=registry)
    assert pv.draft_uri == "models:/specdec-pair-target-support-v3-derived-bf16/1"
    assert pv.draft_source["derived_from_adapter"]["uri"] == "models:/support-v3/1"
    model_cache.clear()
    tkey, dkey = load_pair_models(pv, device="cpu", dtype="float32")
    store = ModelStore(dirs["base"].parent / "models")
    expected = derive_draft(attach_adapter(load_causal_lm(dirs["base"], store=store), dirs["v3"]).model,
                            DerivedDraftRecipe(kind="bf16")).state_dict()
    got = cached_drafter(dkey).drafter.state_dict()
    assert got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in expected)
    assert cached_target(tkey).adapter.name == "support-v3"
    model_cache.clear()
