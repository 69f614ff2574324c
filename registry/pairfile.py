"""A pair version's ``pair.json``: where every registration fact lives (the MLflow version shows a
selection of them as tags, :mod:`registry.describe`)."""

from __future__ import annotations

import json
import logging
import tempfile
from typing import Any, Mapping

from registry.models import download_version_artifacts

PAIR_FILE = "pair.json"
_log = logging.getLogger(__name__)


def read_pair_doc(client, mv) -> dict[str, Any]:
    """The ``pair.json`` dict of an MLflow model version ``mv`` of a pair (downloaded, small).

    Raises:
        RegistryUnavailable: server unreachable; MlflowException: missing version/artifact.
    """
    with tempfile.TemporaryDirectory() as tmp:
        return json.loads(download_version_artifacts(client, mv.name, str(mv.version), tmp, PAIR_FILE).read_text())


#: registration tags a user may change on a pair version afterwards (which engine serves it); every other tag that
#: ``pair.json`` records is the registration's identity (weights, config, drafter recipe) and an edit in MLflow does
#: not change it: the night validates, and the serving config serves, what was registered
MUTABLE_REGISTRATION_TAGS = frozenset({"engine"})
#: (tag, edited value) pairs already warned about in this process
_WARNED: set[tuple[str, str]] = set()


def overlay_tags(registered: Mapping[str, Any] | None, current: Mapping[str, str] | None) -> dict[str, str]:
    """A pair version's tags: its current MLflow tags (``current``: a floor or an engine endpoint set later) over
    its registration tags (``registered``: ``pair.json``'s ``"tags"``), the identity tags kept as registered
    (all but :data:`MUTABLE_REGISTRATION_TAGS`). An edited identity tag is logged once as a warning."""
    reg, cur = {k: str(v) for k, v in (registered or {}).items()}, dict(current or {})
    kept = {k: v for k, v in reg.items() if k not in MUTABLE_REGISTRATION_TAGS}
    for k in sorted(k for k, v in kept.items() if k in cur and cur[k] != v and (k, cur[k]) not in _WARNED):
        _WARNED.add((k, cur[k]))
        _log.warning("tag %s was edited in MLflow (%.80r); the registered value %.80r holds (register a new pair "
                     "version to change it)", k, cur[k], kept[k])
    return {**reg, **cur, **kept}


def full_tags(client, mv, doc: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Every tag of a pair version: :func:`overlay_tags` of ``pair.json``'s ``"tags"`` and its current MLflow
    tags. Versions registered before the tag selection carry everything as tags and have no ``"tags"`` in
    ``pair.json``: their current tags are returned as they are.

    Args:
        doc: the ``pair.json`` dict when already read (else downloaded).
    """
    doc = read_pair_doc(client, mv) if doc is None else doc
    return overlay_tags(doc.get("tags"), mv.tags)
