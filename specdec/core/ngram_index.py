"""Incremental n-gram index for prompt lookup: O(1) per lookup instead of a scan of the context.

:class:`NgramIndex` maps every n-gram (``min_n <= n <= max_n``) of a growing token list to the
start of its most recent occurrence that has at least one token after it. The decoding loop only
ever *appends* to the context (prompt, then verified tokens), so each new token costs
``max_n - min_n + 1`` dict writes and a lookup costs at most that many dict reads: a miss is free
next to a target forward pass. A context that is not an extension of the indexed one (another
prompt, another batch row) is re-indexed from scratch; :class:`IndexPool` keeps one index per live
context list so batched rows do not evict each other.

The match returned is exactly the brute-force definition (tested against it): for n from
``max_n`` down to ``min_n``, the most recent earlier occurrence of the context's last n tokens
whose continuation starts inside the context.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["NgramIndex", "IndexPool", "brute_force_match"]


def brute_force_match(context: Sequence[int], max_n: int, min_n: int, first: bool = False) -> tuple[int, int] | None:
    """Reference matcher: ``(n, start)`` of the longest, most recent (``first``: earliest) earlier
    occurrence of the context's suffix (``min_n <= n <= max_n``) with a non-empty continuation, or
    ``None``."""
    L = len(context)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        suffix = list(context[L - n:])
        starts = range(0, L - n) if first else range(L - n - 1, -1, -1)
        for start in starts:
            if list(context[start:start + n]) == suffix:
                return n, start
    return None


class NgramIndex:
    """The n-grams of one growing context (see module docstring).

    Args:
        max_n, min_n: n-gram sizes indexed, ``1 <= min_n <= max_n``.
        first: keep each n-gram's earliest occurrence instead of its most recent one.
    """

    def __init__(self, max_n: int, min_n: int, first: bool = False) -> None:
        self.max_n, self.min_n, self.first = max_n, min_n, first
        self.tokens: list[int] = []
        self.maps: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_n, max_n + 1)}

    def _is_extension(self, context: Sequence[int]) -> bool:
        m = len(self.tokens)
        return len(context) >= m and (m == 0 or list(context[:m]) == self.tokens)

    def update(self, context: Sequence[int]) -> None:
        """Index ``context`` (appending to what is indexed when it extends it, else from scratch)."""
        if not self._is_extension(context):
            self.tokens = []
            self.maps = {n: {} for n in self.maps}
        toks = self.tokens
        for t in context[len(toks):]:
            toks.append(int(t))
            # the n-grams ending just before the new last token now have a continuation
            end = len(toks) - 1
            for n, mp in self.maps.items():
                if end - n >= 0:
                    key = tuple(toks[end - n:end])
                    if not (self.first and key in mp):
                        mp[key] = end - n

    def match(self, context: Sequence[int]) -> tuple[int, int] | None:
        """``(n, start)`` as :func:`brute_force_match` (indexes ``context`` first)."""
        self.update(context)
        toks, L = self.tokens, len(self.tokens)
        for n in range(min(self.max_n, L - 1), self.min_n - 1, -1):
            start = self.maps[n].get(tuple(toks[L - n:]))
            if start is not None:
                return n, start
        return None


class IndexPool:
    """One :class:`NgramIndex` per context list object (at most ``size``, least recently used
    evicted), so B batched rows keep their own indexes. Identity is only a hint: every index
    still checks that the context extends what it indexed."""

    def __init__(self, max_n: int, min_n: int, size: int = 64, first: bool = False) -> None:
        self.max_n, self.min_n, self.size, self.first = max_n, min_n, size, first
        self.pool: OrderedDict[int, NgramIndex] = OrderedDict()

    def clear(self) -> None:
        """Drop every index."""
        self.pool.clear()

    def match(self, context: Sequence[int]) -> tuple[int, int] | None:
        """:meth:`NgramIndex.match` on the index kept for this context object."""
        return self.index(context).match(context)

    def index(self, context: Sequence[int]) -> NgramIndex:
        """The :class:`NgramIndex` kept for this context object (indexed up to ``context`` by its next match)."""
        key = id(context)
        idx = self.pool.get(key)
        if idx is None:
            # a new list object that extends the last one used (a growing slice) reuses its index
            last = next(reversed(self.pool)) if self.pool else None
            if last is not None and self.pool[last]._is_extension(context):
                idx = self.pool.pop(last)
            else:
                idx = NgramIndex(self.max_n, self.min_n, self.first)
            self.pool[key] = idx
            while len(self.pool) > self.size:
                self.pool.popitem(last=False)
        else:
            self.pool.move_to_end(key)
        return idx
