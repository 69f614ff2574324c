"""``specdec history`` below ~200 columns (issue 43, item 8, a minor): the table keeps its key columns whole
(pair, acceptance with its CI, speedup, status) by leaving the detail columns out, and says which and how to
see them. Before: 14 columns squeezed into 120 broke every cell over several lines. Through the real CLI
app on a real SQLite history store (the ``env`` fixture of tests/monitoring/test_cli.py)."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys

from typer.testing import CliRunner

from monitoring import history
from monitoring.db import connect
from monitoring.history import Lineage, RunKey
from specdec.cli import app
from tests.monitoring.test_cli import env  # noqa: F401 (fixture)
from tests.support.reports import make_report


def test_history_is_readable_at_120_columns(env):  # noqa: F811
    db = connect(url=f"sqlite:///{env / 'home' / 'history.db'}")
    rep = make_report(0.29)
    history.record_run(db, rep, RunKey.build("a-long-pair-name", "12", rep.heldout_name, "1", rep.config,
                                             dt.date(2026, 11, 20)), Lineage("t", "d"), alias="champion")
    db.dispose()
    narrow = _history(env, 120)
    assert max(len(line) for line in narrow.splitlines()) <= 120, narrow
    row = next(line for line in narrow.splitlines() if "a-long-pair-name v12" in line)  # one line per row
    assert "0.290 (0.260-0.320)" in row and "champion" in row, narrow
    assert "left out below 200 columns (COLUMNS=200 shows them)" in narrow
    wide = _history(env, 200)
    assert "α_tf" in wide and "left out" not in wide


def _history(env, columns: int) -> str:  # noqa: F811 (a process: the console's width is read when it starts)
    e = {**os.environ, "SPECDEC_HOME": str(env / "home"), "COLUMNS": str(columns)}
    e.pop("SPECDEC_DB_URL", None)
    p = subprocess.run([sys.executable, "-m", "specdec.cli", "history"], env=e, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout


def test_history_never_creates_a_store_at_a_mistyped_path(env):  # noqa: F811
    r = CliRunner().invoke(app, ["history", "--db-url", f"sqlite:///{env / 'typo' / 'histroy.db'}"])
    assert r.exit_code == 1 and "no history store at" in r.output and not (env / "typo").exists()
