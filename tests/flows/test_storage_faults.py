"""Storage faults give one clear line and a non-zero exit, no traceback, no log flood (issue 25, item 5).

Real faults: a tiny tmpfs filled to 40 KB free (needs root to mount; skipped otherwise), the same
tmpfs remounted read-only, a history DB stamped with a schema revision from a newer specdec, and
MLflow metric names made from hostile category names logged to a real MLflow SQLite store.
Before: tracebacks of 30-250 lines, 10,891 "Logging error" lines ending in RecursionError, and
MLflow refusing ``acceptance_rate.../x`` every night.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.mlflow_server import sqlite_store
from tests.support.reports import make_report

pytestmark = pytest.mark.server


def _env(home: Path, **extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_TRACKING", "SPECDEC_"))}
    env.update({"SPECDEC_HOME": str(home), "PREFECT_HOME": str(home / "prefect"), "HF_HUB_OFFLINE": "1",
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "true", "COLUMNS": "1000", **extra})  # no wrapping: a line is a line
    return env


def _cli(*args: str, home: Path, **extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specdec.cli", *args], capture_output=True, text=True,
                          env=_env(home, **extra), timeout=400)


def _one_clear_line(p: subprocess.CompletedProcess, *phrases: str) -> None:
    said = p.stdout + p.stderr
    assert p.returncode != 0, said
    for bad in ("Traceback", "Logging error", "RecursionError", "╭"):
        assert bad not in said, said[-3000:]
    lines = [ln for ln in said.splitlines() if ln.strip() and not ln.startswith("log file:")]
    assert len(lines) <= 2, said[-3000:]
    assert any(ph in said for ph in phrases), said


@pytest.fixture
def tmpfs(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill(mnt: Path, leave_kb: int) -> None:
    free = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
    (mnt / "fill").write_bytes(b"\0" * max(free - leave_kb * 1024, 0))


def test_full_disk_nightly_is_one_line(tmpfs):
    home = tmpfs / "home"
    assert _cli("db", "upgrade", home=home).returncode == 0  # creates the store (`history` no longer does)  # a usable store first
    _fill(tmpfs, 40)
    _one_clear_line(_cli("nightly", "run", "--pair", "p", "--alias", "champion", "--device", "cpu", home=home),
                    "no space left")


def test_read_only_home_is_one_line(tmpfs):
    home = tmpfs / "home"
    assert _cli("db", "upgrade", home=home).returncode == 0  # creates the store (`history` no longer does)
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    _one_clear_line(_cli("history", home=home), "unable to open database file", "read-only")
    _one_clear_line(_cli("nightly", "run", "--pair", "p", "--alias", "champion", "--device", "cpu", home=home),
                    "read-only")


def test_a_logging_handler_on_a_full_disk_does_not_flood(tmpfs):
    """10,000 records to a log file on a full disk, then the ENOSPC: two lines at most."""
    _fill(tmpfs, 4)
    code = textwrap.dedent(f"""
        import errno, logging
        from specdec.storage_faults import run_cli
        from pathlib import Path
        def app():
            h = logging.FileHandler({str(tmpfs / 'x.log')!r})
            logging.getLogger().addHandler(h)
            for i in range(10000):
                logging.getLogger("flows").error("record %d %s", i, "x" * 200)
            raise OSError(errno.ENOSPC, "No space left on device", {str(tmpfs / 'x.db')!r})
        run_cli(app, lambda: Path({str(tmpfs)!r}))
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=_env(tmpfs / "home"))
    _one_clear_line(p, "no space left")


def test_a_history_db_from_a_newer_schema_is_one_line(tmp_path):
    home = tmp_path / "home"
    assert _cli("db", "upgrade", home=home).returncode == 0  # creates the store (`history` no longer does)
    with sqlite3.connect(home / "history.db") as c:
        c.execute("update alembic_version set version_num = '0099_from_the_future'")
    for args in (["history"], ["db", "upgrade"], ["nightly", "run", "--pair", "p", "--alias", "champion",
                                                  "--device", "cpu"]):
        _one_clear_line(_cli(*args, home=home), "newer specdec")


@pytest.mark.parametrize("url", ["nonsense://u:pw@h/x", "postgresql://u:pw@127.0.0.1:notaport/x",
                                 "postgresql://u:pw@127.0.0.1:1/x"])
def test_a_bad_db_url_is_one_line(tmp_path, url):
    p = _cli("history", home=tmp_path / "home", SPECDEC_DB_URL=url)
    assert p.returncode != 0 and "Traceback" not in p.stdout + p.stderr
    assert len((p.stdout + p.stderr).strip().splitlines()) <= 6, p.stdout + p.stderr


def test_hostile_category_names_are_accepted_by_a_real_mlflow_store(tmp_path):
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    from registry.runs import report_metrics

    cats = {"../x": 0.5, "a/../b": 0.4, "/abs": 0.3, "x/": 0.2, "..": 0.1, "ok cat": 0.6}
    metrics = report_metrics(make_report(0.5, categories=cats))
    client = MlflowClient(sqlite_store(tmp_path / "mlflow"))
    run = client.create_run(client.create_experiment("names"))
    client.log_batch(run.info.run_id, metrics=[Metric(k, v, 0, 0) for k, v in metrics.items()])
    got = client.get_run(run.info.run_id).data.metrics
    assert len([k for k in got if k.startswith("acceptance_rate.")]) >= len(cats)


@pytest.mark.parametrize("leave_kb", [40, 120, 200, 280])
def test_full_disk_pair_register_is_one_line(tmpfs, tmp_path, leave_kb):
    """issue 32, minor: ``pair register`` on a full disk printed two or three tracebacks with raw SQL
    parameters (MLflow's and SQLAlchemy's loggers) before its good last line."""
    from tests.support.models import save_tiny_checkpoint

    ckpt = save_tiny_checkpoint(tmp_path / "tiny")
    home = tmpfs / "home"
    assert _cli("db", "upgrade", home=home).returncode == 0  # creates the store (`history` no longer does)
    _fill(tmpfs, leave_kb)  # the disk fills up at different steps of the registration
    p = _cli("pair", "register", "--target", str(ckpt), "--draft", "ngram", "--name", "full-pair", home=home)
    if p.returncode == 0:  # enough room after all
        return
    _one_clear_line(p, "no space left")
    assert "[parameters:" not in p.stdout + p.stderr and "INSERT INTO" not in p.stdout + p.stderr
