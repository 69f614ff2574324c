"""The replay tracer table (``specdec.validation.replay.TRACERS``): one entry per registered drafter kind, and
``draft_trace`` dispatches on the kind that claims the decoding object, never on its type."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from specdec import NgramDrafter
from specdec.core.drafters import ModelDrafter
from specdec.kinds import DrafterKind, MissingKindEntry, kinds, register
from specdec.validation.replay import TRACERS, ModelTrace, NgramTrace, RecordingDrafter, draft_trace
from tests.support.models import tiny_llama
from tests.support.store import model_store


def test_every_registered_kind_has_a_tracer():
    assert TRACERS.missing() == []
    TRACERS.check()
    assert all(callable(TRACERS[k]) for k in kinds())


@pytest.fixture()
def model():
    return tiny_llama(61, hidden_size=32, num_layers=2)


def test_each_decoding_object_gets_its_kinds_trace(model):
    ids, y = [1, 2, 3, 1, 2], [3, 1, 2, 3]
    assert isinstance(draft_trace(NgramDrafter(max_ngram=2, min_ngram=1), ids, y, 61, kmax=3), NgramTrace)
    assert isinstance(draft_trace(RecordingDrafter(NgramDrafter()), ids, y, 61, kmax=3), NgramTrace)
    bare, wrapped = draft_trace(model, ids, y, 61, kmax=3), draft_trace(ModelDrafter(model), ids, y, 61, kmax=3)
    assert isinstance(bare, ModelTrace) and bare.argmax == wrapped.argmax and len(bare.argmax) == len(y)
    from specdec.kinds import kind_of

    skip = kind_of("layerskip:1").resolve("layerskip:1", SimpleNamespace(model=model), store=model_store()).drafter
    assert isinstance(draft_trace(skip, ids, y, 61, kmax=3), ModelTrace)
    with pytest.raises(TypeError, match="drafter must be"):
        draft_trace(object(), ids, y, 61)


class _Claimer(DrafterKind):
    """A kind added without a tracer: it claims the decoding object ``_Mine``."""

    name = "mine"

    def claims(self, obj):
        return isinstance(obj, _Mine)


class _Mine:
    pass


def test_a_kind_without_a_tracer_fails_the_check_and_the_lookup(monkeypatch):
    import specdec.kinds as registry

    monkeypatch.setattr(registry, "_KINDS", list(registry._KINDS))
    register(_Claimer())
    assert TRACERS.missing() == ["mine"]
    with pytest.raises(MissingKindEntry, match="replay tracers .* mine"):
        TRACERS.check()
    with pytest.raises(MissingKindEntry, match="'mine' has no entry in the replay tracers"):
        draft_trace(_Mine(), [1, 2], [3], 61)
