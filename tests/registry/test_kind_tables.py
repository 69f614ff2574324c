"""The registry's per-kind tables: how a pair is registered from references (``registry.register.REGISTRARS``)
and how its draft side is tagged and served (``registry.pairs.DRAFT_SIDES``). Each has one entry per registered
drafter kind; a kind registered without one is listed and refused by name."""

from __future__ import annotations

import pytest

from registry.pairs import DRAFT_SIDES
from registry.register import REGISTRARS
from specdec.kinds import DERIVED, EAGLE3, LAYERSKIP, MODEL, NGRAM, DrafterKind, MissingKindEntry, kinds, register
from tests.support.registry import open_registry_at

TABLES = {"REGISTRARS": REGISTRARS, "DRAFT_SIDES": DRAFT_SIDES}


@pytest.mark.parametrize("table", TABLES.values(), ids=TABLES.keys())
def test_every_registered_kind_has_an_entry(table):
    assert table.missing() == []
    table.check()
    assert all(table[k] is not None for k in kinds())


class _Unfiled(DrafterKind):
    name = "unfiled"


@pytest.mark.parametrize("table", TABLES.values(), ids=TABLES.keys())
def test_a_kind_without_an_entry_is_named(table, monkeypatch):
    import specdec.kinds as registry

    monkeypatch.setattr(registry, "_KINDS", list(registry._KINDS))
    kind = register(_Unfiled())
    assert table.missing() == ["unfiled"]
    with pytest.raises(MissingKindEntry, match="unfiled"):
        table.check()
    with pytest.raises(MissingKindEntry, match=f"'unfiled' has no entry in {table.layer}".replace("(", r"\(")
                       .replace(")", r"\)")):
        table[kind]


def test_draft_sides_say_which_pairs_name_a_draft_version_and_what_an_engine_loads():
    shape = {k.name: (DRAFT_SIDES[k].draft_version, DRAFT_SIDES[k].pair_recipe, DRAFT_SIDES[k].served_from)
             for k in (NGRAM, DERIVED, EAGLE3, LAYERSKIP, MODEL)}
    assert shape == {"ngram": (False, True, "none"), "derived": (True, False, "target"), "eagle3": (True, False, "draft"),
                     "layerskip": (False, True, "target"), "model": (True, False, "draft")}
    assert DRAFT_SIDES[EAGLE3].lineage_prefix == "eagle3." and DRAFT_SIDES[MODEL].lineage_prefix is None


def test_register_pair_checks_the_draft_side_before_any_registry_call():
    from registry.pairs import register_pair

    registry = open_registry_at()
    with pytest.raises(ValueError, match="an layerskip pair has no draft model"):
        register_pair("models:/t/1", "models:/d/1", drafter_kind="layerskip", registry=registry)
    with pytest.raises(ValueError, match="'model' needs a draft model version"):
        register_pair("models:/t/1", None, drafter_kind="model", registry=registry)
    with pytest.raises(ValueError, match="keeps its recipe on its draft version"):
        register_pair("models:/t/1", "models:/d/1", drafter_kind="derived:int8", drafter_recipe={"x": 1}, registry=registry)
