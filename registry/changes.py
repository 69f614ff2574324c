"""Which side of a pair changed between two pair versions (target, draft, decoding config), from their tags."""

from __future__ import annotations

import json

from specdec.core.config import SpeculativeConfig
from specdec.kinds import draft_identity, kind_of_label

__all__ = ["compute_changed", "same_config", "config_of", "drafter_recipe_of", "DRAFTER_RECIPE_TAG"]


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


#: the pair-version tag holding a model-free drafter's recipe (:meth:`specdec.kinds.DrafterKind.pair_recipe`)
DRAFTER_RECIPE_TAG = "drafter_recipe"


def drafter_recipe_of(tags: dict[str, str]) -> dict | None:
    """The model-free drafter recipe a pair version's tags record (e.g. the ``ngram`` sizes): the
    ``drafter_recipe`` tag (canonical JSON), else the kind's ``legacy_recipe`` (a version registered
    before recipes were stored ran the kind's defaults of that time), else None."""
    raw = tags.get(DRAFTER_RECIPE_TAG)
    if raw:
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return None
    kind = kind_of_label(tags.get("drafter_kind"))
    return dict(kind.legacy_recipe) if kind is not None and kind.legacy_recipe is not None else None


def compute_changed(prev_tags: dict[str, str] | None, new_tags: dict[str, str]) -> tuple[str, bool]:
    """Which side of the pair changed between two pair versions' tags.

    Compares ``target.weights_sha256`` + ``target.tokenizer_sha256`` + the target's LoRA adapter
    (``target_adapter.weights_sha256``; target side), the drafter kind's
    family (ngram vs model) + ``draft.weights_sha256`` + ``draft.tokenizer_sha256`` + a model-free
    drafter's recipe (:func:`drafter_recipe_of`; draft side; for a derived draft the weights hash is the
    derivation identity, so re-deriving from a new target changes it) and the decoding config (decoded
    from the tags, so versions tagged before k was renamed compare equal when their values are); a draft adapter
    (``draft_adapter.weights_sha256``) is the draft side's.

    Returns:
        ``(changed, config_changed)`` with ``changed`` in ``initial | target | draft | both | config | none``.
    """
    if not prev_tags:
        return "initial", False
    target_keys = ("target.weights_sha256", "target.tokenizer_sha256", "target_adapter.weights_sha256")
    t = [prev_tags.get(k) for k in target_keys] != [new_tags.get(k) for k in target_keys]
    prev_draft = _draft_identity(prev_tags.get("drafter_kind", ""), prev_tags.get("draft.weights_sha256"),
                                 prev_tags.get("draft.tokenizer_sha256"))
    new_draft = _draft_identity(new_tags.get("drafter_kind", ""), new_tags.get("draft.weights_sha256"),
                                new_tags.get("draft.tokenizer_sha256"))
    d = prev_draft != new_draft or drafter_recipe_of(prev_tags) != drafter_recipe_of(new_tags) or \
        prev_tags.get("draft_adapter.weights_sha256") != new_tags.get("draft_adapter.weights_sha256")
    c = not same_config(prev_tags, new_tags)
    if t and d:
        return "both", c
    if t:
        return "target", c
    if d:
        return "draft", c
    return ("config" if c else "none"), c
