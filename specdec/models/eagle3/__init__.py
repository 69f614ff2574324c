"""EAGLE-3 heads in the ``speculators`` format: config, model, checkpoint I/O, compatibility checks.

Modules: :mod:`~specdec.models.eagle3.config` (:class:`Eagle3Config`), :mod:`~specdec.models.eagle3.head`
(:class:`Eagle3Head`), :mod:`~specdec.models.eagle3.checkpoint` (:func:`load_eagle3`, :func:`save_eagle3`),
:mod:`~specdec.models.eagle3.compat` (:func:`check_head_target`).
"""

from __future__ import annotations

from specdec.lazy import lazy_exports

_EXPORTS = {
    "Eagle3Config": "specdec.models.eagle3.config",
    "Eagle3ConfigError": "specdec.models.eagle3.config",
    "default_layer_ids": "specdec.models.eagle3.config",
    "Eagle3Head": "specdec.models.eagle3.head",
    "load_eagle3": "specdec.models.eagle3.checkpoint",
    "save_eagle3": "specdec.models.eagle3.checkpoint",
    "read_eagle3_config": "specdec.models.eagle3.checkpoint",
    "is_eagle3_dir": "specdec.models.eagle3.checkpoint",
    "check_head_target": "specdec.models.eagle3.compat",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
