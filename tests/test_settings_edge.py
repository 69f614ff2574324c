"""The edge is the only reader (issue 42): ``get_settings()`` / ``get_policy()`` are called only in the
settings modules and the CLI entry modules; everything below an entry point is handed its section.

Built from the source with ``ast`` (nothing is imported). ``BELOW_THE_EDGE`` lists the calls that remain in
other modules, per module, with their count: the list may only shrink. A new call anywhere else fails
(hand the section down instead); a call removed from a listed module fails too until its count here is
lowered, so the list stays exact.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("specdec", "registry", "monitoring", "flows")
READERS = ("get_settings", "get_policy")
SETTINGS_MODULES = {"specdec/settings", "registry/settings.py", "monitoring/settings.py",
                    "monitoring/production/settings.py", "flows/settings.py"}
#: the command line's modules: each sub-command is an entry point (pyproject ``specdec.cli`` entry points)
ENTRY_MODULES = {"specdec/cli.py", "flows/demo.py", "flows/demo_eagle3.py", "specdec/validation/cli_options.py"}

#: calls still below the edge, by module (only ever lowered; see the module docstring)
BELOW_THE_EDGE: dict[str, int] = {}


def allowed(rel: str) -> bool:
    """True for a settings module or a CLI entry module (``*/cli.py``, ``*_cli.py``, :data:`ENTRY_MODULES`)."""
    name = rel.rsplit("/", 1)[-1]
    return (any(rel == m or rel.startswith(m + "/") for m in SETTINGS_MODULES) or rel in ENTRY_MODULES
            or name == "cli.py" or name.endswith("_cli.py"))


def reader_calls(source: str) -> int:
    """How many calls of a function named ``get_settings`` / ``get_policy`` ``source`` makes (bare or as an
    attribute: ``monitoring.get_settings()`` counts)."""
    count = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            count += name in READERS
    return count


def below_the_edge() -> dict[str, int]:
    out = {}
    for pkg in PRODUCT:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if "migrations" in path.parts or allowed(rel):
                continue
            n = reader_calls(path.read_text())
            if n:
                out[rel] = n
    return out


def test_settings_are_read_only_at_the_edge():
    found = below_the_edge()
    new = {m: n for m, n in found.items() if n > BELOW_THE_EDGE.get(m, 0)}
    assert new == {}, ("get_settings()/get_policy() below the entry points: hand the caller's section down "
                       f"instead (flows.settings.load_settings builds the tree at the edge): {new}")
    gone = {m: (n, found.get(m, 0)) for m, n in BELOW_THE_EDGE.items() if found.get(m, 0) < n}
    assert gone == {}, f"fewer calls than listed (listed, found): lower BELOW_THE_EDGE in {__file__}: {gone}"


def test_calls_are_counted_bare_and_as_attributes():
    src = "import monitoring\nx = get_settings()\ny = monitoring.get_policy().threshold\nz = get_settings\n"
    assert reader_calls(src) == 2


def test_settings_and_cli_modules_are_the_edge():
    assert allowed("specdec/settings/core.py") and allowed("flows/settings.py") and allowed("registry/cli.py")
    assert allowed("flows/production_cli.py") and not allowed("flows/nightly.py")
    assert not allowed("registry/settings_helpers.py")
