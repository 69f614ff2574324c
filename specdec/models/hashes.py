"""Content hashes of checkpoints and tokenizers (lineage: equal bytes, equal hashes)."""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import Any

from specdec.models.errors import ModelNotFoundError

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)
# Keys transformers writes into tokenizer_config.json that depend on where it was loaded from.
_VOLATILE_TOKENIZER_KEYS = {"name_or_path", "is_local", "local_files_only", "_commit_hash",
                            "tokenizer_file", "cache_dir"}


def _sha256_file(path: Path, h: "hashlib._Hash | None" = None) -> "hashlib._Hash":
    h = h or hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of one file's bytes (streamed; any size)."""
    return _sha256_file(Path(path)).hexdigest()


def weights_sha256(path: str | Path) -> str:
    """Hex sha256 over a checkpoint's safetensors files.

    Args:
        path: a checkpoint directory (every ``*.safetensors`` directly inside it) or one
            ``.safetensors`` file.
    Returns:
        sha256 over, for each file in sorted name order, ``name + b"\\0" + content``. Equal bytes give
        equal hashes; any changed weight changes it. Re-sharding the same weights changes it too.
    Raises:
        ModelNotFoundError: the path does not exist or holds no safetensors file.
    """
    path = Path(path)
    if path.is_file() and path.suffix == ".safetensors":
        files = [path]
    elif path.is_dir():
        files = sorted(path.glob("*.safetensors"), key=lambda p: p.name)
    else:
        files = []
    if not files:
        raise ModelNotFoundError(f"no .safetensors weights at {path}")
    return files_sha256(files)


def files_sha256(files: list[Path]) -> str:
    """Hex sha256 over ``name + b"\\0" + content`` of each file, in the given order (streamed)."""
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0")
        _sha256_file(f, h)
    return h.hexdigest()


def adapted_weights_sha256(base_sha256: str, adapter_sha256: str | None) -> str:
    """The weights identity of a base with a LoRA adapter merged: hex sha256 of
    ``b"lora\\0" + base + b"\\0" + adapter`` (both hex weights hashes); ``base_sha256`` itself without an adapter.
    Keys what depends on the adapted weights (continuation caches, lineage) apart from the base's."""
    if not adapter_sha256:
        return base_sha256
    return hashlib.sha256(b"lora\0" + base_sha256.encode() + b"\0" + adapter_sha256.encode()).hexdigest()


def _canonical_tokenizer_bytes(path: Path) -> bytes:
    if path.suffix != ".json":
        return path.read_bytes()
    data = json.loads(path.read_text(encoding="utf-8"))
    if path.name == "tokenizer_config.json" and isinstance(data, dict):
        data = {k: v for k, v in data.items() if k not in _VOLATILE_TOKENIZER_KEYS}
    return json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()


def tokenizer_sha256(path_or_tokenizer: Any) -> str:
    """Hex sha256 identifying a tokenizer, from its files.

    Args:
        path_or_tokenizer: a directory with tokenizer files, or a ``transformers`` tokenizer (saved
            to a temporary directory first).
    Returns:
        sha256 over, for each present file of :data:`TOKENIZER_FILES` in that order,
        ``name + b"\\0" + content``. JSON files are canonicalised (sorted keys, compact) and the
        location-dependent keys of ``tokenizer_config.json`` (``name_or_path``, ``is_local``, ...)
        are dropped, so a tokenizer hashes the same after a load/save round trip. Deterministic.
    Raises:
        ModelNotFoundError: the directory holds none of the tokenizer files.
    """
    if not isinstance(path_or_tokenizer, (str, Path)):
        with tempfile.TemporaryDirectory(prefix="specdec-tok-") as tmp:
            path_or_tokenizer.save_pretrained(tmp)
            return tokenizer_sha256(tmp)
    path = Path(path_or_tokenizer)
    files = [path / n for n in TOKENIZER_FILES if (path / n).is_file()]
    if not files:
        raise ModelNotFoundError(f"no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}) in {path}")
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0")
        h.update(_canonical_tokenizer_bytes(f))
    return h.hexdigest()
