"""Target-only fine-tune on a plain-text corpus: the event that makes a derived draft go stale.

In the ``make demo`` story a team fine-tunes its *target* (SmolLM2-135M-Instruct) on Tiny
Shakespeare and keeps serving it with the int8 draft that was derived from the *old* target. The
old draft now proposes what the old model would have said, so greedy acceptance falls below the
alert threshold; a draft re-derived from the new target is back near its usual level.

:func:`finetune_target` is that fine-tune: full-parameter causal-LM training with AdamW in fp32 on
CPU (or wherever the base model lives), deterministic for a given seed, saved as an ordinary
Hugging Face checkpoint (safetensors + config + the base's tokenizer files) that
:func:`specdec.load_causal_lm` loads like any other local directory.

Training data: the corpus is tokenized once (no special tokens added); every step draws
``batch_size`` windows of ``seq_len`` tokens at uniformly random start offsets from a
``torch.Generator`` seeded with ``seed``, so the batch sequence depends only on (corpus, tokenizer,
seed). Loss: mean next-token cross-entropy over the window (``labels = input_ids``; Hugging Face
shifts by one). Schedule: linear warm-up over ``warmup_steps`` then constant ``lr``; gradients
clipped to global L2 norm ``grad_clip``. The recipe is written to ``finetune.json`` next to the
weights, with the sha256 of the base weights and of the corpus, for lineage.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from specdec.models.store import ModelStore

#: Tiny Shakespeare, shipped with the package (public domain text; see ATTRIBUTION.md there).
DEFAULT_CORPUS = Path(__file__).resolve().parent / "data" / "tinyshakespeare" / "input.txt"
#: Metadata file written next to the fine-tuned weights.
FINETUNE_FILE = "finetune.json"
#: The demo's fine-tune of SmolLM2-135M-Instruct (``finetune_target(base, out, **DEMO_RECIPE)``): the old
#: draft's acceptance falls well below its baseline while a re-derived draft is back at its level
#: (benchmarks/results/finetune_drift.md, 2026-12-02-stale-floor-cpu.md). 80 steps of 2 windows: twice the
#: updates of the earlier 40 x 4 for a third more time (the optimizer step costs as much as a 4 x 64 forward and
#: backward), so the stale pair's rate sits clearly below the 40% floor (40 x 4 left it at 0.30-0.38 at k = 4 on
#: the demo's short prompts, too close for a CI of 12 prompts; benchmarks/results/2026-12-07-demo-floor-cpu.md).
DEMO_RECIPE: dict[str, Any] = {"steps": 80, "lr": 5e-4, "batch_size": 2, "seq_len": 64, "seed": 0}


@dataclass
class FinetuneResult:
    """What :func:`finetune_target` produced.

    Attributes:
        path: the checkpoint directory (safetensors weights, ``config.json``, tokenizer files,
            ``finetune.json``); load it with ``specdec.load_causal_lm(str(path), store=...)``.
        steps: optimizer steps taken.
        lr: peak learning rate (after warm-up).
        final_loss: training cross-entropy (nats/token) of the last step's batch.
        seconds: wall-clock seconds of the training loop (forward, backward, optimizer), excluding
            model loading, corpus tokenization and saving.
        losses: training loss (nats/token) of every step, ``len(losses) == steps``.
        cpu_seconds: process CPU seconds (all threads) over the same span; on a loaded machine
            this is the more honest cost measure (wall time ≈ ``cpu_seconds / num_threads`` when
            the machine is otherwise idle and the threads scale well).
        batch_size, seq_len, seed, warmup_steps, grad_clip, num_threads: the rest of the recipe.
        base_weights_sha256: :func:`specdec.models.weights_sha256` of the base checkpoint, or
            ``None`` if the base had no safetensors on disk.
        weights_sha256: the same hash of the saved fine-tuned checkpoint.
        corpus_sha256: sha256 of the corpus file's bytes.
        corpus_tokens: number of tokens in the tokenized corpus.
    """

    path: Path
    steps: int
    lr: float
    final_loss: float
    seconds: float
    losses: list[float] = field(default_factory=list)
    cpu_seconds: float = 0.0
    batch_size: int = 0
    seq_len: int = 0
    seed: int = 0
    warmup_steps: int = 0
    grad_clip: float | None = None
    num_threads: int = 0
    base_weights_sha256: str | None = None
    weights_sha256: str | None = None
    corpus_sha256: str = ""
    corpus_tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable dict of all fields (``path`` as a string)."""
        d = asdict(self)
        d["path"] = str(self.path)
        return d


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _load_base(base: Any, store: ModelStore) -> tuple[Any, Any, Path | None, dict]:
    """(private model copy in fp32, tokenizer, base checkpoint dir or None, base source dict); a reference is
    loaded through ``store`` (a :class:`specdec.models.ModelStore`)."""
    import torch

    from specdec.models import LoadedModel, load_causal_lm

    if isinstance(base, LoadedModel):
        model = copy.deepcopy(base.model)  # never train the caller's object
        tokenizer, base_dir, source = base.tokenizer, Path(base.path) if base.path else None, dict(base.source)
    elif isinstance(base, (str, Path)):
        loaded = load_causal_lm(str(base), store=store)
        model, tokenizer, base_dir, source = loaded.model, loaded.tokenizer, Path(loaded.path), dict(loaded.source)
    else:
        raise TypeError(f"base must be a specdec LoadedModel or a model reference (path/str), got {type(base).__name__}")
    return model.to(torch.float32), tokenizer, base_dir, source


def _tokenize_corpus(corpus: Path, tokenizer: Any) -> "torch.Tensor":  # noqa: F821
    import torch

    text = corpus.read_text(encoding="utf-8")
    # Tokenized in chunks of whole lines (deterministic; avoids the tokenizer's warning about one
    # 300k-token "sequence"). Ids can differ from a single call only at the few chunk boundaries.
    ids: list[int] = []
    chunk_lines = 2000
    lines = text.splitlines(keepends=True)
    for i in range(0, len(lines), chunk_lines):
        ids.extend(tokenizer("".join(lines[i:i + chunk_lines]), add_special_tokens=False)["input_ids"])
    return torch.tensor(ids, dtype=torch.long)


def _copy_tokenizer_files(base_dir: Path | None, tokenizer: Any, out: Path) -> None:
    from specdec.models import TOKENIZER_FILES

    copied = False
    if base_dir is not None and base_dir.is_dir():
        for name in TOKENIZER_FILES:
            src = base_dir / name
            if src.is_file():
                shutil.copy2(src, out / name)
                copied = True
    if not copied:  # base held in memory only: let transformers write the tokenizer
        tokenizer.save_pretrained(out)


def finetune_target(
    base: Any,
    out_dir: str | Path,
    *,
    corpus: str | Path = DEFAULT_CORPUS,
    steps: int,
    lr: float,
    batch_size: int,
    seq_len: int,
    seed: int = 0,
    warmup_steps: int | None = None,
    grad_clip: float | None = 1.0,
    num_threads: int = 2,
    overwrite: bool = False,
    on_step: Callable[[int, float], None] | None = None,
    store: ModelStore,
) -> FinetuneResult:
    """Fine-tune a copy of a target causal LM on a text corpus and save it as a new checkpoint.

    Full-parameter training, fp32, AdamW (betas 0.9/0.95, eps 1e-8, no weight decay), linear
    warm-up then constant ``lr``, gradient clipping; random windows of the tokenized corpus drawn
    from a generator seeded with ``seed`` (see module docstring). ``torch.manual_seed(seed)`` is
    set too. With the same inputs, seed and ``num_threads`` on the same machine/library versions
    the saved weights are bit-identical. Tied input/output embeddings (SmolLM2) stay tied: they
    are one parameter during training and ``save_pretrained`` stores them once.

    Args:
        base: a :class:`specdec.models.LoadedModel` (its model is deep-copied, never modified) or
            any reference :func:`specdec.load_causal_lm` accepts (local dir, ``"smollm2"``, ...).
        out_dir: directory to create for the new checkpoint. Written atomically (temporary
            sibling directory, then rename), so an interrupted run leaves no half checkpoint.
        corpus: UTF-8 plain-text file; default: the shipped Tiny Shakespeare (1.1 MB).
        steps: optimizer steps (>= 1).
        lr: peak learning rate (> 0).
        batch_size: windows per step (>= 1).
        seq_len: tokens per window (>= 2); the corpus must hold at least ``seq_len`` tokens.
        seed: seeds the batch sampler and torch's global RNG.
        warmup_steps: linear warm-up length in steps (default ``steps // 10``).
        grad_clip: max global gradient L2 norm, or ``None`` for no clipping.
        num_threads: ``torch.set_num_threads`` during training (restored afterwards).
        overwrite: replace an existing non-empty ``out_dir`` instead of raising.
        on_step: optional callback ``on_step(step_index_1_based, loss)`` after every step
            (progress bars).
        store: the :class:`specdec.models.ModelStore` a reference ``base`` is fetched/converted into (the
            caller's, built at the edge).
    Returns:
        :class:`FinetuneResult` (``path == out_dir``).
    Raises:
        ValueError: a hyper-parameter is out of range, or the corpus is shorter than ``seq_len``
            tokens.
        FileNotFoundError: the corpus file does not exist.
        FileExistsError: ``out_dir`` exists and is not empty and ``overwrite`` is False.
        TypeError: ``base`` is neither a LoadedModel nor a path/str.
        specdec.models.ModelNotFoundError: ``base`` is a reference that cannot be loaded.
        FloatingPointError: the loss became NaN/inf (learning rate too high).
    """
    import torch

    from specdec.models import ModelNotFoundError, weights_sha256

    warmup = _checked_warmup(steps=steps, lr=lr, batch_size=batch_size, seq_len=seq_len, num_threads=num_threads,
                             grad_clip=grad_clip, warmup_steps=warmup_steps)
    corpus, out_dir = Path(corpus), Path(out_dir)
    if not corpus.is_file():
        raise FileNotFoundError(f"corpus not found: {corpus}")
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())) and not overwrite:
        raise FileExistsError(f"{out_dir} already exists and is not empty (pass overwrite=True to replace it)")
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        model, tokenizer, base_dir, base_source = _load_base(base, store)
        try:
            base_sha = weights_sha256(base_dir) if base_dir is not None else None
        except ModelNotFoundError:
            base_sha = None
        tokens = _tokenize_corpus(corpus, tokenizer)
        if tokens.numel() < seq_len:
            raise ValueError(f"corpus {corpus} has {tokens.numel()} tokens, fewer than seq_len={seq_len}")
        losses, seconds, cpu_seconds = _train(model, tokens, steps=steps, lr=lr, warmup=warmup, batch_size=batch_size,
                                              seq_len=seq_len, seed=seed, grad_clip=grad_clip, on_step=on_step)
        result = FinetuneResult(
            path=out_dir, steps=steps, lr=lr, final_loss=losses[-1], seconds=seconds, losses=losses,
            cpu_seconds=cpu_seconds, batch_size=batch_size, seq_len=seq_len, seed=seed,
            warmup_steps=warmup, grad_clip=grad_clip, num_threads=num_threads,
            base_weights_sha256=base_sha, weights_sha256="", corpus_sha256=_file_sha256(corpus),
            corpus_tokens=int(tokens.numel()),
        )
        return _save_atomically(model, tokenizer, base_dir, base_source, corpus, result)
    finally:
        torch.set_num_threads(prev_threads)


def _checked_warmup(*, steps: int, lr: float, batch_size: int, seq_len: int, num_threads: int,
                    grad_clip: float | None, warmup_steps: int | None) -> int:
    """The warm-up length in steps, after checking every hyper-parameter (ValueError naming the bad one)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if not (lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr must be a positive number, got {lr}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if seq_len < 2:
        raise ValueError(f"seq_len must be >= 2, got {seq_len}")
    if num_threads < 1:
        raise ValueError(f"num_threads must be >= 1, got {num_threads}")
    if grad_clip is not None and not grad_clip > 0:
        raise ValueError(f"grad_clip must be positive or None, got {grad_clip}")
    warmup = steps // 10 if warmup_steps is None else int(warmup_steps)
    if warmup < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    return warmup


def _train(model, tokens, *, steps: int, lr: float, warmup: int, batch_size: int, seq_len: int, seed: int,
           grad_clip: float | None, on_step: Callable[[int, float], None] | None) -> tuple[list[float], float, float]:
    """The training loop of :func:`finetune_target` (in place): ``(losses, wall seconds, CPU seconds)``.

    Raises:
        FloatingPointError: the loss became NaN/inf.
    """
    import torch

    device = next(model.parameters()).device
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    offsets = torch.arange(seq_len)
    params = [p for p in model.parameters() if p.requires_grad]
    # fused: one vectorised pass over each tensor per step (CPU and CUDA kernels exist); the
    # default per-tensor loop costs more than the forward/backward of a 135M model on 2 cores.
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0,
                            fused=device.type in ("cpu", "cuda"))
    model.train()
    model.config.use_cache = False
    losses: list[float] = []
    t0, c0 = time.perf_counter(), time.process_time()
    for step in range(steps):
        cur_lr = lr * min(1.0, (step + 1) / warmup) if warmup else lr
        for group in opt.param_groups:
            group["lr"] = cur_lr
        starts = torch.randint(0, tokens.numel() - seq_len + 1, (batch_size,), generator=gen)
        batch = tokens[starts[:, None] + offsets[None, :]].to(device)
        loss = model(input_ids=batch, labels=batch, use_cache=False).loss
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss became {loss.item()} at step {step + 1}; lower lr ({lr})")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(params, grad_clip)
        opt.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step + 1, losses[-1])
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    model.eval()
    model.config.use_cache = True
    return losses, seconds, cpu_seconds


def _save_atomically(model, tokenizer, base_dir: Path | None, base_source: str, corpus: Path,
                     result: FinetuneResult) -> FinetuneResult:
    """Write the checkpoint and ``finetune.json`` to a temporary sibling, then rename it to ``result.path``
    (an interrupted run leaves no half checkpoint). Returns ``result`` with the new weights' hash."""
    from specdec.models import weights_sha256

    out_dir = result.path
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".tmp-{out_dir.name}-{uuid.uuid4().hex[:8]}"
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        _copy_tokenizer_files(base_dir, tokenizer, tmp)
        for f in tmp.iterdir():
            if f.is_file():
                f.chmod(0o644)
        result.weights_sha256 = weights_sha256(tmp)
        meta = {
            "kind": "finetune",
            "objective": "causal-lm cross-entropy on random corpus windows",
            "optimizer": {"name": "AdamW", "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0},
            "schedule": "linear warm-up, then constant",
            "dtype": "float32",
            "base": {"source": base_source, "path": str(base_dir) if base_dir else None,
                     "weights_sha256": result.base_weights_sha256},
            "corpus": {"file": corpus.name, "sha256": result.corpus_sha256, "tokens": result.corpus_tokens},
            "result": {k: v for k, v in result.to_dict().items() if k != "path"},
            "versions": _versions(),
        }
        (tmp / FINETUNE_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        if out_dir.exists():
            shutil.rmtree(out_dir) if out_dir.is_dir() else out_dir.unlink()
        tmp.rename(out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return result


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("torch", "transformers"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:  # pragma: no cover
            pass
    return out


def read_finetune_metadata(path: str | Path) -> dict:
    """The ``finetune.json`` written by :func:`finetune_target` in checkpoint ``path``.

    Raises:
        FileNotFoundError: ``path`` is not a checkpoint made by :func:`finetune_target`.
    """
    f = Path(path) / FINETUNE_FILE
    if not f.is_file():
        raise FileNotFoundError(f"{path} has no {FINETUNE_FILE}: not a specdec fine-tune checkpoint")
    return json.loads(f.read_text())
