"""k is num_speculative_tokens: rename the column and the stored config keys, re-key config hashes

``validation_runs.num_draft_tokens_k`` becomes ``num_speculative_tokens`` (vLLM's name for k;
``num_draft_tokens`` stays the counter of proposed tokens). Stored JSON follows: the ``config``
key ``num_draft_tokens`` and the ``overall`` / ``categories`` keys ``num_draft_tokens_k`` and
``recommended_num_draft_tokens`` are renamed. A row's ``config_hash`` (the nightly key hashes the
pair's decoding config under its new key names) is recomputed when the stored config reproduces
the old hash exactly, so retried nights and baselines keep matching; other rows keep theirs.
Downgrade reverses all of it.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

"""
import hashlib
import json
import math
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0002'
down_revision: Union[str, Sequence[str], None] = '0001'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

OLD_K, NEW_K = "num_draft_tokens", "num_speculative_tokens"
GROUP_RENAMES = {"num_draft_tokens_k": "num_speculative_tokens",
                 "recommended_num_draft_tokens": "recommended_num_speculative_tokens"}
KEY_FIELDS = ("temperature", "top_k", "top_p", "max_new_tokens", "limit", "seed")


def _hash(config: dict) -> str:
    """monitoring.history.config_hash as of this revision (canonical JSON, NaN as null)."""
    clean = {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in config.items()}
    blob = json.dumps(clean, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _key_config(config: dict, drafter_kind, k_name: str, k) -> list[dict]:
    """The nightly key's config dicts this stored validation config can have come from."""
    base = {k_name: k, **{f: config.get(f) for f in KEY_FIELDS}, "drafter_kind": drafter_kind}
    out = [base]
    if config.get("batch_size", 1) != 1:
        out = [{**base, "batch_size": config["batch_size"]}]
    return out


def _rekey(old_hash: str, config: dict, drafter_kind, old: str, new: str) -> str:
    k = config.get(old)
    for cfg in _key_config(config, drafter_kind, old, k):
        if _hash(cfg) == old_hash:
            return _hash({new if key == old else key: v for key, v in cfg.items()})
    return old_hash


def _rename(d, renames: dict):
    return None if d is None else {renames.get(k, k): v for k, v in d.items()}


def _migrate(old_k: str, new_k: str, group_renames: dict) -> None:
    bind = op.get_bind()
    runs = sa.table("validation_runs", sa.column("id", sa.Integer), sa.column("config_hash", sa.String),
                    sa.column("drafter_kind", sa.String), sa.column("config", sa.JSON),
                    sa.column("overall", sa.JSON), sa.column("categories", sa.JSON))
    for row in bind.execute(sa.select(runs)).mappings().all():
        config = row["config"]
        values = {}
        if config and old_k in config:
            values["config_hash"] = _rekey(row["config_hash"], config, row["drafter_kind"], old_k, new_k)
            values["config"] = _rename(config, {old_k: new_k})
        if row["overall"]:
            values["overall"] = _rename(row["overall"], group_renames)
        if row["categories"]:
            values["categories"] = {name: _rename(g, group_renames) for name, g in row["categories"].items()}
        if values:
            bind.execute(sa.update(runs).where(runs.c.id == row["id"]).values(**values))


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table('validation_runs') as batch:
        batch.alter_column('num_draft_tokens_k', new_column_name='num_speculative_tokens',
                           existing_type=sa.Integer(), existing_nullable=True)
    _migrate(OLD_K, NEW_K, GROUP_RENAMES)


def downgrade() -> None:
    """Downgrade schema."""
    _migrate(NEW_K, OLD_K, {v: k for k, v in GROUP_RENAMES.items()})
    with op.batch_alter_table('validation_runs') as batch:
        batch.alter_column('num_speculative_tokens', new_column_name='num_draft_tokens_k',
                           existing_type=sa.Integer(), existing_nullable=True)
