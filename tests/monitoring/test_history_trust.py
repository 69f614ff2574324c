"""History a team can trust (issue 51), on real SQLite files, with real processes and the real ``history`` CLI:

- a row claimed again for a retry shows none of the previous attempt's numbers while it runs, nor after the retry
  ends in an error (a killed Dask worker left ``running`` with the previous acceptance and counters);
- a run whose nightly process died (SIGKILL, SIGTERM) is shown ``crashed`` with its reason by the next night, even
  when no later night claims its key again (another method, config or alias), never ``running`` for good;
- ``history --source engine`` accepts the stored value ``engine``.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import textwrap

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from flows.recovery import crash_dead_claims, leases
from monitoring import history
from monitoring.db import PromptRow, ValidationRun, connect
from monitoring.history import Lineage, RunKey
from specdec.cli import app
from tests.postgres import postgres_cluster
from tests.support.reports import make_report

DAY = dt.date(2026, 12, 7)
T0 = dt.datetime(2026, 12, 7, 2, 0, tzinfo=dt.timezone.utc)
LIN = Lineage(target_hash="t1", draft_hash="d1", heldout_version="1", code_version="0.1.0")


def key(method: str = "replay") -> RunKey:
    return RunKey.build("pair-a", "3", "spec-bench-mini", "1", {"num_speculative_tokens": 4, "method": method}, DAY)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SPECDEC_DB_URL", raising=False)
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


@pytest.fixture(params=["sqlite", "postgres"])
def db(home, request, monkeypatch):
    """The history store on SQLite and on PostgreSQL (where installed), the one the CLI opens too."""
    if request.param == "sqlite":
        url = f"sqlite:///{home / 'history.db'}"
        monkeypatch.setenv("SPECDEC_DB_URL", url)
        d = connect(url=url)
        yield d
        d.dispose()
        return
    with postgres_cluster("specdec") as (port, _):
        url = f"postgresql+psycopg://specdec@127.0.0.1:{port}/postgres"
        monkeypatch.setenv("SPECDEC_DB_URL", url)
        d = connect(url=url)
        yield d
        d.dispose()


def _row(db, run_id: int) -> ValidationRun:
    return history.get_run(db, run_id)


def test_a_row_claimed_for_a_retry_shows_none_of_the_previous_attempts_numbers(db):
    k = key()
    claim = history.claim_run(db, k, alias="champion", now=T0)
    rid = history.record_run(db, make_report(0.61, num_prompts=8), k, LIN, claim=claim, alias="champion", now=T0)
    history.set_evaluation(db, rid, status="passed", rule_results=[{"rule": "absolute"}], root_cause_hint=None,
                           baseline_run_id=None)
    history.mark_mlflow_logged(db, rid, "mlflow-run-1")
    retry = history.claim_run(db, k, alias="champion", now=T0 + dt.timedelta(hours=1))
    row = _row(db, rid)
    assert retry.run_id == rid and row.status == "running"
    assert (row.acceptance_rate, row.num_draft_tokens, row.num_accepted_tokens, row.overall, row.per_token_acceptance,
            row.speedup, row.rule_results, row.mlflow_run_id, row.mlflow_logged, row.finished_at) == \
        (None, None, None, None, None, None, None, None, False, None)
    with db.session() as s:
        assert s.scalar(select(func.count()).select_from(PromptRow).where(PromptRow.run_id == rid)) == 0
    assert (row.pair_version, row.alias, row.config_hash, row.target_hash) == ("3", "champion", k.config_hash, "t1")
    history.mark_error(db, retry, "the engine died")
    row = _row(db, rid)
    assert row.status == "error" and row.error == "the engine died" and row.acceptance_rate is None


_HOLDER = textwrap.dedent("""
    import os, sys, time
    from flows.recovery import NightlyLease
    from monitoring import history
    from monitoring.db import connect
    from monitoring.history import RunKey
    import datetime as dt
    db = connect(url=sys.argv[1])
    key = RunKey.build("pair-a", "3", "spec-bench-mini", "1", {"num_speculative_tokens": 4, "method": "both"},
                       dt.date(2026, 12, 7))
    claim = history.claim_run(db, key, alias="champion")
    NightlyLease.mine(sys.argv[2]).add_claim(claim.run_id, claim.token)
    print(claim.run_id, flush=True)
    time.sleep(600)
""")


def test_a_night_whose_process_died_is_shown_crashed_with_its_reason(db, home):
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, db.url, str(home)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        rid = int(holder.stdout.readline())
    finally:
        holder.kill()  # as SIGTERM or SIGKILL leave it: the row running, the lease naming the claim
        holder.wait(30)
    assert _row(db, rid).status == "running"
    # the next night validates with another method: another key, so nothing claims this row again
    other = history.claim_run(db, key("replay"), alias="champion")
    marked = crash_dead_claims(home, db, stale_after_s=6 * 3600)
    assert marked == [rid]
    row = _row(db, rid)
    assert row.status == "crashed" and f"nightly process {holder.pid}" in row.error and "died" in row.error
    assert _row(db, other.run_id).status == "running"  # a live claim is not touched
    assert leases(home) == []  # the dead lease is gone once its claim is handled
    r = CliRunner().invoke(app, ["history"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "crashed" in r.output and f"run {rid} crashed: the nightly process {holder.pid}" in r.output
    assert history.claim_run(db, key("both"), alias="champion").previous_status == "crashed"  # claimable again


def test_a_run_on_another_host_is_crashed_once_its_heartbeat_is_stale(db, home):
    claim = history.claim_run(db, key(), alias="champion", now=T0)
    assert crash_dead_claims(home, db, stale_after_s=6 * 3600) == [claim.run_id]  # T0 is hours before now
    row = _row(db, claim.run_id)
    assert row.status == "crashed" and "stopped refreshing the claim at 2026-12-07 02:00 UTC" in row.error
    fresh = history.claim_run(db, key("both"), alias="champion")
    assert crash_dead_claims(home, db, stale_after_s=6 * 3600) == [] and _row(db, fresh.run_id).status == "running"


def test_history_source_engine_accepts_the_stored_value(db):
    history.record_run(db, make_report(0.6), key(), LIN, alias="champion")
    r = CliRunner().invoke(app, ["history", "--source", "engine"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "no validation runs recorded" in r.output
    r = CliRunner().invoke(app, ["history", "--source", "nightly"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "pair-a v3" in r.output
    r = CliRunner().invoke(app, ["history", "--source", "engines"], env={"COLUMNS": "200"})
    assert r.exit_code == 2 and "'engine'" in r.output


def test_revalidating_a_version_the_same_day_under_another_alias_keeps_both_rows(db):
    k = key()
    first = history.claim_run(db, k, alias="challenger", now=T0)
    rid1 = history.record_run(db, make_report(0.62), k, LIN, claim=first, alias="challenger", now=T0)
    second = history.claim_run(db, k, alias="champion", now=T0 + dt.timedelta(hours=3))
    assert second.run_id != rid1 and second.previous_status is None
    rid2 = history.record_run(db, make_report(0.31), k, LIN, claim=second, alias="champion")
    rows = {r.alias: r for r in history.list_runs(db, pair_name="pair-a")}
    assert set(rows) == {"challenger", "champion"}
    assert (rows["challenger"].id, rows["challenger"].acceptance_rate) == (rid1, pytest.approx(0.62))
    assert (rows["champion"].id, rows["champion"].acceptance_rate) == (rid2, pytest.approx(0.31))
    # a retry under an alias continues that alias's row
    again = history.claim_run(db, k, alias="challenger", now=T0 + dt.timedelta(hours=4))
    assert again.run_id == rid1 and again.previous_status == "completed"
    assert k.with_alias("champion").key_id() != k.with_alias("challenger").key_id()
