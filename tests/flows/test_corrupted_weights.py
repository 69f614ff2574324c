"""Corrupted draft weights never give a number (issue 25, item 2).

A registered pair (tiny target + tiny model draft) on a real MLflow SQLite store, validated by the
real nightly flow (temporary Prefect API), alerting to a real receiver on 127.0.0.1:

1. clean night: a number;
2. bytes flipped in the local registry cache's ``model.safetensors``: detected against the
   version's ``weights_sha256``, downloaded again from the store, and the night's number equals the
   clean one exactly;
3. bytes flipped in the artifact store too: the night is an error naming the recorded hash, one
   alert says so, and no acceptance rate is recorded for the version.

Before: (2) and (3) recorded acceptance 0.000 for the registered version, exit 0.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from monitoring.receiver import WebhookReceiver
from tests.support.models import save_tiny_checkpoint
from tests.support.gate import policy_gate
from tests.support.store import model_store
from tests.support.registry import open_registry_at

pytestmark = pytest.mark.server


def _flip(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    mid = len(raw) // 2
    raw[mid:mid + 64] = bytes(b ^ 0xFF for b in raw[mid:mid + 64])
    path.write_bytes(bytes(raw))


def _copies_of(original: Path, root: Path) -> list[Path]:
    data = original.read_bytes()
    return [p for p in root.rglob("model.safetensors") if p.read_bytes() == data]


def test_corrupted_draft_weights_are_refetched_or_refused_never_measured(tmp_path, monkeypatch, prefect_harness):
    from flows import model_cache
    from flows.nightly import nightly_validation_flow
    from monitoring import connect, get_settings, history
    from registry import promote
    from registry.register import register_pair_from_refs
    from specdec import SpeculativeConfig

    home = tmp_path / "home"
    monkeypatch.setenv("SPECDEC_HOME", str(home))
    for v in ("MLFLOW_TRACKING_URI", "SPECDEC_TRACKING_URI", "SPECDEC_DB_URL"):
        monkeypatch.delenv(v, raising=False)
    rows = [{"id": f"p{i}", "category": "a", "prompt": f"abc abc abc {i} abc"} for i in range(4)]
    (tmp_path / "h.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    target = save_tiny_checkpoint(tmp_path / "target", seed=0)
    draft = save_tiny_checkpoint(tmp_path / "draft", seed=0, perturb=0.05)
    registry = open_registry_at()
    reg = register_pair_from_refs(str(target), str(draft), name="cw", target_name="cw-target", draft_name="cw-draft",
                                  config=SpeculativeConfig(max_new_tokens=8), store=model_store(), registry=registry)
    promote("cw", reg.pair.version, "champion", force=True, reason="test setup", gate=policy_gate(), registry=registry)
    recorded = reg.draft.weights_sha256

    def night(day: int):
        model_cache.clear()  # a new night is a new process: nothing loaded yet
        res = nightly_validation_flow(pairs=["cw"], heldout=str(tmp_path / "h.jsonl"), limit=None, device="cpu",
                                      dtype="float32", scheduled_date=dt.date(2026, 11, day))
        return next(r for r in res if r.alias == "champion")

    with WebhookReceiver() as rx:
        monkeypatch.setenv("SPECDEC_ALERT_CHANNELS", json.dumps([{"type": "webhook", "url": rx.url(), "name": "ops"}]))
        clean = night(1)
        assert clean.status in ("passed", "failed", "inconclusive") and clean.acceptance_rate is not None

        (cached,) = _copies_of(draft / "model.safetensors", home / "registry-cache")
        _flip(cached)
        healed = night(2)
        assert healed.status == clean.status and healed.acceptance_rate == clean.acceptance_rate
        (cached,) = _copies_of(draft / "model.safetensors", home / "registry-cache")  # downloaded again

        stored = _copies_of(draft / "model.safetensors", home / "mlartifacts")
        assert len(stored) == 1
        _flip(stored[0])
        _flip(cached)
        bad = night(3)
        assert bad.status == "error", bad
        assert "weights_sha256" in bad.message and recorded[:16] in bad.message, bad.message
        alerts = [r.body for r in rx.accepted if "weights_sha256" in json.dumps(r.body)]
        assert len(alerts) == 1, [r.body.get("title") for r in rx.accepted]
    db = connect(get_settings())
    (row3,) = [r for r in history.list_runs(db, pair_name="cw") if r.scheduled_date == dt.date(2026, 11, 3)]
    assert row3.acceptance_rate is None and row3.status == "error"
