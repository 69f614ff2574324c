"""The ``specdec`` command line (typer).

``specdec`` itself knows nothing about MLflow, SQL or Prefect. The ``registry``, ``monitoring``
and ``flows`` packages add their sub-commands through the ``specdec.cli`` entry-point group
(see ``pyproject.toml``): each entry point is a function ``register(app: typer.Typer) -> None``.
"""

from __future__ import annotations

from importlib.metadata import entry_points

import typer

app = typer.Typer(
    name="specdec",
    help="Keep speculative-decoding draft/target pairs healthy.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


@app.command()
def version() -> None:
    """Print the specdec version (and git commit)."""
    from specdec.validation.provenance import code_version

    typer.echo(code_version())


def _load_plugins() -> None:
    for ep in sorted(entry_points(group="specdec.cli"), key=lambda e: e.name):
        ep.load()(app)


_load_plugins()

if __name__ == "__main__":  # pragma: no cover
    app()
