"""MLflow registry for speculative-decoding draft/target pairs.

Public API (thin wrappers over ``mlflow.MlflowClient``; every function takes ``tracking_uri=None``,
meaning ``SPECDEC_TRACKING_URI`` / ``MLFLOW_TRACKING_URI`` / ``sqlite:///<SPECDEC_HOME>/mlflow.db``)::

    from registry import (register_model_version, register_derived_draft, get_model_version,
                          register_pair, get_pair_version, list_pair_versions, resolve_alias,
                          log_validation, set_validation_tags, latest_validation_run,
                          promote, check_gate, GateConfig, SpeculativeConfig, PairVersion,
                          ModelVersionRef, RegistryError, RegistryUnavailable, PairNotFound,
                          AliasNotFound, ModelNotFound, PromotionRefused)

Submodules: ``settings`` (settings + client factory), ``models`` (target/draft models), ``pairs``
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
    "get_model_version": "registry.service",
    "download_model_version": "registry.service",
    "SpeculativeConfig": "specdec.core.config",
    "PairVersion": "registry.pairs",
    "register_pair": "registry.pairs",
    "get_pair_version": "registry.service",
    "list_pair_versions": "registry.pairs",
    "resolve_alias": "registry.service",
    "log_validation": "registry.runs",
    "set_validation_tags": "registry.runs",
    "latest_validation_run": "registry.service",
    "validation_history": "registry.service",
    "GateConfig": "registry.gate",
    "GateResult": "registry.gate",
    "evaluate_gate": "registry.gate",
    "promote": "registry.promotion",
    "check_gate": "registry.service",
    "demote": "registry.promotion",
    "PromotionResult": "registry.promotion",
    "Registry": "registry.service",
    "get_client": "registry.settings",
    "get_settings": "registry.settings",
}

__all__ = sorted([*_LAZY, "AliasNotFound", "ModelNotFound", "PairNotFound", "PromotionRefused",
                  "RegistryError", "RegistryUnavailable", "WeightsMismatch"])


# mlflow takes seconds to import: load submodules on first use
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
