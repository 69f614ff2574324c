"""Validation: held-out sets, the validation runner, aggregation and the report.

Modules: :mod:`~specdec.validation.heldout` (held-out sets), :mod:`~specdec.validation.config`
(:class:`ValidationConfig`), :mod:`~specdec.validation.api` (the one entry: :func:`validate` of a
:class:`ValidationRequest`), its three measurements :mod:`~specdec.validation.decode`,
:mod:`~specdec.validation.replay_report` and :mod:`~specdec.validation.engine_check` (the engine check, with
``ValidationRequest.engine_check``), :mod:`~specdec.validation.runner` (groups of prompts, B = 1 included),
:mod:`~specdec.validation.prompt_run`, :mod:`~specdec.validation.teacher_forcing`,
:mod:`~specdec.validation.timing`, :mod:`~specdec.validation.aggregate`,
:mod:`~specdec.validation.metrics` (estimators), :mod:`~specdec.validation.findings`,
:mod:`~specdec.validation.provenance`, :mod:`~specdec.validation.report` (torch-free: what
registry and monitoring read; a report with an engine check section reads it through
:mod:`~specdec.validation.engine_report`).
"""

from __future__ import annotations

from specdec.lazy import lazy_exports

_EXPORTS = {
    "ValidationConfig": "specdec.validation.config",
    "validate": "specdec.validation.api",
    "ValidationRequest": "specdec.validation.api",
    "ValidationProgress": "specdec.validation.api",
    "EngineCheck": "specdec.validation.engine_check",
    "ValidationReport": "specdec.validation.report",
    "GroupMetrics": "specdec.validation.report",
    "PromptResult": "specdec.validation.report",
    "HeldoutSet": "specdec.validation.heldout",
    "HeldoutPrompt": "specdec.validation.heldout",
    "load_heldout": "specdec.validation.heldout",
    "ALPHA_HAT_ESTIMATOR": "specdec.validation.provenance",
    "aggregate": "specdec.validation.aggregate",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
