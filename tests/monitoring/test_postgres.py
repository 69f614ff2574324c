"""The history store on a real PostgreSQL server (psycopg 3), started here as a throwaway cluster.

Skipped only where no PostgreSQL server binaries exist (``initdb``/``pg_ctl`` on PATH or under
``/usr/lib/postgresql/*/bin``). As root, the cluster runs as the ``postgres`` user.
"""

from __future__ import annotations

import datetime as dt
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import threading

import pytest

from monitoring.db import head_revision

from monitoring import alerts, history, rules
from monitoring.alerts import AlertContext
from monitoring.db import Database
from monitoring.history import Lineage, RunAlreadyClaimed, RunKey
from monitoring.settings import MonitoringSettings
from monitoring.testing import make_report


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    cands = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return cands[-1] if cands else None


def _as_pg(cmd: list[str]) -> list[str]:
    if os.geteuid() == 0:  # postgres refuses to run as root
        return ["runuser", "-u", "postgres", "--", *cmd]
    return cmd


@pytest.fixture(scope="module")
def pg_url():
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not initdb or not pg_ctl:
        pytest.skip("PostgreSQL server binaries not installed")
    if os.geteuid() == 0 and subprocess.run(["id", "postgres"], capture_output=True).returncode:
        pytest.skip("running as root without a 'postgres' user")
    root = tempfile.mkdtemp(prefix="specdec-pg-")
    os.chmod(root, 0o777)
    data = os.path.join(root, "data")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    subprocess.run(_as_pg([initdb, "-D", data, "-A", "trust", "-U", "specdec", "--no-sync"]),
                   check=True, capture_output=True, timeout=120)
    subprocess.run(_as_pg([pg_ctl, "-D", data, "-w", "-t", "60", "-l", os.path.join(root, "log"), "-o",
                           f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off", "start"]),
                   check=True, capture_output=True, timeout=120)
    try:
        yield f"postgresql+psycopg://specdec@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(_as_pg([pg_ctl, "-D", data, "-m", "immediate", "stop"]), capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)


def test_postgres_migrate_upsert_claim_and_incident(pg_url):
    db = Database(pg_url)
    assert db.current_revision() is None
    db.upgrade()
    assert db.current_revision() == head_revision()
    rep = make_report(0.29, num_prompts=5)
    key = RunKey.build("pair-a", "2", rep.heldout_name, "1", rep.config, "2026-11-29")

    # concurrent claims from threads, each with its own connection: exactly one wins
    barrier, won, refused = threading.Barrier(4), [], []

    def worker() -> None:
        barrier.wait()
        try:
            won.append(history.claim_run(db, key))
        except RunAlreadyClaimed:
            refused.append(1)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(won) == 1 and len(refused) == 3
    rid = history.record_run(db, rep, key, Lineage("t2", "d1"), claim=won[0])
    assert history.record_run(db, rep, key, Lineage("t2", "d1")) == rid  # upsert, one row
    assert len(history.list_runs(db)) == 1 and len(history.prompt_results(db, rid)) == 5
    assert history.snapshot(db, rid).overall.acceptance_rate == pytest.approx(0.29)

    s = MonitoringSettings(db_url=pg_url)
    results = rules.evaluate(rep, None)
    t0 = dt.datetime(2026, 11, 29, 2, tzinfo=dt.timezone.utc)
    ctx = AlertContext(pair_name="pair-a", pair_version="2", run_id=rid)
    assert alerts.process(db, ctx, results, settings=s, now=t0).transition == "fire"
    assert alerts.process(db, ctx, results, settings=s, now=t0 + dt.timedelta(hours=1)).transition is None
    assert alerts.open_incident(db, "pair-a").opened_at == t0  # timezone-aware round trip
    db.dispose()
