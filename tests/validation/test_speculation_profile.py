"""Each validation writes ``speculation_profile.json`` in NVIDIA Model Optimizer's schema 1.0 (issue 38,
item 6): conditional and marginal per-position rates, per-step and per-request mean acceptance length,
the histogram, per category, the measurement conditions, and Model Optimizer's self-checks
(``1 + sum(marginal) == mean acceptance length``, non-increasing marginals); logged with the MLflow run."""

from __future__ import annotations

import json
import random

import pytest

from specdec.core.stats import DecodingStats
from specdec.validation.aggregate import aggregate
from specdec.validation.prompt_run import PromptRun
from specdec.validation.report import PromptResult
from specdec.validation.report_profile import PROFILE_FILE, Counts, profile_from_counts, speculation_profile
from tests.support.reports import tiny_report
from tests.support.gate import policy_gate
from tests.support.registry import open_registry_at

K = 4


def test_vllms_own_counters_give_the_histogram_and_both_vectors():
    # vLLM 0.32 ngram k 4 on this CPU (issue 38): 13 drafts, 14 accepted, per position [6, 4, 3, 1]
    p = profile_from_counts(Counts(K, 13, [6, 4, 3, 1]))
    assert p["acceptance_length_histogram"] == {"1": 7, "2": 2, "3": 1, "4": 2, "5": 1}
    assert p["marginal_accept_rates"] == pytest.approx([6 / 13, 4 / 13, 3 / 13, 1 / 13], abs=1e-6)
    assert p["conditional_accept_rates"] == pytest.approx([6 / 13, 4 / 6, 3 / 4, 1 / 3], abs=1e-6)
    assert p["mean_accept_length"] == pytest.approx(1 + 14 / 13, abs=1e-6)
    assert p["validation"]["mean_consistency"]["passed"] and p["validation"]["marginal_monotonicity"]["passed"]
    # a malformed count (position 3 accepted more often than position 2) fails the monotonicity self-check
    bad = profile_from_counts(Counts(K, 13, [6, 3, 4, 1]))
    assert not bad["validation"]["marginal_monotonicity"]["passed"]
    assert bad["validation"]["marginal_monotonicity"]["violations"][0]["position"] == 2


def _runs(seed: int = 0) -> tuple[list[PromptRun], dict[int, int]]:
    """The core's own counters (DecodingStats.record_step) of 12 prompts in 2 categories; also the
    histogram of accepted draft tokens per step they recorded."""
    rng, runs, hist = random.Random(seed), [], {}
    for i in range(12):
        st, alpha = DecodingStats(num_speculative_tokens=K), (0.8 if i % 2 else 0.5)
        for _ in range(20 + i):
            n = 0
            while n < K and rng.random() < alpha:
                n += 1
            st.record_step(K, n, rejected=n < K)
            hist[n] = hist.get(n, 0) + 1
        runs.append(PromptRun(row=PromptResult(f"p{i}", ["chat", "code"][i % 2]), stats=st))
    return runs, hist


def _report():
    runs, hist = _runs()
    rep = tiny_report(0.6, num_speculative_tokens=K, categories={})
    rep.overall = aggregate(runs, K, n_resamples=200)
    rep.categories = {c: aggregate([r for r in runs if r.row.category == c], K, n_resamples=200) for c in ("chat", "code")}
    rep.prompts = [r.row for r in runs]
    for r in runs:  # the per-prompt counters the report's rows carry
        r.row.num_drafts, r.row.num_draft_tokens = r.stats.num_drafts, r.stats.num_draft_tokens
        r.row.num_accepted_tokens = r.stats.num_accepted_tokens
    return rep, runs, hist


def test_a_validation_report_writes_a_profile_whose_self_checks_hold(tmp_path):
    rep, runs, hist = _report()
    prof = speculation_profile(rep)
    assert prof["schema_version"] == "1.0" and prof["measured"] and prof["num_speculative_tokens"] == K
    assert prof["acceptance_length_histogram"] == {str(n + 1): c for n, c in sorted(hist.items())}  # what was recorded
    g = rep.overall
    assert prof["marginal_accept_rates"] == pytest.approx(g.per_position_acceptance, abs=1e-6)
    assert prof["mean_accept_length"] == pytest.approx(g.mean_accepted_length, abs=1e-6)
    assert 1 + sum(prof["marginal_accept_rates"]) == pytest.approx(prof["mean_accept_length"], abs=1e-5)
    assert all(a >= b for a, b in zip(prof["marginal_accept_rates"], prof["marginal_accept_rates"][1:]))
    per_request = [1 + r.stats.num_accepted_tokens / r.stats.num_drafts for r in runs]
    assert prof["mean_accept_length_per_request"] == pytest.approx(sum(per_request) / len(per_request), abs=1e-6)
    assert prof["mean_accept_length_per_request"] != pytest.approx(prof["mean_accept_length"], abs=1e-4)  # two means
    assert set(prof["per_category"]) == {"chat", "code"}
    assert prof["per_category"]["code"]["mean_accept_length"] > prof["per_category"]["chat"]["mean_accept_length"]
    assert prof["validation"]["mean_consistency"]["passed"] and prof["validation"]["marginal_monotonicity"]["passed"]
    cond = prof["measurement_conditions"]
    assert cond["engine"] == "specdec core" and cond["dataset"] == "tiny-heldout@sha256:0000" and cond["num_samples"] == 12
    rep.write(tmp_path / "r")
    assert json.loads((tmp_path / "r" / PROFILE_FILE).read_text()) == json.loads(json.dumps(prof))


def test_the_profile_is_logged_with_the_mlflow_run(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    import registry as R
    from tests.support.mlflow_server import sqlite_store
    from tests.support.models import save_tiny_checkpoint

    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    uri = sqlite_store(tmp_path / "store")
    registry = open_registry_at(uri)
    t = R.register_model_version("target", save_tiny_checkpoint(tmp_path / "t", seed=3), registry=registry)
    R.register_pair(t, None, drafter_kind="ngram", config=R.SpeculativeConfig(K), registry=registry)
    rep, _runs_, _hist = _report()
    rep.drafter_kind, rep.drafter_ref = "ngram", None  # what this pair version drafts with
    run_id = R.log_validation("specdec-pair", "1", rep, tmp_path / "rep", registry=registry, gate=policy_gate())
    client = MlflowClient(uri)
    assert PROFILE_FILE in [a.path for a in client.list_artifacts(run_id)]
    logged = json.loads(open(client.download_artifacts(run_id, PROFILE_FILE, str(tmp_path))).read())
    assert logged["method"] == "ngram" and logged["accept_length_model"] == "measured_per_k"
    assert logged["validation"]["mean_consistency"]["passed"]
