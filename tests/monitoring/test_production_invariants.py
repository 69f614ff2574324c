"""Impossible production numbers are refused, never stored (issue 25, item 3).

A real scripted vLLM ``/metrics`` exporter on 127.0.0.1 serves counters that break an invariant
(accepted > drafted tokens, accepted at a position > drafts, ``+Inf``, a decrease without a reset,
an empty body) between good scrapes; the history is a real SQLite file. The promise: the window is
refused with one line naming the series, nothing of it is stored, every stored rate is in [0, 1]
with lower <= upper, and the next good scrape still covers the interval (no window lost).
"""

from __future__ import annotations

import datetime as dt
import math
import os
import subprocess
import sys

import pytest
from sqlalchemy import select

from monitoring import history
from monitoring.db import PRODUCTION, ValidationRun, connect
from monitoring.production import store
from monitoring.production.ingest import ingest_window
from monitoring.production.settings import ProductionMapping, ProductionSettings, ProductionSource
from tests.support.exporters import ScriptedExporter, VllmCounters, histogram_state
from monitoring.settings import MonitoringSettings
from specdec.validation.report import GroupMetrics

K = 3
GOOD = [30, 30, 40, 50]  # accepted-length histogram of one window (0..3 of k=3)
T = 1000.0


def _ms(tmp_path) -> MonitoringSettings:
    return MonitoringSettings(db_url=f"sqlite:///{tmp_path / 'history.db'}", home=tmp_path, alert_channels=[])


def _prod(url) -> tuple[ProductionSource, ProductionSettings]:
    src = ProductionSource(name="vllm-test", kind="metrics", url=url, engine="vllm")
    return src, ProductionSettings(sources=[src], mappings=[
        ProductionMapping(source="vllm-test", model="tiny", pair="pair-a", alias="champion", version="1")])


def _good(n: int) -> list[VllmCounters]:
    return [histogram_state("tiny", "0", [GOOD] * n, K, T)]


def _bad(**change) -> list[VllmCounters]:
    c = _good(2)[0]
    return [VllmCounters(**{**c.__dict__, **change})]


def _stored(db) -> list[ValidationRun]:
    with db.session() as s:
        return list(s.scalars(select(ValidationRun).where(ValidationRun.source == PRODUCTION)))


def _assert_all_stored_rates_possible(db) -> None:
    for r in _stored(db):
        assert 0.0 <= r.acceptance_rate <= 1.0
        if r.acceptance_rate_ci_low is not None:  # no CI without per-position counts or k
            assert 0.0 <= r.acceptance_rate_ci_low <= r.acceptance_rate_ci_high <= 1.0


G1, G2 = _good(1)[0], _good(2)[0]
BROKEN = {
    # the example: accepted 5.73x the drafted tokens
    "accepted_gt_drafted": (_bad(accepted=int(5.73 * G1.draft_tokens * 2)), "accepted tokens"),
    "per_position_gt_drafts": (_bad(per_position=(10_000, *G2.per_position[1:])), "accepted at position 0"),
    "decrease_without_reset": (_bad(drafts=G1.drafts - 1, draft_tokens=G1.draft_tokens - 3, accepted=G1.accepted - 1,
                                    per_position=tuple(p - 1 for p in G1.per_position)), "without a reset"),
    # cumulative bounds hold at both scrapes, but the window's increases break them
    "window_accepted_gt_drafted": (_bad(drafts=G1.drafts, draft_tokens=G1.draft_tokens,
                                        accepted=G1.draft_tokens, per_position=(G1.drafts,) * K), "window of model"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_counters_are_refused_and_the_next_good_scrape_covers_the_window(tmp_path, case, caplog):
    broken, phrase = BROKEN[case]
    ms = _ms(tmp_path)
    db = connect(ms)
    with ScriptedExporter([_good(1), broken, _good(3)]) as ex:
        src, ps = _prod(ex.url)
        first = ingest_window(db, src, settings=ps, monitoring_settings=ms)
        refused = ingest_window(db, src, settings=ps, monitoring_settings=ms)
        assert [o.status for o in first] == ["baseline"]
        assert [o.status for o in refused] == ["refused"], refused
        assert phrase in refused[0].message and "tiny" in refused[0].message
        assert any(phrase in r.getMessage() for r in caplog.records if r.levelname == "ERROR")
        assert _stored(db) == [], "nothing of a refused scrape is stored"
        (after,) = ingest_window(db, src, settings=ps, monitoring_settings=ms)
    assert after.status != "refused"
    assert after.num_drafts == 2 * sum(GOOD), "the good window spans the refused scrape: nothing lost"
    assert after.start == first[0].end
    _assert_all_stored_rates_possible(db)


def _text(drafted: str) -> bytes:
    return ("# TYPE vllm:spec_decode_num_drafts counter\n"
            'vllm:spec_decode_num_drafts_total{model_name="tiny",engine="0"} 150\n'
            "# TYPE vllm:spec_decode_num_draft_tokens counter\n"
            f'vllm:spec_decode_num_draft_tokens_total{{model_name="tiny",engine="0"}} {drafted}\n'
            "# TYPE vllm:spec_decode_num_accepted_tokens counter\n"
            'vllm:spec_decode_num_accepted_tokens_total{model_name="tiny",engine="0"} 260\n').encode()


def test_plus_inf_and_an_empty_body_lose_nothing(tmp_path):
    ms = _ms(tmp_path)
    db = connect(ms)
    good0, good1 = _text("300"), _text("450")  # 150 drafts, then 0 drafts more but 150 tokens: keep drafts equal
    good1 = good1.replace(b"} 150\n", b"} 200\n", 1)
    with ScriptedExporter([good0, _text("+Inf"), b"", good1]) as ex:
        src, ps = _prod(ex.url)
        outs = [ingest_window(db, src, settings=ps, monitoring_settings=ms) for _ in range(4)]
    assert [[o.status for o in x] for x in outs[:3]] == [["baseline"], ["refused"], ["refused"]]
    assert "+Inf" in outs[1][0].message or "inf" in outs[1][0].message
    assert "empty scrape" in outs[2][0].message
    (w,) = outs[3]
    assert (w.num_drafts, w.num_draft_tokens) == (50, 150) and w.start == outs[0][0].end
    _assert_all_stored_rates_possible(db)


def test_cli_refuses_plus_inf_with_one_line_and_exit_1(tmp_path):
    env = {**os.environ, "SPECDEC_HOME": str(tmp_path), "COLUMNS": "200"}
    for v in ("SPECDEC_DB_URL", "SPECDEC_PRODUCTION_SOURCES", "SPECDEC_PRODUCTION_MAPPINGS", "SPECDEC_ALERT_CHANNELS"):
        env.pop(v, None)
    args = ["--engine", "vllm", "--source", "vllm-a", "--pair", "pair-a", "--version", "1", "--model", "tiny"]
    with ScriptedExporter([_text("300"), _text("+Inf")]) as ex:
        runs = [subprocess.run([sys.executable, "-m", "specdec.cli", "ingest", "metrics", "--url", ex.url, *args],
                               capture_output=True, text=True, env=env, timeout=180) for _ in range(2)]
    assert runs[0].returncode == 0, runs[0].stderr
    p = runs[1]
    assert p.returncode == 1, p.stdout + p.stderr
    assert "Traceback" not in p.stderr and "OverflowError" not in p.stderr
    assert "draft_tokens{model='tiny'}" in p.stderr and "refused" in p.stderr


def test_the_store_refuses_a_rate_outside_0_1_or_a_reversed_ci(tmp_path):
    db = connect(_ms(tmp_path))
    now = dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc)
    for rate, ci in ((2.56, [2.559, 1.0]), (0.5, [0.6, 0.4]), (-0.1, [math.nan, math.nan])):
        g = GroupMetrics(num_speculative_tokens=K, num_drafts=10, num_draft_tokens=30, num_accepted_tokens=12,
                         acceptance_rate=rate, acceptance_rate_ci=ci)
        with pytest.raises(store.ImpossibleMetrics, match="not"):
            store.record_window(db, store.Window(pair="pair-a", version="1", alias="champion", source="s", engine="vllm",
                                                 model="tiny", start=now - dt.timedelta(hours=1), end=now, metrics=g,
                                                 config={}))
    assert history.list_runs(db, source=PRODUCTION) == []
