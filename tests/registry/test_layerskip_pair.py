"""A ``layerskip`` pair registers from references (its own registrar: no draft version, the recipe
``{"num_layers": N}`` as the pair's), reads back, is reused when identical, loads the target's own first N layers
and serves as transformers' early exit. Real SQLite MLflow store."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.support.mlflow_server import sqlite_store
from tests.support.models import save_tiny_checkpoint
from tests.support.store import model_store
from tests.support.registry import open_registry_at


@pytest.fixture()
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    return sqlite_store(tmp_path / "store"), save_tiny_checkpoint(tmp_path / "t", seed=5)


def test_a_layerskip_pair_registers_loads_and_serves(store, monkeypatch):
    from flows.loading import cached_drafter, load_pair_models
    from registry import get_pair_version
    from registry.register import register_pair_from_refs
    from registry.runs import serving_config_for

    uri, ckpt = store
    monkeypatch.setenv("SPECDEC_TRACKING_URI", uri)
    registry = open_registry_at(uri)
    reg = register_pair_from_refs(str(ckpt), "layerskip:1", name="ls", registry=registry, engine="transformers",
                                  store=model_store())
    assert (reg.drafter_kind, reg.draft, reg.pair.draft_uri, reg.pair.recipe) == ("layerskip", None, None,
                                                                                 {"num_layers": 1})
    assert any("layer-skip draft" in n for n in reg.pair.compatibility.get("notes", []))
    again = register_pair_from_refs(str(ckpt), "layerskip:1", name="ls", registry=registry, store=model_store()).pair
    assert again.reused and again.version == reg.pair.version
    pv = get_pair_version("ls", reg.pair.version, download=False, registry=registry)
    assert pv.recipe == {"num_layers": 1} and pv.tags["draft"] == "none"
    _, key = load_pair_models(pv, device="cpu", dtype="float32")
    assert cached_drafter(key).drafter.config.num_hidden_layers == 1
    sc = serving_config_for(pv.tags, SimpleNamespace(config={"num_speculative_tokens": 3}, drafter_kind="layerskip"))
    assert sc["generate_kwargs"]["assistant_early_exit"] == 1 and sc["generate_kwargs"]["num_assistant_tokens"] == 3


def test_plain_layerskip_fixes_half_the_targets_layers_and_a_bad_n_is_one_line(store):
    from registry.register import register_pair_from_refs
    from specdec.kinds import DrafterSpecError

    uri, ckpt = store
    registry = open_registry_at(uri)
    plain = register_pair_from_refs(str(ckpt), "layerskip", name="ls2", registry=registry, store=model_store()).pair
    assert plain.recipe == {"num_layers": 1}  # the tiny checkpoint has 2 layers
    with pytest.raises(DrafterSpecError, match="num_layers must be in 1..1, got 2"):
        register_pair_from_refs(str(ckpt), "layerskip:2", name="ls3", registry=registry, store=model_store())
