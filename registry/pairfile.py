"""A pair version's ``pair.json``: where every registration fact lives (the MLflow version shows a
selection of them as tags, :mod:`registry.describe`)."""

from __future__ import annotations

import json
import tempfile
from typing import Any, Mapping

from registry.models import download_version_artifacts

PAIR_FILE = "pair.json"


def read_pair_doc(client, mv) -> dict[str, Any]:
    """The ``pair.json`` dict of an MLflow model version ``mv`` of a pair (downloaded, small).

    Raises:
        RegistryUnavailable: server unreachable; MlflowException: missing version/artifact.
    """
    with tempfile.TemporaryDirectory() as tmp:
        return json.loads(download_version_artifacts(client, mv.name, str(mv.version), tmp, PAIR_FILE).read_text())


def full_tags(client, mv, doc: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Every registration tag of a pair version (``pair.json``'s ``"tags"``) overlaid with its current
    MLflow tags. Versions registered before the tag selection carry everything as tags and have no
    ``"tags"`` in ``pair.json``: their current tags are returned as they are.

    Args:
        doc: the ``pair.json`` dict when already read (else downloaded).
    """
    doc = read_pair_doc(client, mv) if doc is None else doc
    return {**{k: str(v) for k, v in (doc.get("tags") or {}).items()}, **dict(mv.tags or {})}
