"""Verify a downloaded checkpoint against the ``weights_sha256`` its model version recorded.

Every number the nightly records depends on the weights; a flipped byte in ``model.safetensors``
(in the artifact store or in the local registry cache) must give a clear error, not an acceptance
rate for the registered version. The hash is :func:`specdec.models.hashes.weights_sha256` (the
same function registration used), computed once per file set and modification time: the memo
(:func:`specdec.validation.continuation_cache.model_weights_hash`, shared across processes through
``<cache_dir>/weights-sha256.json``) is keyed by path, file names, sizes and mtimes, so a file
changed in place is hashed again and an unchanged one is not re-read on every load.
"""

from __future__ import annotations

import logging
from pathlib import Path

from registry.errors import WeightsMismatch

log = logging.getLogger(__name__)
MEMO_FILE = "weights-sha256.json"


def checkpoint_sha256(path: Path, memo_dir: Path) -> str | None:
    """The memoised weights hash of the checkpoint directory ``path`` (None: no safetensors there)."""
    from specdec.validation.continuation_cache import model_weights_hash

    if not any(Path(path).glob("*.safetensors")):
        return None
    return model_weights_hash(None, path, memo_file=Path(memo_dir) / MEMO_FILE)  # type: ignore[arg-type]


def verify_checkpoint(path: Path, ref, memo_dir: Path) -> None:
    """Raise :class:`WeightsMismatch` unless ``path``'s weights hash to ``ref.weights_sha256``.

    Args:
        path: the downloaded artifact directory. ref: the :class:`registry.models.ModelVersionRef`
            (only ``checkpoint`` and ``lora-adapter`` versions with a recorded hash are checked; a derived
            draft's ``weights_sha256`` is a derivation identity, not a file hash).
        memo_dir: where the cross-process hash memo lives (the registry cache directory).
    Raises:
        WeightsMismatch: naming the version, both hashes (shortened) and the directory.
    """
    if ref.artifact not in ("checkpoint", "lora-adapter") or not ref.weights_sha256:
        return
    got = checkpoint_sha256(path, memo_dir)
    if got is None:
        raise WeightsMismatch(f"{ref.uri}: no .safetensors weights in {path}; the version records weights "
                              f"sha256 {ref.weights_sha256[:16]}…")
    if got != ref.weights_sha256:
        raise WeightsMismatch(f"{ref.uri}: weights in {path} hash to {got[:16]}…, but the version records "
                              f"weights_sha256 {ref.weights_sha256[:16]}… (corrupted artifact or cache); not used")
