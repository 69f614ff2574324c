"""Watching a process for reads of the target's weight files (test support, not product code): the command runs
under ``strace -f -e trace=open,openat`` where strace is installed, and the process lists its Python-level opens
(``open`` audit events, :mod:`tests.support.engine_night`); either seeing a weight file is a read."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from specdec.validation.served_target import WEIGHT_SUFFIXES


def watched(cmd: list[str], trace: Path) -> list[str]:
    """``cmd`` under ``strace -f -e trace=open,openat`` (when installed) writing ``trace``; returns the command."""
    strace = shutil.which("strace")
    return [strace, "-f", "-qq", "-e", "trace=open,openat", "-o", str(trace)] + cmd if strace else cmd


def weight_opens(trace: Path, python_opens: list[str], weights: list[Path]) -> list[str]:
    """The opens of any of ``weights`` (resolved paths) seen by strace (``trace``) or by the audit hook."""
    names = {str(w) for w in weights} | {str(w.resolve()) for w in weights}
    seen = re.findall(r'open(?:at)?\([^"]*"([^"]+)"', trace.read_text()) if trace.exists() else []
    return [p for p in seen + python_opens if p in names or os.path.realpath(p) in names]


def target_weights(target_dir: Path, *extra: Path) -> list[Path]:
    """The weight files of the checkpoint ``target_dir`` plus ``extra`` (e.g. the GGUF it was converted from)."""
    return [p for p in target_dir.iterdir() if p.name.endswith(WEIGHT_SUFFIXES)] + list(extra)
