"""Lazy re-exports: a package names its public API without importing torch until it is used."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` whose names live in other modules.

    Args:
        package: the package's ``__name__`` (for the error message).
        exports: public name -> module that defines it.
    Returns:
        the module-level ``__getattr__`` (imports the defining module on first access; raises
        ``AttributeError`` for unknown names) and ``__dir__``.
    """

    def __getattr__(name: str) -> object:
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(exports)

    return __getattr__, __dir__
