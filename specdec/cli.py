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


def _wide_without_terminal() -> None:
    """Without a terminal (cron, CI logs, a pipe) Rich wraps and truncates at 80 columns, so table
    cells read "20…"; there, unless ``COLUMNS`` is set, lines are as wide as they need (up to 250)."""
    import os
    import sys

    if not sys.stdout.isatty():  # Rich's own setting, configured here at the edge (a set COLUMNS wins)
        os.environ.setdefault("COLUMNS", "250")


def _load_plugins() -> None:
    for ep in sorted(entry_points(group="specdec.cli"), key=lambda e: e.name):
        ep.load()(app)
    _add_draft_train()


def _add_draft_train() -> None:
    """``specdec draft train`` joins validation's ``draft`` group here, at the root: training sits above
    validation (it reads held-out sets), so validation never imports it."""
    from specdec.training.cli import train_app
    from specdec.validation.recommend_cli import draft_app

    draft_app.add_typer(train_app, name="train")


_wide_without_terminal()  # before the sub-commands create their consoles
_load_plugins()

def main() -> None:
    """The console entry point: ``app`` with storage faults (full disk, read-only home) as one line."""
    from specdec.settings import home_dir
    from specdec.storage_faults import run_cli

    run_cli(app, home_dir)


if __name__ == "__main__":  # pragma: no cover
    main()
