"""The product's import graph: no cycles, no cross-module private imports, dependencies one way.

Built from the source with ``ast`` (nothing is imported), over every module of the product
packages. A module "imports" another when any ``import`` / ``from ... import`` statement in it
(at any depth, lazy imports inside functions included) names it; ``from pkg import name`` counts
as importing ``pkg.name`` when that is a module, else ``pkg``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("specdec", "registry", "monitoring", "flows", "benchmarks")
PRODUCT = ("specdec", "registry", "monitoring", "flows")
MAX_BODY = 80  # no product function body longer
LONG_BODY = 60  # bodies longer than this need a reason in their docstring ("Length: ...")
MAX_LONG = 10  # and there are at most this many


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if "migrations" in path.parts:
                continue  # Alembic revisions are loaded by Alembic, never imported
            out[_module_name(path)] = path
    return out


MODULES = _modules()


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    path = MODULES[module]
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str) -> list[tuple[str, str | None, int]]:
    """``(imported module, imported name or None, line)`` for every import in ``module``."""
    tree = ast.parse(MODULES[module].read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, None, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            src = _resolve(module, node)
            for a in node.names:
                sub = f"{src}.{a.name}"
                found.append((sub, None, node.lineno) if sub in MODULES else (src, a.name, node.lineno))
    return found


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for m in MODULES:
        for target, _, _ in _imports(m):
            # importing a.b.c also runs a/__init__ and a.b/__init__, which are part of the product
            if target in MODULES and target != m:
                graph[m].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_known_edges():
    """The parser must see real edges, or the other tests here could not fail."""
    graph = _graph()
    assert "specdec.core.sampling" in graph["specdec.core.loops"]
    assert "specdec.validation.report" in graph["monitoring.history"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_no_private_names_imported_across_modules():
    bad = []
    for m in MODULES:
        for target, name, line in _imports(m):
            private_module = any(p.startswith("_") and not p.startswith("__") for p in target.split("."))
            private_name = name is not None and name.startswith("_") and not name.startswith("__")
            if target.split(".")[0] in PACKAGES and target != m and (private_name or private_module):
                bad.append(f"{MODULES[m].relative_to(ROOT)}:{line} imports {target}{'.' + name if name else ''}")
    assert bad == []


@pytest.mark.parametrize(
    "package, forbidden",
    [
        ("specdec", ("mlflow", "prefect", "evidently", "sqlalchemy", "registry", "monitoring", "flows")),
        ("registry", ("prefect", "monitoring", "flows")),
        ("monitoring", ("prefect", "mlflow", "registry", "flows")),
    ],
)
def test_dependencies_point_one_way(package, forbidden):
    bad = [
        f"{MODULES[m].relative_to(ROOT)}:{line} imports {target}"
        for m in MODULES
        if m.split(".")[0] == package
        for target, _, line in _imports(m)
        if target.split(".")[0] in forbidden
    ]
    assert bad == []


#: the layers inside specdec, lowest first (docs/architecture.md): each imports only the ones before it
SPECDEC_LAYERS = ("specdec.settings", "specdec.core", "specdec.models", "specdec.kinds", "specdec.engines",
                  "specdec.validation", "specdec.training")


@pytest.mark.parametrize("lower", SPECDEC_LAYERS[:-1])
def test_specdec_layers_point_down(lower):
    """Inside specdec: settings <- core <- models <- kinds <- engines <- validation <- training (the lower never
    imports the upper; 0 upward arrows)."""
    upper = SPECDEC_LAYERS[SPECDEC_LAYERS.index(lower) + 1:]
    bad = [
        f"{MODULES[m].relative_to(ROOT)}:{line} imports {target}"
        for m in MODULES
        if m == lower or m.startswith(lower + ".")
        for target, _, line in _imports(m)
        if any(target == u or target.startswith(u + ".") for u in upper)
    ]
    assert bad == []


def test_every_specdec_package_has_a_layer():
    """A new sub-package of specdec is placed in :data:`SPECDEC_LAYERS` (else the layer test would not see it)."""
    packages = {f"specdec.{p.parent.name}" for p in (ROOT / "specdec").glob("*/__init__.py")}
    assert packages == set(SPECDEC_LAYERS)


def _body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the first statement after the docstring to the end of the function."""
    body = node.body
    if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return node.end_lineno - body[0].lineno + 1


def _long_functions() -> dict[str, tuple[int, str]]:
    """``"path:name" -> (body lines, docstring)`` of product functions with a body over LONG_BODY lines."""
    out = {}
    for m, path in MODULES.items():
        if m.split(".")[0] not in PRODUCT:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (n := _body_lines(node)) > LONG_BODY:
                out[f"{path.relative_to(ROOT)}:{node.name}"] = (n, ast.get_docstring(node) or "")
    return out


def test_body_lines_are_measured():
    tree = ast.parse('def f():\n    """doc\n    more"""\n    a = 1\n    return a\n')
    assert _body_lines(tree.body[0]) == 2


def test_functions_fit_on_a_screen():
    """No product function body over 80 lines; at most 10 over 60, each saying why in its docstring."""
    long = _long_functions()
    assert {k: n for k, (n, _) in long.items() if n > MAX_BODY} == {}
    assert [k for k, (_, doc) in long.items() if "Length:" not in doc] == []
    assert len(long) <= MAX_LONG, sorted(long)


def test_no_test_helpers_in_the_product():
    """Test helpers live under tests/support/; the product neither ships a ``testing`` module nor imports tests."""
    assert [m for m in MODULES if m.split(".")[-1] == "testing"] == []
    bad = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {target}" for m in MODULES if m.split(".")[0] != "benchmarks"
           for target, _, line in _imports(m) if target.split(".")[0] == "tests"]
    assert bad == []


MAX_POSITIONAL = 6  # a product function takes at most this many positional parameters (self/cls not counted)
#: the exceptions, each with its reason (at most 5)
POSITIONAL_EXCEPTIONS: dict[str, str] = {}


def _positional(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Parameters a caller may pass by position (before ``*`` / ``*args``), ``self`` and ``cls`` not counted."""
    names = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    return len([n for n in names if n not in ("self", "cls")])


def _many_positional() -> dict[str, int]:
    out = {}
    for module, path in MODULES.items():
        if module.split(".")[0] not in PRODUCT:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _positional(node) > MAX_POSITIONAL:
                out[f"{module}.{node.name}"] = _positional(node)
    return out


def test_positional_parameters_are_counted():
    tree = ast.parse("def f(self, a, b, /, c, *args, d, e=1): pass\ndef g(a, b, *, c): pass\n")
    assert [_positional(fn) for fn in tree.body] == [3, 2]


def test_helpers_take_few_positional_parameters():
    """A helper with more than 6 positional parameters passes its caller's locals by position: pass a typed object,
    or make the options keyword-only (CLI commands and flows are called by keyword anyway)."""
    assert len(POSITIONAL_EXCEPTIONS) <= 5 and all(POSITIONAL_EXCEPTIONS.values())
    found = _many_positional()
    assert {k: n for k, n in found.items() if k not in POSITIONAL_EXCEPTIONS} == {}
    assert sorted(set(POSITIONAL_EXCEPTIONS) - set(found)) == []  # no stale exception
