"""A stratified held-out subset of *short* prompts: every category, prompts chosen by token length.

Spec-Bench's summarization and RAG prompts run to ~800 tokens; on a small CPU their prefill
dominates a quick measurement (``specdec draft recommend``, the demo). :func:`short_prompts`
keeps every category but draws, inside each, only among prompts of at most ``max_prompt_tokens``
tokens (as the models see them: chat template applied), topping up with the shortest prompts when
a category has too few that short.
"""

from __future__ import annotations

import random

from specdec.validation.heldout import HeldoutSet, content_version, prompt_token_ids

__all__ = ["short_prompts"]


def short_prompts(heldout: HeldoutSet, tokenizer, *, per_category: int, max_prompt_tokens: int | None,
                  seed: int = 0) -> HeldoutSet:
    """``per_category`` prompts from every category, drawn among the short ones.

    Args:
        heldout: the full held-out set.
        tokenizer: the target's tokenizer (lengths include the chat template).
        per_category: prompts per category (>= 1); a category with fewer gives all it has.
        max_prompt_tokens: length limit for the draw; ``None`` draws among all prompts. When a
            category has fewer than ``per_category`` prompts that short, its shortest prompts
            fill the gap.
        seed: seeds the draw inside each category (independent of the other categories).
    Returns:
        A :class:`HeldoutSet` (same name, its own content version, ``source_version`` of the full
        set, ``subset_spec`` recording the choice), prompts in file order. Empty prompts are
        never chosen.
    Raises:
        ValueError: ``per_category < 1`` or ``max_prompt_tokens < 1``.
    """
    if per_category < 1:
        raise ValueError(f"per_category must be >= 1, got {per_category}")
    if max_prompt_tokens is not None and max_prompt_tokens < 1:
        raise ValueError(f"max_prompt_tokens must be >= 1, got {max_prompt_tokens}")
    by_cat: dict[str, list[tuple[int, int]]] = {}
    for i, p in enumerate(heldout.prompts):
        if p.is_empty:
            continue
        by_cat.setdefault(p.category, []).append((len(prompt_token_ids(p, tokenizer)), i))
    chosen: list[int] = []
    for cat in sorted(by_cat):
        items = by_cat[cat]
        short = [i for n, i in items if max_prompt_tokens is None or n <= max_prompt_tokens]
        random.Random(f"specdec-short:{seed}:{cat}").shuffle(short)
        pick = short[:per_category]
        if len(pick) < per_category:
            rest = [i for n, i in sorted(items) if i not in set(pick)]
            pick += rest[: per_category - len(pick)]
        chosen.extend(pick)
    prompts = [heldout.prompts[i] for i in sorted(chosen)]
    return HeldoutSet(
        name=heldout.name,
        version=content_version(prompts),
        prompts=prompts,
        source_version=heldout.source_version,
        subset_spec={"per_category": per_category, "max_prompt_tokens": max_prompt_tokens or 0, "seed": seed},
    )
