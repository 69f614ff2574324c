"""Run by tests/core/test_protocol_py312.py under another Python (3.12, 3.13) that has none of the product's
dependencies: every third-party import (torch, transformers, ...) is a ``MagicMock`` module, so the drafter
classes import without them, and ``isinstance(wrapper, Drafter)`` runs with that interpreter's own
runtime-checkable ``Protocol`` semantics (3.12+: members looked up with ``inspect.getattr_static``).

Usage: python protocol_probe.py REPO_ROOT. Prints one JSON line ``{"python": [3, 12], "results": {name: bool}}``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import sys
from unittest import mock

OURS = {"specdec", "benchmarks", "tests"}


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Any module outside the standard library and the repository is a ``MagicMock``."""

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in OURS or top in sys.stdlib_module_names:
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        module = mock.MagicMock(name=spec.name)
        module.__path__, module.__spec__, module.__name__ = [], spec, spec.name
        return module

    def exec_module(self, module):
        pass


def main(root: str) -> None:
    sys.meta_path.insert(0, _Stubs())
    sys.path.insert(0, root)
    from benchmarks.perf_methods import StepRecorder
    from specdec.core.drafters import Drafter, DrafterWrapper, NgramDrafter, as_drafter
    from specdec.validation.replay import RecordingDrafter

    results = {}
    for cls in (DrafterWrapper, RecordingDrafter, StepRecorder):
        wrapper = cls(NgramDrafter())
        results[cls.__name__] = isinstance(wrapper, Drafter) and as_drafter(wrapper) is wrapper
    results["NgramDrafter"] = isinstance(NgramDrafter(), Drafter)
    print(json.dumps({"python": list(sys.version_info[:2]), "results": results}))


if __name__ == "__main__":
    main(sys.argv[1])
