"""A toy held-out set shared by the validation tests (random short chats, an empty and a too-long prompt)."""

from __future__ import annotations

import random

from specdec.validation.heldout import HeldoutPrompt, HeldoutSet, content_version


def toy_heldout(count: int, categories: str, lengths: tuple[int, int], *, empty_at: int | None = None) -> HeldoutSet:
    """``count`` chats ``p0..`` of ``lengths`` random characters, cycling through ``categories`` (one
    letter each); plus ``empty`` (whitespace only; inserted at ``empty_at``, else appended) and
    ``long`` (600 characters: beyond the tiny models' 512-token context)."""
    rng = random.Random(0)
    prompts = [
        HeldoutPrompt(
            id=f"p{i}",
            category=categories[i % len(categories)],
            messages=[{"role": "user", "content": "".join(rng.choice("abcdefghij klmnop") for _ in range(rng.randint(*lengths)))}],
        )
        for i in range(count)
    ]
    empty = HeldoutPrompt(id="empty", category="a", messages=[{"role": "user", "content": "  "}])
    prompts.insert(len(prompts) if empty_at is None else empty_at, empty)
    prompts.append(HeldoutPrompt(id="long", category="b", text="x" * 600))
    return HeldoutSet("toy", content_version(prompts), prompts)
