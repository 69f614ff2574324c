"""Which side of a pair changed between two pair versions (target, draft, decoding config), from their tags."""

from __future__ import annotations

from specdec.core.config import SpeculativeConfig
from specdec.kinds import draft_identity

__all__ = ["compute_changed", "same_config", "config_of"]


def config_of(tags: dict[str, str]) -> SpeculativeConfig | None:
    """The decoding config recorded in a pair version's tags, or None when they hold none."""
    try:
        return SpeculativeConfig.from_tags(tags)
    except (KeyError, TypeError, ValueError):
        return None


def same_config(a: dict[str, str], b: dict[str, str]) -> bool:
    """Whether two pair versions' tags record the same decoding config.

    Compares the decoded configs when both tag sets hold one (so a version tagged before k was
    renamed equals one tagged after), else the ``config_sha256`` tags.
    """
    ca, cb = config_of(a), config_of(b)
    if ca is not None and cb is not None:
        return ca == cb
    return a.get("config_sha256") == b.get("config_sha256")


def _draft_identity(kind: str, weights: str | None, tok: str | None) -> tuple[str, str, str]:
    return draft_identity(kind, weights, tok)  # the kind's (specdec.kinds.DrafterKind.identity)


def compute_changed(prev_tags: dict[str, str] | None, new_tags: dict[str, str]) -> tuple[str, bool]:
    """Which side of the pair changed between two pair versions' tags.

    Compares ``target.weights_sha256`` + ``target.tokenizer_sha256`` (target side), the drafter kind's
    family (ngram vs model) + ``draft.weights_sha256`` + ``draft.tokenizer_sha256`` (draft side; for a
    derived draft the weights hash is the derivation identity, so re-deriving from a new target changes
    it) and the decoding config (decoded from the tags, so versions tagged before k was renamed compare
    equal when their values are).

    Returns:
        ``(changed, config_changed)`` with ``changed`` in ``initial | target | draft | both | config | none``.
    """
    if not prev_tags:
        return "initial", False
    t = (prev_tags.get("target.weights_sha256"), prev_tags.get("target.tokenizer_sha256")) != (
        new_tags.get("target.weights_sha256"), new_tags.get("target.tokenizer_sha256"))
    prev_draft = _draft_identity(prev_tags.get("drafter_kind", ""), prev_tags.get("draft.weights_sha256"),
                                 prev_tags.get("draft.tokenizer_sha256"))
    new_draft = _draft_identity(new_tags.get("drafter_kind", ""), new_tags.get("draft.weights_sha256"),
                                new_tags.get("draft.tokenizer_sha256"))
    d = prev_draft != new_draft
    c = not same_config(prev_tags, new_tags)
    if t and d:
        return "both", c
    if t:
        return "target", c
    if d:
        return "draft", c
    return ("config" if c else "none"), c
