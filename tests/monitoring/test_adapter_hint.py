"""The root-cause hint of an adapter pair: a new adapter of an unchanged base under an unchanged shared draft is named
as the change; the base or the draft changing keeps its own hint."""

from __future__ import annotations

from monitoring.history import Lineage
from monitoring.rules import root_cause_hint

BASE, DRAFT = "b" * 64, "d" * 64


def _lineage(adapter_hash: str | None, *, target: str = BASE, draft: str = DRAFT) -> Lineage:
    return Lineage(target, draft, "h1", "c1", "support-v3" if adapter_hash else None, adapter_hash)


def test_a_changed_adapter_is_named_and_the_shared_draft_cleared():
    hint = root_cause_hint(_lineage("a2"), _lineage("a1"))
    assert hint.startswith("adapter support-v3 changed; draft shared, unchanged:")
    assert root_cause_hint(_lineage("a1"), Lineage(BASE, DRAFT, "h1", "c1")).startswith("adapter support-v3 changed")


def test_the_same_adapter_or_another_change_keeps_its_own_hint():
    assert root_cause_hint(_lineage("a1"), _lineage("a1")).startswith("nothing changed in the pair")
    assert root_cause_hint(_lineage("a1", target="t" * 64), _lineage("a1")).startswith("target changed")
    assert root_cause_hint(_lineage("a2", draft="e" * 64), _lineage("a1")).startswith("draft changed")
