"""Train an EAGLE-3 head for a target, or re-train (warm-start) an earlier head on a changed target.

:func:`train_eagle3_head` is what ``specdec draft train eagle3`` and the re-alignment flow call:
training data from a prompt set that is not the held-out set (:mod:`specdec.training.eagle3_data`),
one teacher-forced target pass per sequence for the features (:mod:`specdec.training.eagle3_features`),
then the TTT unroll with a KL loss against the target's next-token distribution over the draft
vocabulary (:mod:`specdec.training.eagle3_ttt`). Checkpoints in ``<out>/checkpoint/`` make a killed
run resumable; the result is written in the ``speculators`` format by :mod:`specdec.models.eagle3`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from specdec.training import eagle3_checkpoint as ckpt
from specdec.training.eagle3_data import (RECIPES, TrainingDataError, TrainingSequence, build_prompts,
                                          chat_prompt_ids, data_sha256, fixed_text_sequences, greedy_answers,
                                          load_documents, regenerated_sequences)
from specdec.training.eagle3_features import (SequenceFeatures, check_feature_memory, draft_token_ids,
                                              draft_vocab_mapping, generated_features, target_features,
                                              token_frequencies)
from specdec.training.eagle3_prompts import task_prompts
from specdec.training.eagle3_init import load_parent, new_head
from specdec.training.eagle3_ttt import ttt_unroll

TRAINING_FILE = "training.json"


@dataclass(frozen=True)
class Eagle3TrainConfig:
    """Settings of one training run (all recorded in ``training.json``).

    Attributes:
        recipe: ``"tasks"`` (chat-task prompts answered by the target), ``"fixed"`` (target distributions
            over fixed text) or ``"regenerated"`` (target-written continuations): :mod:`specdec.training.eagle3_data`.
        num_sequences: training sequences (prompts); response_tokens: tokens per response.
        draft_vocab_size: draft vocabulary (most frequent response tokens); ignored with ``init_from``
            (the parent's vocabulary mapping is kept).
        ttt_steps, ttt_step_loss_decay: the TTT unroll (``speculators``' names).
        epochs, batch_size, lr, weight_decay, warmup_steps: AdamW with linear warm-up (at most 10% of the
            steps) and cosine decay.
        max_minutes: wall-time budget of the whole run (data, target passes and training): training
            stops (checkpointed, result written) when it is spent, and its cosine learning-rate decay runs
            on the time axis when that comes before the last epoch; None = no limit.
        checkpoint_every: optimizer steps between checkpoints.
        seed: data order and initialisation.
        precision: ``"auto"`` | ``"bf16"`` | ``"fp32"``: the head's matrix products during training
            (:func:`use_bf16`); the head is written in float32 either way.

    The defaults are the recipe of benchmarks/results/2026-12-01-eagle3-head-v3-cpu.md for the fp32
    SmolLM2-135M target on a 2-core CPU: about 10 minutes of target answers, then training until the
    28-minute budget (the learning rate decays on it); on a faster machine the 10 epochs end first.
    """

    recipe: str = "tasks"
    num_sequences: int = 560
    response_tokens: int = 96
    draft_vocab_size: int = 8192
    ttt_steps: int = 3
    ttt_step_loss_decay: float = 1.0
    epochs: int = 10
    batch_size: int = 8
    lr: float = 2e-3
    weight_decay: float = 0.0
    warmup_steps: int = 10
    max_minutes: float | None = 28.0
    checkpoint_every: int = 25
    seed: int = 0
    precision: str = "auto"

    @classmethod
    def warm_start(cls, **overrides: Any) -> "Eagle3TrainConfig":
        """The settings for re-training from a parent head (``--from``, re-alignment after a target
        fine-tune): :data:`WARM_START_DEFAULTS` (a shorter run than a fresh head's) with ``overrides``."""
        return cls(**{**WARM_START_DEFAULTS, **overrides})

    def check(self) -> "Eagle3TrainConfig":
        """Raise ``ValueError`` (one line) on an impossible setting; returns self."""
        if self.recipe not in RECIPES:
            raise ValueError(f"unknown data recipe {self.recipe!r}; use one of {', '.join(RECIPES)}")
        for name in ("num_sequences", "response_tokens", "draft_vocab_size", "ttt_steps", "epochs",
                     "batch_size", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"precision must be auto, bf16 or fp32, got {self.precision!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        return self

    def run_sha256(self) -> str:
        """Hash of the settings that decide the result (not ``max_minutes``/``checkpoint_every``)."""
        d = {k: v for k, v in asdict(self).items() if k not in ("max_minutes", "checkpoint_every")}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()


#: :meth:`Eagle3TrainConfig.warm_start`: fewer sequences and epochs than a fresh head (the parent already
#: knows the task; a fine-tuned target moved a little), so a re-alignment fits in ~10 minutes on a 2-core CPU.
WARM_START_DEFAULTS: dict[str, Any] = {"num_sequences": 192, "epochs": 6, "lr": 1e-3, "warmup_steps": 5,
                                       "max_minutes": 9.5}


@dataclass
class TrainedHead:
    """The outcome of :func:`train_eagle3_head`.

    Attributes:
        head: the trained head module (eval mode, CPU or the training device).
        out_dir: where it was written (``speculators`` format plus ``training.json``).
        lineage: ``target_weights_sha256``, ``target_source``, ``training_data_sha256``, ``parent`` (the
            ``init_from`` reference or None), ``parent_weights_sha256``.
        metrics: ``steps``, ``train_minutes``, ``feature_minutes``, ``data_minutes``, ``final_loss``,
            ``step_agreement`` (per TTT step, last epoch), ``stopped_early``.
    """

    head: Any
    out_dir: Path
    lineage: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)


def build_training_sequences(target: Any, config: Eagle3TrainConfig, corpus: str | Path | None = None,
                             progress: bool = False) -> list:
    """The training sequences of ``config.recipe`` from ``corpus`` (default: the shipped C4 sample).

    Raises:
        TrainingDataError: the corpus is missing or gives fewer than ``batch_size`` usable sequences.
    """
    docs = load_documents(corpus)
    prompts = build_prompts(docs, target.tokenizer, config.num_sequences, seed=config.seed)
    if config.recipe == "fixed":
        seqs = fixed_text_sequences(prompts, config.response_tokens)
    else:
        bar = _bar(len(prompts), "regenerating responses", progress)
        seqs = regenerated_sequences(target, prompts, config.response_tokens,
                                     progress=lambda n, total: bar.update(n - bar.n))
        bar.close()
    if len(seqs) < config.batch_size:
        raise TrainingDataError(f"only {len(seqs)} usable training sequences (need at least batch size "
                                f"{config.batch_size}): use a larger corpus")
    return seqs


def build_task_features(target: Any, config: Eagle3TrainConfig, layer_ids: list[int],
                        corpus: str | Path | None = None, progress: bool = False) -> list[SequenceFeatures]:
    """Recipe ``tasks``: ``config.num_sequences`` chat-task prompts from ``corpus``
    (:func:`specdec.training.eagle3_prompts.task_prompts`), answered greedily by the target with at most
    ``config.response_tokens`` tokens; features from the answering passes
    (:func:`specdec.training.eagle3_features.generated_features`). The loss mask covers the user turn
    and the answer (everything after the chat template's fixed opening, which is the same in every
    prompt): the prompt positions add the target's distributions over document text at no extra target
    cost (held-out alpha_tf 0.176 vs 0.167 at equal training time in the benchmark's probe, within noise).

    Raises:
        TrainingDataError: the corpus is missing or gives fewer than ``batch_size`` usable sequences.
    """
    docs = load_documents(corpus)
    tok = target.tokenizer
    turns = task_prompts(docs, config.num_sequences, lambda ts, m: greedy_answers(target, ts, m), seed=config.seed)
    bar = _bar(len(turns), "target answers + features", progress)
    prompts = [chat_prompt_ids(tok, t) for _, t in turns]
    feats = generated_features(target, prompts, config.response_tokens, layer_ids,
                               progress=lambda n, total: bar.update(n - bar.n))
    bar.close()
    start = len(os.path.commonprefix(prompts))  # the chat template's fixed head (system prompt, user tag)
    for f in feats:  # train on the user turn too: the target's distributions over it cost nothing more
        f.loss_mask = torch.arange(len(f.input_ids)) >= start
    if len(feats) < config.batch_size:
        raise TrainingDataError(f"only {len(feats)} usable training sequences (need at least batch size "
                                f"{config.batch_size}): use a larger corpus")
    return feats


def _bar(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, leave=False, dynamic_ncols=True)


def _fingerprint(target: Any) -> str:
    """The target's weights hash: ``weights_sha256`` of its checkpoint dir (with a LoRA adapter merged, combined
    with the adapter's), else of its parameters in memory."""
    from specdec.models.errors import ModelNotFoundError
    from specdec.models.hashes import adapted_weights_sha256, weights_sha256

    try:
        adapter = getattr(target, "adapter", None)
        return adapted_weights_sha256(weights_sha256(target.path), adapter.weights_hash if adapter else None)
    except (ModelNotFoundError, TypeError, AttributeError):
        h = hashlib.sha256()
        for k, v in sorted(target.model.state_dict().items()):
            h.update(k.encode() + b"\0" + v.detach().cpu().float().numpy().tobytes())
        return h.hexdigest()


def _run_key(config: Eagle3TrainConfig, target_sha: str, parent: dict | None) -> str:
    parent_sha = (parent or {}).get("weights_sha256", "none")
    return hashlib.sha256(f"{config.run_sha256()}|{target_sha}|{parent_sha}".encode()).hexdigest()


def _prepare_data(target: Any, config: Eagle3TrainConfig, corpus, layer_ids: list[int], vocab: tuple | None,
                  progress: bool, *, out: Path, run_key: str) -> dict:
    """Sequences -> draft vocabulary (unless ``vocab`` = the parent's ``(d2t, t2d)``) -> target features.

    The sequences and the features computed so far are checkpointed (about once a minute), so a killed
    run resumes the target passes where it stopped."""
    part = ckpt.load_partial(out, run_key)
    if part is None:
        t0 = time.perf_counter()
        if config.recipe == "tasks":  # features come from the answering passes
            feats = build_task_features(target, config, layer_ids, corpus, progress)
            seqs = [TrainingSequence(f.input_ids, f.loss_mask) for f in feats]
        else:
            feats, seqs = [], build_training_sequences(target, config, corpus, progress)
        if vocab is None:
            freq = token_frequencies(seqs, target.model.config.vocab_size)
            vocab = draft_vocab_mapping(freq, min(config.draft_vocab_size, len(freq)))
        part = {"seqs": seqs, "d2t": vocab[0], "t2d": vocab[1], "features": feats, "feature_minutes": 0.0,
                "data_minutes": (time.perf_counter() - t0) / 60}
        ckpt.save_partial(out, run_key, part)
    seqs, feats = part["seqs"], part["features"]
    check_feature_memory(sum(len(s.input_ids) for s in seqs), target.model.config.hidden_size, len(layer_ids))
    bar = _bar(len(seqs), "target features", progress)
    bar.update(len(feats))
    t1 = saved = time.perf_counter()
    for s in seqs[len(feats):]:
        feats.append(target_features(target.model, s, layer_ids))
        bar.update(1)
        if time.perf_counter() - saved > 60:
            ckpt.save_partial(out, run_key, {**part, "feature_minutes": part["feature_minutes"]
                                             + (time.perf_counter() - t1) / 60})
            saved = time.perf_counter()
    bar.close()
    return {"features": feats, "d2t": part["d2t"], "t2d": part["t2d"], "data_sha256": data_sha256(seqs),
            "num_tokens": sum(len(s.input_ids) for s in seqs),
            "num_response_tokens": int(sum(int(s.loss_mask.sum()) for s in seqs)),
            "data_minutes": part["data_minutes"],
            "feature_minutes": part["feature_minutes"] + (time.perf_counter() - t1) / 60}


def collate(feats: list[SequenceFeatures], device: str | torch.device) -> dict[str, torch.Tensor]:
    """Right-pad a batch: ``input_ids [B, T]``, ``aux [B, T, A]``, ``last [B, T, H]`` (float32), ``loss_mask``."""
    t = max(len(f.input_ids) for f in feats)
    b = len(feats)
    ids = torch.zeros(b, t, dtype=torch.long)
    mask = torch.zeros(b, t, dtype=torch.bool)
    aux = torch.zeros(b, t, feats[0].aux.shape[-1])
    last = torch.zeros(b, t, feats[0].last.shape[-1])
    for i, f in enumerate(feats):
        n = len(f.input_ids)
        ids[i, :n], mask[i, :n], aux[i, :n], last[i, :n] = f.input_ids, f.loss_mask, f.aux.float(), f.last.float()
    return {k: v.to(device) for k, v in {"input_ids": ids, "loss_mask": mask, "aux": aux, "last": last}.items()}


def batch_order(n: int, batch_size: int, epoch: int, seed: int, lengths: list[int] | None = None) -> list[list[int]]:
    """The batches of one epoch: a permutation seeded by ``(seed, epoch)``, cut into ``batch_size`` pieces
    (the last, shorter piece dropped). The same on a resumed run.

    With ``lengths`` (tokens per sequence) the permutation is sorted by length inside windows of
    ``16 * batch_size`` before cutting, and the batches are then shuffled: batches of similar lengths
    (little right-padding, which costs as much as real tokens) in a random order.
    """
    g = torch.Generator().manual_seed(seed * 1000003 + epoch)
    perm = torch.randperm(n, generator=g).tolist()
    if lengths is not None:
        w = 16 * batch_size
        perm = [j for i in range(0, n, w) for j in sorted(perm[i:i + w], key=lambda k: lengths[k])]
    batches = [perm[i:i + batch_size] for i in range(0, n - batch_size + 1, batch_size)]
    if lengths is not None:
        batches = [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()]
    return batches


def _scheduler(optimizer, warmup: int, total: int, time_frac: list[float] | None = None):
    """Linear warm-up over ``warmup`` steps, then cosine decay to 0 at step ``total`` or, with ``time_frac``
    (a one-element list the loop updates: the fraction of the time budget spent), when the budget ends,
    whichever comes first: a run cut by ``max_minutes`` still ends with a decayed learning rate."""
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        p = (step - warmup) / max(1, total - warmup)
        if time_frac is not None:
            p = max(p, time_frac[0])
        return 0.5 * (1 + math.cos(math.pi * min(1.0, p)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, f)


def train_step(head, batch: dict, w_draft: torch.Tensor, config: Eagle3TrainConfig, optimizer=None):
    """One forward (and, with ``optimizer``, backward + update) on a collated batch; returns the TTTResult.

    ``w_draft``: the target's LM-head rows of the draft vocabulary, ``[draft_vocab, hidden]``. With
    :func:`use_bf16` the head's matrix products run in bfloat16 (``torch.autocast``; weights, optimizer
    state and the loss's softmaxes stay float32).
    """
    with torch.no_grad():
        target_logits = batch["last"] @ w_draft.T
    dev = batch["aux"].device
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_bf16(config.precision, dev)):
        res = ttt_unroll(head, batch["input_ids"], batch["aux"], target_logits, batch["loss_mask"],
                         steps=config.ttt_steps, decay=config.ttt_step_loss_decay)
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
        res.loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in head.parameters() if p.requires_grad], 1.0)
        optimizer.step()
    return res


def use_bf16(precision: str, device: torch.device) -> bool:
    """Whether training autocasts to bfloat16: ``precision`` ``"bf16"`` always, ``"fp32"`` never, ``"auto"``
    on CUDA and on CPUs with native bfloat16 matrix products (AVX512-BF16 or AMX, where they run about
    4x faster than float32; elsewhere bfloat16 is emulated and slower)."""
    if precision != "auto":
        return precision == "bf16"
    if device.type == "cuda":
        return True
    return device.type == "cpu" and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()) and (
        bool(getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)())
        or bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()))


def _device(device: str | None) -> str:
    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda requested but CUDA is not available")
    return str(device)


def _trainable(head) -> list[torch.nn.Parameter]:
    """Freeze the embeddings and the LM head (copies of the target's, as ``speculators`` does); train the rest."""
    for name, p in head.named_parameters():
        p.requires_grad_(not (name.startswith("embed_tokens") or name.startswith("lm_head")))
    return [p for p in head.parameters() if p.requires_grad]


def train_eagle3_head(target: Any, *, out_dir: str | Path, config: Eagle3TrainConfig = Eagle3TrainConfig(),
                      init_from: str | Path | None = None, corpus: str | Path | None = None,
                      layer_ids: list[int] | None = None, device: str | None = None,
                      progress: bool = True) -> TrainedHead:
    """Train an EAGLE-3 head for ``target`` and write it to ``out_dir`` in the ``speculators`` format.

    Args:
        target: a ``LoadedModel`` (fp32 recommended on CPU); the head learns its distributions.
        out_dir: output directory: the head (``config.json``, ``model.safetensors``), ``training.json``
            (settings, lineage, metrics) and, while running, ``checkpoint/`` (resumed when present).
        config: :class:`Eagle3TrainConfig`.
        init_from: an earlier head's directory: warm start from its weights, keeping its draft
            vocabulary and aux layer ids (re-alignment after a target fine-tune).
        corpus: training documents (JSONL with ``text``); default the shipped C4 sample.
        layer_ids: aux hidden state layer ids (default vLLM's ``[2, L // 2, L - 3]``; the parent's with
            ``init_from``).
        device: ``auto`` | ``cpu`` | ``cuda[:N]``; the target must already be on it.
        progress: show progress bars (stderr).
    Returns:
        :class:`TrainedHead`.
    Raises:
        ValueError: bad settings; TrainingDataError: corpus missing/too small; TrainingMemoryError:
        the features do not fit in memory; CheckpointMismatchError: ``out_dir/checkpoint`` is another run's.
    """
    config.check()
    dev = _device(device)
    out = Path(out_dir)
    parent = load_parent(init_from, target) if init_from is not None else None
    target_sha = _fingerprint(target)
    run_key = _run_key(config, target_sha, parent)
    layer_ids = list(parent["layer_ids"] if parent else layer_ids or _default_layer_ids(target))
    data = ckpt.load_data(out, run_key)
    if data is None:
        vocab = (parent["d2t"], parent["t2d"]) if parent else None
        data = _prepare_data(target, config, corpus, layer_ids, vocab, progress, out=out, run_key=run_key)
        ckpt.save_data(out, run_key, data)
    head = parent["head"] if parent else new_head(target, layer_ids, data["d2t"], data["t2d"], seed=config.seed,
                                                  ttt_steps=config.ttt_steps)
    head = head.to(dev).float().train()
    w_draft = _target_lm_head(target)[draft_token_ids(data["d2t"].cpu())].to(dev, torch.float32)
    spent = data["data_minutes"] + data["feature_minutes"]  # max_minutes covers data, features and training
    metrics = _fit(head, data["features"], w_draft, config, out, run_key, dev=dev, progress=progress, spent_minutes=spent)
    lineage = {"target_weights_sha256": target_sha, "target_source": getattr(target, "source", {}) or {},
               "training_data_sha256": data["data_sha256"], "parent": str(init_from) if init_from else None,
               "parent_weights_sha256": parent["weights_sha256"] if parent else None,
               "aux_hidden_state_layer_ids": layer_ids}
    metrics.update({k: data[k] for k in ("data_minutes", "feature_minutes", "num_tokens", "num_response_tokens")})
    head.eval()
    _write_result(head, out, target, config, lineage, metrics)
    if not metrics["stopped_early"]:  # else the checkpoint stays: the same command continues the run
        ckpt.clear(out)
    return TrainedHead(head=head, out_dir=out, lineage=lineage, metrics=metrics)


def _target_lm_head(target: Any) -> torch.Tensor:
    return target.model.get_output_embeddings().weight.detach()


def _default_layer_ids(target: Any) -> list[int]:
    from specdec.models.eagle3 import default_layer_ids

    return default_layer_ids(target.model.config.num_hidden_layers)


def _fit(head, feats: list[SequenceFeatures], w_draft: torch.Tensor, config: Eagle3TrainConfig, out: Path,
         run_key: str, *, dev: str, progress: bool, spent_minutes: float = 0.0) -> dict[str, Any]:
    """The optimisation loop (resumes from ``out/checkpoint``); returns the training metrics.

    ``spent_minutes``: wall time already spent on data and features; training gets the rest of
    ``config.max_minutes`` (and the learning rate decays on that time axis when it binds)."""
    opt = torch.optim.AdamW(_trainable(head), lr=config.lr, weight_decay=config.weight_decay)
    lengths = [len(f.input_ids) for f in feats]
    per_epoch = len(batch_order(len(feats), config.batch_size, 0, config.seed, lengths))
    total = per_epoch * config.epochs
    budget = None if config.max_minutes is None else config.max_minutes - spent_minutes
    frac = [0.0]
    sched = _scheduler(opt, min(config.warmup_steps, max(1, total // 10)), total,  # short runs: 10% warm-up
                       frac if budget is not None else None)
    step, extra = ckpt.restore_state(out, run_key, head, opt, sched)
    minutes = float(extra.get("train_minutes", 0.0))
    sums = extra.get("sums") or _zero_sums(config.ttt_steps)
    bar = _bar(total, "training head", progress)
    bar.update(step)
    t0, stopped = time.perf_counter(), False
    while step < total:
        epoch, i = divmod(step, per_epoch)
        if i == 0:
            sums = _zero_sums(config.ttt_steps)
        idx = batch_order(len(feats), config.batch_size, epoch, config.seed, lengths)[i]
        res = train_step(head, collate([feats[j] for j in idx], dev), w_draft, config, opt)
        elapsed = minutes + (time.perf_counter() - t0) / 60
        frac[0] = elapsed / budget if budget and budget > 0 else 1.0
        sched.step()
        step += 1
        _accumulate(sums, res)
        bar.update(1)
        bar.set_postfix(loss=f"{float(res.loss.detach()):.3f}", acc0=f"{_rate(sums, 0):.2f}", refresh=False)
        stopped = budget is not None and elapsed >= budget and step < total
        if step % config.checkpoint_every == 0 or step == total or stopped:
            ckpt.save_state(out, run_key, step, head, opt, sched, extra={"train_minutes": elapsed, "sums": sums})
        if stopped:
            break
    bar.close()
    return {"steps": step, "total_steps": total, "stopped_early": stopped,
            "train_minutes": minutes + (time.perf_counter() - t0) / 60,
            "final_loss": sums["loss"] / max(1, sums["batches"]),
            "step_agreement": [_rate(sums, s) for s in range(config.ttt_steps)]}


def _zero_sums(steps: int) -> dict:
    return {"loss": 0.0, "batches": 0, "correct": [0] * steps, "total": [0] * steps}


def _accumulate(sums: dict, res) -> None:
    sums["loss"] += float(res.loss.detach())
    sums["batches"] += 1
    for s, (c, t) in enumerate(zip(res.step_correct, res.step_total)):
        sums["correct"][s] += c
        sums["total"][s] += t


def _rate(sums: dict, s: int) -> float:
    return sums["correct"][s] / sums["total"][s] if sums["total"][s] else float("nan")


def _write_result(head, out: Path, target: Any, config: Eagle3TrainConfig, lineage: dict, metrics: dict) -> None:
    """The head in the ``speculators`` format (verifier: the target's Hub id, else its local checkpoint
    directory, so speculators' own loader finds its config), the target's tokenizer files and ``training.json``."""
    from specdec.models.eagle3 import save_eagle3

    out.mkdir(parents=True, exist_ok=True)
    src = getattr(target, "source", {}) or {}
    verifier = src.get("ref") if src.get("kind") == "hub" else str(getattr(target, "path", "") or "") or None
    save_eagle3(head, out, verifier=verifier,
                verifier_architectures=list(getattr(target.model.config, "architectures", None) or []))
    target.tokenizer.save_pretrained(out)
    doc = {"config": asdict(config), "lineage": lineage, "metrics": metrics,
           "draft_vocab_size": int(head.config.draft_vocab_size)}
    (out / TRAINING_FILE).write_text(json.dumps(doc, indent=2, default=str))


def read_training_metadata(path: str | Path) -> dict:
    """``training.json`` of a head directory written by :func:`train_eagle3_head`, or ``{}`` if absent
    (e.g. a head trained elsewhere, with ``speculators`` or SpecForge)."""
    p = Path(path) / TRAINING_FILE
    return json.loads(p.read_text()) if p.is_file() else {}
