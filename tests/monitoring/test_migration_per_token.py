"""Alembic 0007 gives existing history rows the floor's per-token acceptance from their stored counters
(issue 30): a production window stored without a CI and a row with the old position-0 estimator get
alpha_hat and its CI; a nightly row that already has the MLE with a bootstrap CI is left alone. Real
SQLite file, real Alembic."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from alembic import command
from sqlalchemy import text

from monitoring.db import Database, alembic_config
from specdec.core.stats import per_token_from_positions


def _migrate(db: Database, revision: str) -> None:
    cfg = alembic_config(db.url)
    with db.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def test_upgrade_fills_per_token_acceptance_from_counters(tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'h.db'}")
    _migrate(db, "0006_webhook_deliveries")
    pp = [245, 180, 95]  # k=3, 300 drafts: alpha = 520 / (520 + 300 - 95)
    window = {"num_speculative_tokens": 3, "num_drafts": 300, "accepted_per_position": pp, "alpha_hat": None}
    old = {**window, "alpha_hat": 245 / 300, "alpha_hat_ci": [0.77, 0.86]}  # the pre-2026-11-29 estimator
    mle = {**window, "alpha_hat": 0.7, "alpha_hat_ci": [0.66, 0.74]}  # exact counters + bootstrap: keep
    rows = [("1", window, None, None), ("2", old, 245 / 300, {"qa": dict(old)}), ("3", mle, 0.7, None)]
    with db.engine.begin() as conn:
        for version, overall, alpha, cats in rows:
            conn.execute(text(
                "INSERT INTO validation_runs (pair_name, pair_version, heldout_name, heldout_version, config_hash, "
                "scheduled_date, status, attempts, mlflow_logged, num_speculative_tokens, alpha_hat, overall, categories) "
                "VALUES ('p', :v, 'h', '1', 'c', :d, 'passed', 1, 0, 3, :a, :o, :c)"),
                dict(v=version, d=dt.date(2026, 11, 29), a=alpha, o=json.dumps(overall),
                     c=json.dumps(cats) if cats else None))
    _migrate(db, "head")
    want, (lo, hi) = per_token_from_positions(300, pp, 3)
    assert want == pytest.approx(520 / 725) and lo < want < hi
    with db.engine.connect() as conn:
        got = conn.execute(text("SELECT pair_version, alpha_hat, alpha_hat_ci_low, alpha_hat_ci_high, overall, categories "
                                "FROM validation_runs ORDER BY pair_version")).mappings().all()
    for row in got[:2]:
        assert (row["alpha_hat"], row["alpha_hat_ci_low"], row["alpha_hat_ci_high"]) == pytest.approx((want, lo, hi))
        assert json.loads(row["overall"])["alpha_hat_ci"] == pytest.approx([lo, hi])
    assert json.loads(got[1]["categories"])["qa"]["alpha_hat"] == pytest.approx(want)
    assert got[2]["alpha_hat"] == 0.7 and got[2]["alpha_hat_ci_low"] is None  # the MLE row is untouched
    assert json.loads(got[2]["overall"])["alpha_hat_ci"] == [0.66, 0.74]
