"""Alembic 0007 gives existing history rows the floor's per-token acceptance from their stored counters
(issue 30), overall and per category, in the new columns and the stored JSON. Real SQLite file, real
Alembic."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from alembic import command
from sqlalchemy import inspect, text

from monitoring.db import Database, alembic_config
from specdec.core.stats import iid_alpha


def _migrate(db: Database, revision: str, down: bool = False) -> None:
    cfg = alembic_config(db.url)
    with db.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        (command.downgrade if down else command.upgrade)(cfg, revision)


def test_upgrade_fills_per_token_acceptance_from_counters(tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'h.db'}")
    _migrate(db, "0006_webhook_deliveries")
    # a stale night at k=5: 222 drafts of 5 tokens, 323 accepted (rate 0.29), rate CI 0.25-0.34
    night = {"num_speculative_tokens": 5, "num_drafts": 222, "num_draft_tokens": 1110, "num_accepted_tokens": 323,
             "acceptance_rate": 323 / 1110, "acceptance_rate_ci": [0.25, 0.34]}
    window = {"num_speculative_tokens": 3, "num_drafts": 300, "num_draft_tokens": 900, "num_accepted_tokens": 520,
              "acceptance_rate_ci": [None, None]}  # a window stored without a CI
    rows = [("1", night, {"qa": dict(night)}), ("2", window, None), ("3", {"num_prompts": 0}, None)]
    with db.engine.begin() as conn:
        for version, overall, cats in rows:
            conn.execute(text(
                "INSERT INTO validation_runs (pair_name, pair_version, heldout_name, heldout_version, config_hash, "
                "scheduled_date, status, attempts, mlflow_logged, overall, categories) "
                "VALUES ('p', :v, 'h', '1', 'c', :d, 'passed', 1, 0, :o, :c)"),
                dict(v=version, d=dt.date(2026, 11, 30), o=json.dumps(overall), c=json.dumps(cats) if cats else None))
    _migrate(db, "head")
    with db.engine.connect() as conn:
        got = conn.execute(text("SELECT pair_version, per_token_acceptance AS a, per_token_acceptance_ci_low AS lo, "
                                "per_token_acceptance_ci_high AS hi, overall, categories FROM validation_runs "
                                "ORDER BY pair_version")).mappings().all()
    want = iid_alpha(323 / 222, 5.0)
    assert 0.6 < want < 0.65  # the stale demo pair is above 0.40 per token although its rate at k=5 is 0.29
    assert got[0]["a"] == pytest.approx(want)
    assert (got[0]["lo"], got[0]["hi"]) == pytest.approx((iid_alpha(0.25 * 5, 5.0), iid_alpha(0.34 * 5, 5.0)))
    assert json.loads(got[0]["overall"])["per_token_acceptance"] == pytest.approx(want)
    assert json.loads(got[0]["categories"])["qa"]["per_token_acceptance_ci"] == pytest.approx([got[0]["lo"], got[0]["hi"]])
    assert got[1]["a"] == pytest.approx(iid_alpha(520 / 300, 3.0)) and got[1]["lo"] is None  # no interval stored
    assert got[2]["a"] is None  # no counters: nothing to fill
    _migrate(db, "0006_webhook_deliveries", down=True)
    assert "per_token_acceptance" not in {c["name"] for c in inspect(db.engine).get_columns("validation_runs")}
