"""The tests' continuation cache where a test hands none of its own: the test home's, as an entry point hands
its home's down (:meth:`specdec.validation.continuation_cache.ContinuationCache.in_home`)."""

from __future__ import annotations


def home_continuations():
    """The continuation cache of this process's ``SPECDEC_HOME`` (read now)."""
    from specdec.settings import get_settings
    from specdec.validation.continuation_cache import ContinuationCache

    return ContinuationCache.in_home(get_settings().home)
