"""Target continuation cache: the target's tokens for a prompt, reused when only the draft changed.

A replay (:mod:`specdec.validation.replay`) needs the target's continuation of every prompt. It
depends only on the target and the decoding settings, not on the drafter, so it is stored under
``$SPECDEC_HOME/continuations/`` keyed by everything it depends on (:class:`ContinuationKey`):
target weights hash, held-out version, prompt id, the prompt's token ids (covers the chat
template and tokenizer), the chat template itself, max_new_tokens, sampling (temperature, top-k,
top-p and, when sampling, the seed), stop ids, dtype and device, and for a continuation the serving
engine produced (:mod:`specdec.validation.engine_continuations`) the engine's fingerprint (``engine``;
empty for the core's own, so entries written before it keep their names). A changed part gives a
different file name, and a read checks the stored key field by field, so an entry is never
reused for a different key. Entries are one small JSON file each, written atomically, with a
sha256 over key and tokens: a read also checks that checksum, that the tokens are integers in
``[0, vocab_size)`` and at most ``max_new_tokens`` of them; an entry failing any check (a changed
token id, garbage, an entry written before checksums) is logged, counted in ``rejected`` and
treated as missing, so the caller recomputes and overwrites it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = ["ContinuationKey", "ContinuationCache", "model_weights_hash", "chat_template_hash"]
log = logging.getLogger(__name__)


def _checksum(key: dict, tokens: list) -> str:
    return hashlib.sha256(json.dumps({"key": key, "tokens": tokens}, sort_keys=True).encode()).hexdigest()


def _entry_problem(entry: Any, key: "ContinuationKey", vocab_size: int | None) -> str | None:
    """Why a stored entry cannot be used for ``key`` (None: it can)."""
    if not isinstance(entry, dict) or entry.get("key") != key.to_dict():
        return "different or unreadable key"
    tokens = entry.get("tokens")
    if not isinstance(tokens, list) or any(type(t) is not int for t in tokens):
        return "tokens are not a list of integers"
    if entry.get("sha256") != _checksum(entry["key"], tokens):
        return "checksum mismatch (changed after it was written)"
    if len(tokens) > key.max_new_tokens:
        return f"{len(tokens)} tokens > max_new_tokens {key.max_new_tokens}"
    bad = next((t for t in tokens if t < 0 or (vocab_size is not None and t >= vocab_size)), None)
    if bad is not None:
        return f"token id {bad} outside the vocabulary [0, {vocab_size})"
    return None


@dataclass(frozen=True)
class ContinuationKey:
    """Everything a target continuation depends on (all plain strings / ints / lists)."""

    target_weights: str
    heldout_version: str
    prompt_id: str
    prompt_tokens: str  # sha256 of the prompt's token ids
    chat_template: str  # sha256 of the tokenizer's chat template ("" when none)
    max_new_tokens: int
    sampling: str  # "greedy" or "t=<temperature>,top_k=<k>,top_p=<p>,seed=<seed>"
    stop_token_ids: tuple[int, ...]
    dtype: str
    device: str
    engine: str = ""  # sha256 of the serving engine's fingerprint ("" : the core produced it)

    def digest(self) -> str:
        """sha256 hex of the canonical JSON of every field (the entry's file name; ``engine`` only when set)."""
        return hashlib.sha256(json.dumps(self._fields(), sort_keys=True).encode()).hexdigest()

    def _fields(self) -> dict[str, Any]:
        d = asdict(self)
        if not self.engine:  # a core continuation: the key (and file name) it had before engines produced any
            del d["engine"]
        return d

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``stop_token_ids`` as a list; ``engine`` only when set)."""
        d = self._fields()
        d["stop_token_ids"] = list(self.stop_token_ids)
        return d

    @classmethod
    def build(cls, *, target_weights: str, heldout_version: str, prompt_id: str, prompt_ids: list[int],
              chat_template: str, max_new_tokens: int, sampling: Any, seed: int, stop_token_ids: frozenset[int],
              dtype: Any, device: Any, engine: str = "") -> "ContinuationKey":
        """Key from the run's objects (``sampling``: a :class:`~specdec.core.config.SamplingConfig`;
        the seed only counts when sampling, since a greedy continuation does not depend on it; ``engine``:
        the producing engine's fingerprint digest, "" for the core)."""
        if sampling.is_greedy:
            s = "greedy"
        else:
            s = f"t={sampling.temperature!r},top_k={sampling.top_k!r},top_p={sampling.top_p!r},seed={seed}"
        return cls(target_weights=target_weights, heldout_version=heldout_version, prompt_id=prompt_id,
                   prompt_tokens=hashlib.sha256(json.dumps(list(prompt_ids)).encode()).hexdigest(),
                   chat_template=chat_template, max_new_tokens=int(max_new_tokens), sampling=s,
                   stop_token_ids=tuple(sorted(int(x) for x in stop_token_ids)),
                   dtype=str(dtype).removeprefix("torch."), device=str(device), engine=engine)


class ContinuationCache:
    """Continuations stored as ``<root>/<digest[:2]>/<digest>.json`` (a home's: :meth:`in_home`).

    Args:
        root: the cache directory (created on first write).
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.hits = 0
        self.misses = 0
        self.rejected = 0  # entries present but failing their check (recomputed by the caller)

    @classmethod
    def in_home(cls, home: str | Path) -> "ContinuationCache":
        """The cache of a ``SPECDEC_HOME`` (``<home>/continuations``; the entry point hands its home down)."""
        return cls(Path(home) / "continuations")

    @property
    def weights_memo(self) -> Path:
        """The cross-process memo of checkpoint weight hashes (:func:`model_weights_hash`)."""
        return self.root / "weights-sha256.json"

    def _path(self, key: ContinuationKey) -> Path:
        d = key.digest()
        return self.root / d[:2] / f"{d}.json"

    def get(self, key: ContinuationKey, vocab_size: int | None = None) -> list[int] | None:
        """The stored continuation for ``key``, or None: missing, or failing its check (module
        docstring; logged as a warning and counted in ``rejected``). Never raises on a bad file.

        Args:
            vocab_size: the target's vocabulary size, to range-check the token ids.
        """
        p = self._path(key)
        try:
            entry = json.loads(p.read_bytes().decode("utf-8"))
        except FileNotFoundError:
            self.misses += 1
            return None
        except (OSError, ValueError) as e:  # unreadable, not UTF-8, not JSON
            entry, problem = None, f"unreadable ({type(e).__name__})"
        else:
            problem = _entry_problem(entry, key, vocab_size)
        if problem is not None:
            self.misses += 1
            self.rejected += 1
            log.warning("continuation cache entry %s failed its check (%s): recomputed", p.name, problem)
            return None
        self.hits += 1
        return list(entry["tokens"])

    def put(self, key: ContinuationKey, tokens: list[int], produced_by: str) -> Path:
        """Store ``tokens`` for ``key`` (atomic replace). ``produced_by``: ``"speculative"``, ``"ngram"`` or
        ``"target-only"`` (how the core produced it), or ``"engine"``. Returns the file path."""
        p = self._path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(f".{os.getpid()}.tmp")
        toks = [int(t) for t in tokens]
        tmp.write_text(json.dumps({"key": key.to_dict(), "tokens": toks, "produced_by": produced_by,
                                   "sha256": _checksum(key.to_dict(), toks)}))
        tmp.replace(p)
        return p


_WEIGHTS_MEMO: dict[str, str] = {}


def model_weights_hash(model: torch.nn.Module, path: str | Path | None = None, memo_file: str | Path | None = None) -> str:
    """A content hash of the target's weights.

    With ``path`` (a checkpoint directory holding ``*.safetensors``): the checkpoint's
    :func:`specdec.models.hashes.weights_sha256`, memoised by resolved path, file names, sizes and
    mtime (ns) in this process and, with ``memo_file``, across processes (a JSON file: a re-run night
    does not re-read the weights). Otherwise (a model built in memory): sha256 over every parameter
    and buffer's name, dtype, shape and bytes.
    """
    if path is not None:
        p = Path(path)
        files = sorted(p.glob("*.safetensors")) if p.is_dir() else []
        if files:
            stamp = json.dumps([str(p.resolve())] + [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files])
            if stamp not in _WEIGHTS_MEMO and memo_file is not None:
                try:
                    _WEIGHTS_MEMO.update(json.loads(Path(memo_file).read_text()))
                except (OSError, json.JSONDecodeError):
                    pass
            if stamp not in _WEIGHTS_MEMO:
                from specdec.models.hashes import weights_sha256

                _WEIGHTS_MEMO[stamp] = weights_sha256(p)
                if memo_file is not None:
                    Path(memo_file).parent.mkdir(parents=True, exist_ok=True)
                    tmp = Path(memo_file).with_suffix(f".{os.getpid()}.tmp")
                    tmp.write_text(json.dumps(_WEIGHTS_MEMO))
                    tmp.replace(memo_file)
            return _WEIGHTS_MEMO[stamp]
    h = hashlib.sha256()
    for name, t in list(model.state_dict().items()):
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def chat_template_hash(tokenizer: Any) -> str:
    """sha256 hex of the tokenizer's chat template string ("" when it has none)."""
    tpl = getattr(tokenizer, "chat_template", None)
    if not tpl:
        return ""
    return hashlib.sha256((tpl if isinstance(tpl, str) else json.dumps(tpl, sort_keys=True)).encode()).hexdigest()
