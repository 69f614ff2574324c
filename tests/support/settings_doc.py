"""docs/settings.md, generated from the pydantic settings models (each variable's name is written once, in
its model; this renders them). ``tests/test_settings_reference.py`` regenerates it and compares.

Refresh: ``.venv/bin/python -m tests.support.settings_doc`` (writes docs/settings.md).

For each section of :class:`flows.settings.Settings` (and ``make demo``'s :class:`flows.settings.DemoSettings`)
it lists every environment variable: the name pydantic-settings reads (``env_prefix`` + field, an alias
where the field has ``validation_alias``, ``<PREFIX><FIELD>__<SUB>`` for nested models with
``env_nested_delimiter``), the type, the default as read from an empty environment, and the field's line
from its class docstring (``Attributes:``).
"""

from __future__ import annotations

import inspect
import os
import re
import sys
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import AliasChoices, BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "docs" / "settings.md"
REFRESH = ".venv/bin/python -m tests.support.settings_doc"
_ENV_PREFIXES = ("SPECDEC_", "MLFLOW_", "PREFECT_")
_ATTR = re.compile(r"^([a-z_][a-z0-9_]*(?:\s*/\s*[a-z_][a-z0-9_]*)*):\s?(.*)$")

HEADER = """# Settings reference

<!-- generated from the pydantic models by tests/support/settings_doc.py; do not edit by hand.
     Refresh: {refresh} (tests/test_settings_reference.py fails when this file is stale). -->

Every variable the product reads, per section of the settings tree (`flows.settings.Settings`, read once by
each entry point with `flows.settings.load_settings()`; each section lives with the package that uses it).
All are optional. A `.env` file in the working directory is read too (sections that name `env_file`).
Nested sections take `<PREFIX><FIELD>__<SUB>` (for example `SPECDEC_RULES__SPEED_ENABLED=false`) or the whole
object as JSON. List and object values are JSON. Defaults are those of an empty environment; paths shown
relative are resolved against the working directory when read.
"""


@contextmanager
def empty_environment() -> Iterator[None]:
    """The process environment without ``SPECDEC_*``, ``MLFLOW_*``, ``PREFECT_*`` while the defaults are read."""
    saved = {k: v for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES)}
    for k in saved:
        del os.environ[k]
    try:
        yield
    finally:
        os.environ.update(saved)


def attribute_docs(cls: type) -> dict[str, str]:
    """``field -> description`` from the ``Attributes:`` blocks of ``cls`` and its bases' docstrings
    (``a / b: text`` gives both fields the text; continuation lines are joined)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        doc = inspect.cleandoc(klass.__dict__.get("__doc__") or "")
        if "Attributes:" not in doc:
            continue
        names: list[str] = []
        for line in doc.split("Attributes:", 1)[1].splitlines()[1:]:
            indent = len(line) - len(line.lstrip())
            if line.strip() and indent == 0:
                break  # the block ended (``Raises:`` ...)
            m = _ATTR.match(line.strip()) if indent == 4 else None
            if m:
                names = [n.strip() for n in m.group(1).split("/")]
                for n in names:
                    docs[n] = m.group(2).strip()
            elif names and line.strip():
                for n in names:
                    docs[n] = (docs[n] + " " + line.strip()).strip()
    return docs


def _docs(cls: type) -> dict[str, str]:
    """:func:`attribute_docs` of ``cls``, completed from the class whose fields it mirrors (the policy
    section mirrors :class:`specdec.policy.AcceptancePolicy`)."""
    from specdec.policy import AcceptancePolicy
    from specdec.settings.policy import PolicySettings

    mirrored = attribute_docs(AcceptancePolicy) if cls is PolicySettings else {}
    return {**mirrored, **attribute_docs(cls)}


def _md(text: str) -> str:
    """A docstring fragment as Markdown table text: Sphinx roles and double backticks become code spans."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text).replace("``", "`")
    return text.replace("|", "\\|")


def _type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is None:
        return getattr(tp, "__name__", str(tp)).replace("NoneType", "None")
    args = ", ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is typing.Literal:
        return " \\| ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return " \\| ".join(_type_name(a) for a in typing.get_args(tp))
    return f"{getattr(origin, '__name__', str(origin))}[{args}]"


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "unset"
    if isinstance(value, BaseModel):
        return "see below"
    if value == "":
        return "empty"
    if isinstance(value, (list, dict)):
        import json

        return f"`{json.dumps(value)}`"
    return f"`{value}`"


def _env_names(cls: type[BaseSettings], name: str, field: FieldInfo) -> list[str]:
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return [str(a) for a in alias.choices]
    if isinstance(alias, str):
        return [alias]
    return [f"{cls.model_config.get('env_prefix', '')}{name}".upper()]


def _rows(cls: type[BaseModel], prefix: str, seen: set[str], settings_cls: type[BaseSettings]) -> list[str]:
    from specdec.settings.aliases import OLD_NAMES

    from specdec.policy import AcceptancePolicy

    docs, rows, nested = _docs(cls), [], []
    for name, field in cls.model_fields.items():
        if field.annotation is AcceptancePolicy:
            continue  # the tree's one policy, handed to the section: its variables are the policy section's
        names = _env_names(settings_cls, name, field) if cls is settings_cls else [f"{prefix}{name}".upper()]
        if names[0] in seen:
            continue
        seen.update(names)
        sub = field.annotation if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel) else None
        if sub is not None and settings_cls.model_config.get("env_nested_delimiter"):
            nested.append((names[0] + settings_cls.model_config["env_nested_delimiter"], sub))
        shown = " / ".join(f"`{n}`" + (" (older name)" if n in OLD_NAMES else "") for n in names)
        text = _md(docs.get(name, ""))
        rows.append(f"| {shown} | {_type_name(field.annotation)} | {_default(field)} | {text} |")
        rows.extend(_item_rows(names[0], field.annotation))
    for sub_prefix, sub in nested:
        rows.extend(_rows(sub, sub_prefix, seen, settings_cls))
    return rows


def _item_rows(name: str, annotation) -> list[str]:
    """One row per key of the JSON objects a ``list[Model]`` variable holds (``NAME[].key``)."""
    args = typing.get_args(annotation)
    item = args[0] if typing.get_origin(annotation) is list and args else None
    if not (isinstance(item, type) and issubclass(item, BaseModel)):
        return []
    docs = attribute_docs(item)
    return [f"| `{name}[].{key}` | {_type_name(f.annotation)} | {_default(f)} | {_md(docs.get(key, ''))} |"
            for key, f in item.model_fields.items()]


def _section(title: str, cls: type[BaseSettings], seen: set[str]) -> str:
    doc = _md((inspect.getdoc(cls) or "").split("\n\n", 1)[0].replace("\n", " "))
    head = [f"## {title}", "", f"`{cls.__module__}.{cls.__qualname__}`: {doc}", "",
            "| variable | type | default | meaning |", "| --- | --- | --- | --- |"]
    return "\n".join(head + _rows(cls, "", seen, cls)) + "\n"


def render() -> str:
    """The whole page, as docs/settings.md holds it."""
    from flows.settings import DemoSettings, Settings
    from specdec.policy import AcceptancePolicy
    from specdec.settings.policy import PolicySettings

    read_by = {AcceptancePolicy: PolicySettings}  # a tree field built from the settings class that reads it
    annotations = [(name, read_by.get(field.annotation, field.annotation)) for name, field in Settings.model_fields.items()]
    sections = [(name, cls) for name, cls in annotations if isinstance(cls, type) and issubclass(cls, BaseSettings)]
    sections.append(("demo", DemoSettings))
    seen: set[str] = set()
    with empty_environment():
        parts = [HEADER.format(refresh=REFRESH)] + [_section(name, cls, seen) for name, cls in sections]
    return "\n".join(parts)


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT.relative_to(REPO)}", file=sys.stderr)
