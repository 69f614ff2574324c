"""Registering a second version says loudly that the first leaves the nightly (issue 43, item 8, a minor).

``pair register`` makes the new version @challenger; the nightly validates aliases, so a v1 that was only
@challenger silently stopped being validated each night. Now one ``note:`` line says so and how to keep it.
Through typer's CliRunner on a real SQLite MLflow store (the ``cli`` fixture of tests/registry/test_cli.py).
"""

from __future__ import annotations

from tests.registry.test_cli import cli, ckpts  # noqa: F401 (fixtures)


def test_a_second_version_says_the_first_leaves_the_nightly(cli, ckpts):  # noqa: F811
    first = cli("register", "--target", ckpts["target"], "--draft", "ngram:3:1", "-k", 3)
    assert first.exit_code == 0 and "no longer validates" not in first.output, first.output
    second = cli("register", "--target", ckpts["target"], "--draft", "ngram:3:2", "-k", 3)
    assert second.exit_code == 0, second.output
    assert "@challenger moved from v1 to v2: v1 has no alias left" in second.output, second.output
    assert "specdec pair promote specdec-pair 1 --alias champion" in second.output

    # a v1 that keeps another alias (here @champion) stays in the nightly: nothing to say
    assert cli("promote", "specdec-pair", "2", "--alias", "champion", "--force", "--reason", "test").exit_code == 0
    third = cli("register", "--target", ckpts["target"], "--draft", "ngram:4:2", "-k", 3)
    assert third.exit_code == 0 and "no longer validates" not in third.output, third.output
