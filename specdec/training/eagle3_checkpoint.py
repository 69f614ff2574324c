"""Resumable checkpoints of a head training run, under ``<out>/checkpoint/``.

``partial.pt``: the training sequences, draft vocabulary and the features computed so far (while the
target passes run); ``data.pt``: all features, the draft vocabulary and data hash (after the target
passes); ``state.pt``: optimizer step, trainable head weights, optimizer and scheduler state, the
RNG state (written every ``checkpoint_every`` steps). Both carry the run key (settings, target weights,
parent head), so a checkpoint is never resumed into a different run. Files are written to a temporary
name and renamed, so a kill leaves the previous checkpoint intact.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch

CHECKPOINT_DIR = "checkpoint"


class CheckpointMismatchError(ValueError):
    """``<out>/checkpoint`` belongs to another run (other settings, target or parent head)."""


def _dir(out: Path) -> Path:
    return Path(out) / CHECKPOINT_DIR


def _save(obj: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _load(path: Path, run_key: str) -> dict | None:
    if not path.is_file():
        return None
    obj = torch.load(path, map_location="cpu", weights_only=False)
    if obj.get("run_key") != run_key:
        raise CheckpointMismatchError(f"{path.parent} holds a checkpoint of another training run (other settings, "
                                      "target or parent head): remove it or choose another output directory")
    return obj


def save_partial(out: Path, run_key: str, payload: dict) -> None:
    """Write the training sequences, draft vocabulary and the features computed so far."""
    _save({**payload, "run_key": run_key}, _dir(out) / "partial.pt")


def load_partial(out: Path, run_key: str) -> dict | None:
    """The partially prepared data of this run, or None. Raises :class:`CheckpointMismatchError`."""
    return _load(_dir(out) / "partial.pt", run_key)


def save_data(out: Path, run_key: str, payload: dict) -> None:
    """Write the prepared training data (features, ``d2t``, ``t2d``, hashes, timings); drops ``partial.pt``."""
    _save({**payload, "run_key": run_key}, _dir(out) / "data.pt")
    (_dir(out) / "partial.pt").unlink(missing_ok=True)


def load_data(out: Path, run_key: str) -> dict | None:
    """The prepared training data of this run, or None. Raises :class:`CheckpointMismatchError`."""
    return _load(_dir(out) / "data.pt", run_key)


def save_state(out: Path, run_key: str, step: int, head: torch.nn.Module, optimizer, scheduler,
               *, extra: dict | None = None) -> None:
    """Write the training state after ``step`` optimizer steps (trainable head weights only)."""
    weights = {k: v.detach().cpu() for k, v in head.named_parameters() if v.requires_grad}
    _save({"run_key": run_key, "step": step, "weights": weights, "optimizer": optimizer.state_dict(),
           "scheduler": scheduler.state_dict(), "rng": torch.get_rng_state(), "extra": extra or {}},
          _dir(out) / "state.pt")


def restore_state(out: Path, run_key: str, head: torch.nn.Module, optimizer, scheduler) -> tuple[int, dict]:
    """Load the latest state into ``head``/``optimizer``/``scheduler``; returns ``(step, extra)``, ``(0, {})``
    when there is none. Raises :class:`CheckpointMismatchError`."""
    st = _load(_dir(out) / "state.pt", run_key)
    if st is None:
        return 0, {}
    head.load_state_dict(st["weights"], strict=False)
    optimizer.load_state_dict(st["optimizer"])
    scheduler.load_state_dict(st["scheduler"])
    torch.set_rng_state(st["rng"])
    return int(st["step"]), dict(st.get("extra") or {})


def clear(out: Path) -> None:
    """Remove the checkpoint directory (after the result is written)."""
    shutil.rmtree(_dir(out), ignore_errors=True)
