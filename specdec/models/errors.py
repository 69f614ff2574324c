"""Errors of :mod:`specdec.models`."""

from __future__ import annotations


class ModelNotFoundError(FileNotFoundError):
    """A model reference (path, Hub id, GGUF file or alias) could not be resolved or fetched."""
