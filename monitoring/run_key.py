"""The idempotency key of a nightly validation, the claim on it, and the lineage recorded with it.

Key: (pair name, pair version, held-out name, held-out version, config hash, scheduled date), a
unique constraint on ``validation_runs`` (see :mod:`monitoring.history` for the flow).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping

from monitoring.db import ValidationRun
from specdec.validation.report import ValidationReport, nan_to_none

__all__ = ["RunAlreadyClaimed", "config_hash", "RunKey", "Lineage", "Claim"]


class RunAlreadyClaimed(Exception):
    """Another live run holds this idempotency key (or took it over from us).

    The flow catches it and exits cleanly: the other run is doing the work.

    Attributes:
        key: the :class:`RunKey`. run_id: the row id. claimed_at: when the holder claimed it.
    """

    def __init__(self, key: "RunKey", run_id: int, claimed_at: dt.datetime | None, reason: str) -> None:
        self.key, self.run_id, self.claimed_at = key, run_id, claimed_at
        super().__init__(f"validation run {key.describe()} (row {run_id}): {reason}")


def config_hash(config: Mapping[str, Any]) -> str:
    """SHA-256 (64 hex chars) of ``config`` as canonical JSON (sorted keys, NaN as null).

    Use the same dict for :func:`claim_run` and :func:`record_run`, e.g. the validation config's
    ``to_dict()`` (num_draft_tokens, max_new_tokens, temperature, top_k, top_p, seed, limit).
    """
    blob = json.dumps(nan_to_none(dict(config)), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True)
class RunKey:
    """The idempotency key of one nightly validation."""

    pair_name: str
    pair_version: str
    heldout_name: str
    heldout_version: str
    config_hash: str
    scheduled_date: dt.date

    @classmethod
    def build(
        cls, pair_name: str, pair_version: str | int, heldout_name: str, heldout_version: str,
        config: Mapping[str, Any], scheduled_date: dt.date | str,
    ) -> "RunKey":
        """Key from plain values; ``config`` is hashed with :func:`config_hash`.

        ``scheduled_date`` is the date the run was scheduled for (a ``date`` or ISO ``YYYY-MM-DD``),
        not when it happened to start, so a retry the next morning keeps the same key.
        """
        if isinstance(scheduled_date, str):
            scheduled_date = dt.date.fromisoformat(scheduled_date)
        elif isinstance(scheduled_date, dt.datetime):
            scheduled_date = scheduled_date.date()
        return cls(pair_name, str(pair_version), heldout_name, str(heldout_version),
                   config_hash(config), scheduled_date)

    def key_id(self) -> str:
        """32 hex chars identifying this key (e.g. the MLflow run tag ``specdec.run_key``)."""
        blob = "|".join([self.pair_name, self.pair_version, self.heldout_name, self.heldout_version,
                         self.config_hash, self.scheduled_date.isoformat()])
        return hashlib.sha256(blob.encode()).hexdigest()[:32]

    def describe(self) -> str:
        """Human-readable key (config hash shortened)."""
        return (f"{self.pair_name} v{self.pair_version} on {self.heldout_name}@{self.heldout_version} "
                f"config {self.config_hash[:10]} for {self.scheduled_date.isoformat()}")

    def _where(self):
        r = ValidationRun
        return (r.pair_name == self.pair_name, r.pair_version == self.pair_version,
                r.heldout_name == self.heldout_name, r.heldout_version == self.heldout_version,
                r.config_hash == self.config_hash, r.scheduled_date == self.scheduled_date)


@dataclass(frozen=True)
class Lineage:
    """What the pair was made of, for root-cause hints. Plain data from the registry.

    Attributes:
        target_hash / draft_hash: weight hashes (e.g. sha256 of safetensors); ``None`` for a
            weightless drafter (n-gram). heldout_version: held-out set version. code_version:
            ``specdec`` version + git commit.
    """

    target_hash: str | None = None
    draft_hash: str | None = None
    heldout_version: str | None = None
    code_version: str | None = None

    @classmethod
    def from_report(cls, report: ValidationReport, *, target_hash: str | None,
                    draft_hash: str | None) -> "Lineage":
        """Lineage with held-out and code versions taken from ``report``."""
        return cls(target_hash, draft_hash, report.heldout_version, report.code_version)


@dataclass(frozen=True)
class Claim:
    """Proof that this process owns a run row. ``previous_status`` is ``None`` for a new row."""

    run_id: int
    token: str
    key: RunKey
    previous_status: str | None
    attempts: int
