"""MLflow registry for speculative-decoding draft/target pairs.

Public API (operations over one MLflow service, :class:`registry.service.Registry`: every function
takes ``registry=``, required: the service its entry point opened once, ``Registry(section)``, for the
whole job or command; nothing here reads the environment for a call)::

    from registry import (register_model_version, register_derived_draft, get_model_version,
                          register_pair, get_pair_version, list_pair_versions, resolve_alias,
                          log_validation, set_validation_tags, latest_validation_run,
                          promote, check_gate, GateConfig, SpeculativeConfig, PairVersion,
                          ModelVersionRef, RegistryError, RegistryUnavailable, PairNotFound,
                          AliasNotFound, ModelNotFound, PromotionRefused)

Submodules: ``settings`` (the registry's settings section), ``service`` (the MLflow service), ``models`` (target/draft models), ``pairs``
(pair versions + lineage), ``runs`` (validation runs + plots), ``gate`` and ``promotion`` (aliases),
``cli`` (``specdec pair ...``). ``registry`` never imports ``monitoring``.
"""

from __future__ import annotations

from registry.errors import (
    AliasNotFound, ModelNotFound, PairNotFound, PromotionRefused, RegistryError, RegistryUnavailable,
    WeightsMismatch,
)
from specdec.lazy import lazy_exports

_LAZY = {
    "ModelVersionRef": "registry.models",
    "register_model_version": "registry.models",
    "register_derived_draft": "registry.models",
    "get_model_version": "registry.models",
    "download_model_version": "registry.models",
    "SpeculativeConfig": "specdec.core.config",
    "PairVersion": "registry.pairs",
    "register_pair": "registry.pairs",
    "get_pair_version": "registry.pairs",
    "list_pair_versions": "registry.pairs",
    "resolve_alias": "registry.pairs",
    "log_validation": "registry.runs",
    "set_validation_tags": "registry.runs",
    "latest_validation_run": "registry.runs",
    "validation_history": "registry.runs",
    "GateConfig": "registry.gate",
    "GateResult": "registry.gate",
    "evaluate_gate": "registry.gate",
    "promote": "registry.promotion",
    "check_gate": "registry.promotion",
    "demote": "registry.promotion",
    "PromotionResult": "registry.promotion",
    "Registry": "registry.service",
    "set_engine": "registry.pairs",
    "get_settings": "registry.settings",
}

__all__ = sorted([*_LAZY, "AliasNotFound", "ModelNotFound", "PairNotFound", "PromotionRefused",
                  "RegistryError", "RegistryUnavailable", "WeightsMismatch"])


# mlflow takes seconds to import: load submodules on first use
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
