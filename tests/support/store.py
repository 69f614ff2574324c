"""The tests' model caches: what an entry point hands the loaders, read from the environment when called.

:func:`specdec.load_causal_lm`, :func:`specdec.models.resolve_model_ref`, the drafter kinds and the registry's
registration take a :class:`specdec.models.ModelStore` from their caller (the edge reads the settings, issue 42);
a test is such a caller. :func:`model_store` reads ``SPECDEC_MODELS_DIR`` (``CoreSettings.models_dir``) at the
call, as the command line does, so a test that points it elsewhere through the environment sees that directory.
"""

from __future__ import annotations


def model_store():
    """The :class:`specdec.models.ModelStore` of the current ``CoreSettings.models_dir``
    (:func:`specdec.settings.get_settings`). Raises ``pydantic.ValidationError`` on malformed settings."""
    from specdec.models.store import ModelStore
    from specdec.settings import get_settings

    return ModelStore(get_settings().models_dir)
