"""Alembic 0002 renames k (num_draft_tokens_k -> num_speculative_tokens) and keeps every row usable:
the column and stored JSON are renamed, and a nightly row's config hash is re-keyed so the night
after the upgrade finds its retry row and its baseline again. Real SQLite file, real Alembic."""

from __future__ import annotations

import datetime as dt

from alembic import command
from sqlalchemy import inspect, text

from monitoring.db import Database, alembic_config
from monitoring.history import config_hash
from specdec import SamplingConfig, SpeculativeConfig


def _migrate(db: Database, revision: str, down: bool = False) -> None:
    cfg = alembic_config(db.url)
    with db.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        (command.downgrade if down else command.upgrade)(cfg, revision)


def test_upgrade_renames_k_and_rekeys_nightly_rows(tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'h.db'}")
    _migrate(db, "0001")
    # what the nightly flow of the previous release stored: the key hashed the pair config's dict
    old_key = {"num_draft_tokens": 4, "temperature": 0.0, "top_k": None, "top_p": None, "max_new_tokens": 64,
               "drafter_kind": "ngram", "limit": 12, "seed": 0}
    report_config = {"num_draft_tokens": 4, "temperature": 0.0, "top_k": None, "top_p": None, "max_new_tokens": 64,
                     "seed": 0, "limit": 12, "bootstrap_resamples": 2000, "batch_size": 1}
    import json

    with db.engine.begin() as conn:
        for i, key_hash in enumerate([config_hash(old_key), "f" * 64]):  # a nightly row, and a hand-made one
            conn.execute(text(
                "INSERT INTO validation_runs (pair_name, pair_version, heldout_name, heldout_version, config_hash, "
                "scheduled_date, status, attempts, mlflow_logged, drafter_kind, config, num_draft_tokens_k, overall, categories) "
                "VALUES ('p', :v, 'h', '1', :hash, :d, 'passed', 1, 0, 'ngram', :config, 4, :overall, :cats)"),
                dict(v=str(i + 1), hash=key_hash, d=dt.date(2026, 11, 29), config=json.dumps(report_config),
                     overall=json.dumps({"num_draft_tokens_k": 4, "recommended_num_draft_tokens": 3, "num_draft_tokens": 400}),
                     cats=json.dumps({"qa": {"num_draft_tokens_k": 4}})))
    _migrate(db, "0002")
    columns = {c["name"] for c in inspect(db.engine).get_columns("validation_runs")}
    assert "num_speculative_tokens" in columns and "num_draft_tokens_k" not in columns
    with db.engine.connect() as conn:
        rows = conn.execute(text("SELECT pair_version, config_hash, config, num_speculative_tokens, overall, categories "
                                 "FROM validation_runs ORDER BY pair_version")).mappings().all()
    nightly, other = rows
    # tonight's key, built as the nightly flow builds it now (the SpeculativeConfig codec)
    new_key = {**SpeculativeConfig(4, SamplingConfig(), 64).to_dict(), "drafter_kind": "ngram", "limit": 12, "seed": 0}
    assert nightly["config_hash"] == config_hash(new_key)
    assert other["config_hash"] == "f" * 64  # not reproducible from its config: left as it was
    for row in rows:
        config, overall, cats = (json.loads(row[c]) if isinstance(row[c], str) else row[c] for c in ("config", "overall", "categories"))
        assert row["num_speculative_tokens"] == 4 and config["num_speculative_tokens"] == 4 and "num_draft_tokens" not in config
        assert overall == {"num_speculative_tokens": 4, "recommended_num_speculative_tokens": 3, "num_draft_tokens": 400}
        assert cats == {"qa": {"num_speculative_tokens": 4}}
    _migrate(db, "0001", down=True)  # and back
    with db.engine.connect() as conn:
        back = conn.execute(text("SELECT config_hash, num_draft_tokens_k FROM validation_runs ORDER BY pair_version")).all()
    assert back[0] == (config_hash(old_key), 4) and back[1][0] == "f" * 64
    db.dispose()
