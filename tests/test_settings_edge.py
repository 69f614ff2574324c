"""The edge is the only reader (issue 42): ``get_settings()`` / ``get_policy()`` are called only in the
settings modules and the CLI entry modules; everything below an entry point is handed its section.

Built from the source with ``ast`` (nothing is imported). ``BELOW_THE_EDGE`` lists the calls that remain in
other modules, per module, with their count: the list may only shrink. A new call anywhere else fails
(hand the section down instead); a call removed from a listed module fails too until its count here is
lowered, so the list stays exact.

Services too: every public function of the ``registry`` package (its CLI aside) that reaches an MLflow client
takes the job's :class:`registry.service.Registry` as a required ``registry`` argument, and none takes a
``tracking_uri`` but ``Registry.__init__`` (the entry point's ``--tracking-uri``). Checked on the imported
modules' signatures (``inspect``), the client use read from each function's source.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("specdec", "registry", "monitoring", "flows")
#: model_store(): the models directory read from the environment; RuleSettings() / MonitoringSettings() /
#: PolicySettings(): a section built below the edge reads the environment (the policy with it) under another name
READERS = ("get_settings", "get_policy", "model_store", "RuleSettings", "MonitoringSettings", "PolicySettings")
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
    """How many calls of a function named in :data:`READERS` ``source`` makes (bare or as an
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


#: registry modules that are entry points: their commands take ``--tracking-uri`` and open the command's Registry
REGISTRY_ENTRY_MODULES = {"registry/cli.py"}


def registry_modules() -> list[str]:
    """The ``registry`` package's modules (dotted), its entry modules left out."""
    return [p.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".") for p in sorted((ROOT / "registry").glob("*.py"))
            if p.relative_to(ROOT).as_posix() not in REGISTRY_ENTRY_MODULES]


def public_functions(module):
    """``(qualified name, function)`` of the public functions defined in ``module`` and of its public classes'
    methods (``__init__`` included)."""
    import inspect

    for name, obj in vars(module).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(obj):
            yield name, inspect.unwrap(obj)
        elif inspect.isclass(obj):
            for attr, fn in vars(obj).items():
                if inspect.isfunction(fn) and (attr == "__init__" or not attr.startswith("_")):
                    yield f"{name}.{attr}", fn


def uses_a_service_client(fn) -> bool:
    """True when ``fn``'s body reaches an MLflow client through a service (``<x>.client``, ``<x>.errors()``,
    ``<x>.experiment(...)``) rather than being handed the client; False for generated code (a dataclass's
    ``__init__``)."""
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except OSError:
        return False
    return any(isinstance(n, ast.Attribute) and n.attr in ("client", "errors", "experiment")
               and isinstance(n.value, ast.Name) and n.value.id != "self" for n in ast.walk(tree))


def registry_signature_problems(qualname: str, fn) -> list[str]:
    """What breaks the rule in ``fn``'s signature: a ``tracking_uri`` parameter (only ``Registry.__init__``, the
    entry point's ``--tracking-uri``, takes one); an MLflow-using function without a ``registry``; an optional
    ``registry`` (a default is a fallback)."""
    import inspect

    params = inspect.signature(fn).parameters
    out = []
    if "tracking_uri" in params and qualname != "Registry.__init__":
        out.append(f"{qualname} takes tracking_uri")
    reg = params.get("registry")
    if reg is None:
        if uses_a_service_client(fn):
            out.append(f"{qualname} uses an MLflow client but takes no registry")
    elif reg.default is not inspect.Parameter.empty:
        out.append(f"{qualname}: registry must be required")
    return out


def test_registry_operations_take_the_registry_and_no_tracking_uri():
    import importlib

    problems = [p for m in registry_modules() for q, fn in public_functions(importlib.import_module(m))
                for p in registry_signature_problems(q, fn)]
    assert problems == [], ("a registry operation takes the job's Registry (registry=, required); "
                            f"only the entry points read settings or a URI: {problems}")


def test_registry_signature_rule_can_fail():
    from registry.service import Registry

    def single_call(pair, *, tracking_uri=None, registry=None):
        return registry.client.get_registered_model(pair)

    def no_service(pair):
        return pair.client

    def good(pair, *, registry: Registry):
        return registry.client

    assert registry_signature_problems("single_call", single_call) == [
        "single_call takes tracking_uri", "single_call: registry must be required"]
    assert registry_signature_problems("no_service", no_service) == ["no_service uses an MLflow client but takes no registry"]
    assert registry_signature_problems("good", good) == []
    assert registry_signature_problems("Registry.__init__", Registry.__init__) == []
