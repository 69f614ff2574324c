"""Worker-side cache of loaded models, so champion and challenger sharing a target load it once.

Keyed by the registry's content hashes, not by names, so a re-registered alias pointing at new
weights never reuses stale weights. The cache lives for the worker process (LRU of a few entries).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

_LOCK = threading.Lock()
_CACHE: OrderedDict[tuple, Any] = OrderedDict()
MAX_ENTRIES = 4


def cached(key: tuple, load) -> Any:
    """Return ``load()`` for ``key``, computing it once per worker process (LRU, ``MAX_ENTRIES``)."""
    with _LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
    value = load()
    with _LOCK:
        _CACHE[key] = value
        while len(_CACHE) > MAX_ENTRIES:
            _CACHE.popitem(last=False)
    return value


def clear() -> None:
    """Drop every cached model (tests, or to free memory)."""
    with _LOCK:
        _CACHE.clear()
