"""The 40% floor judges the acceptance rate as engines print it (issue 41): accepted / drafted at the
pair's validated k, with the per-token acceptance beside it. The demo's stale pair (target fine-tuned,
draft unchanged: rate 0.296 at k = 4, per-token 0.562) fails it and fires, the floor first in the alert,
then the relative rule and speed; the re-derived pair passes and resolves. A pair version's own floor is
used and named; the relative rule compares α, so a k change alone is not drift; production windows judge
the same rate from the same counters; a stored history is re-derived by migration 0008."""

from __future__ import annotations

import datetime as dt
import json
import random
from dataclasses import asdict
from types import SimpleNamespace

import pytest
from sqlalchemy import text

from monitoring import pipeline, rules
from monitoring.db import Database
from monitoring.history import Lineage, RunKey
from monitoring.production.counters import pool_window, window_metrics
from monitoring.production.engines import ACCEPTED, DRAFT_TOKENS, DRAFTS, ENGINES, PER_POSITION
from monitoring.production.sources import Scrape, parse_exposition, scrape_series
from monitoring.receiver import WebhookReceiver
from monitoring.settings import ChannelConfig, DeliverySettings, MonitoringSettings, RuleSettings
from registry.gate import evaluate_gate
from specdec.core.stats import DecodingStats
from specdec.policy import FLOOR_TAG, AcceptancePolicy, below_floor_note, floor_for, rates_by_k
from specdec.validation.aggregate import aggregate
from specdec.validation.prompt_run import PromptRun
from specdec.validation.report import PromptResult, nan_to_none
from tests.support.exporters import histogram_state, render_vllm
from tests.support.reports import make_report
from tests.support.gate import policy_gate

FAST = DeliverySettings(max_attempts=2, backoff_initial_s=0.01, backoff_max_s=0.05, timeout_s=2)
NIGHTS = [dt.date(2026, 12, 1), dt.date(2026, 12, 2), dt.date(2026, 12, 3)]


def _night(rate: float, alpha: float, per_position: list[float], speedup: tuple[float, float, float], **kw):
    """A demo night at k = 4: acceptance rate and per-token α with their CIs, per-position acceptance, speedup [CI]."""
    r = make_report(rate, ci_half=0.035, alpha_hat=alpha, hat_half=0.06, alpha_tf=alpha, k=4,
                    num_draft_tokens=1200, **kw)
    g = r.overall
    g.per_position_acceptance = per_position
    g.speedup, g.speedup_ci, g.num_prompts = speedup[0], [speedup[1], speedup[2]], 12
    return r


#: the demo's nights (this week's `make demo`): v1 bf16 draft of target v1; v2 the fine-tuned target with
#: the old draft: per-token 0.562 [0.506, 0.634], rate 0.296 at k = 4; v3 the draft re-derived
HEALTHY = dict(rate=0.86, alpha=0.97, per_position=[0.95, 0.88, 0.83, 0.78], speedup=(1.42, 1.20, 1.50))
STALE = dict(rate=0.296, alpha=0.562, per_position=[0.56, 0.30, 0.20, 0.124], speedup=(0.73, 0.61, 0.85))


def _record(db, settings, night: int, version: str, lineage: Lineage, **night_kw):
    key = RunKey.build("specdec-pair", version, "spec_bench_demo", "1", {"num_speculative_tokens": 4}, NIGHTS[night])
    return pipeline.record_and_evaluate(db, _night(**night_kw), key, lineage, alias="challenger",
                                        champion_version="1", settings=settings, evidently=False)


def test_demo_stale_pair_fails_the_default_floor_and_fires_then_the_rederived_pair_resolves(tmp_path):
    with WebhookReceiver() as receiver:
        s = MonitoringSettings(db_url=f"sqlite:///{tmp_path / 'h.db'}", delivery=FAST, alert_channels=[
            ChannelConfig(type="webhook", url=receiver.url("/hook"), name="ops")])
        assert s.rules.policy.estimator == "pooled" and s.rules.policy.floor_source == "policy default"  # the default
        db = Database(s.db_url)
        db.upgrade()
        n1 = _record(db, s, 0, "1", Lineage("t1", "d1", "1", "0.1"), **HEALTHY)
        assert n1.evaluation.verdict == "passed" and n1.alert.transition is None
        n2 = _record(db, s, 1, "2", Lineage("t2", "d1", "1", "0.1"), **STALE)
        assert n2.evaluation.verdict == "failed" and n2.alert.transition == "fire"
        floor = next(r for r in n2.evaluation.results if r.rule == "absolute" and r.scope == "overall")
        assert floor.firing and floor.metric == "acceptance_rate" and floor.value == pytest.approx(0.296)
        assert "floor 0.400 (policy default)" in floor.message and "per-token acceptance 0.562" in floor.message
        # the rate at smaller k, from the per-position acceptance: 0.56 at k = 1, 0.43 at k = 2
        assert "at smaller k: 0.56 at k = 1, 0.43 at k = 2, 0.35 at k = 3 (highest k at or above the floor: 2)" in floor.message
        fired = {r.rule for r in n2.evaluation.firing}
        assert {"absolute", "relative", "speed"} <= fired
        lines = receiver.accepted[0].body["text"].splitlines()
        # the floor first, then the relative rule and speed
        assert lines[1] == ("acceptance rate 29.6% < 40% at k = 4 after a target-only change: target changed, "
                            "draft unchanged (floor from policy default)")
        assert lines[2] == "Since baseline: per-token acceptance 0.970 -> 0.562, speedup 1.42x -> 0.73x"
        facts = receiver.accepted[0].body["facts"]
        assert facts["Verdict"] == "failed" and facts["Acceptance rate"].startswith("0.296 (95% CI 0.261-0.331), floor 0.40")
        assert "per-token acceptance 0.562" in facts["Acceptance rate"]
        n3 = _record(db, s, 2, "3", Lineage("t2", "d2", "1", "0.1"), **HEALTHY)
        assert n3.evaluation.verdict == "passed" and n3.alert.transition == "resolve"
        assert [m.body["event"] for m in receiver.accepted] == ["fire", "resolve"]


def test_a_pair_with_its_own_floor_of_0_20_passes_at_0_23_and_says_which_floor():
    # an EAGLE-3 head whose healthy rate at k 5 is 0.23 (mean accepted length 2.16)
    report = make_report(0.23, ci_half=0.015, alpha_hat=0.55, hat_half=0.03, alpha_tf=0.55, k=5,
                         num_draft_tokens=4000)
    tags = {FLOOR_TAG: "0.20"}
    base = RuleSettings()
    floor = floor_for(base.policy, tags)
    assert (floor.value, floor.source) == (0.20, "pair version tag acceptance_floor")
    res = rules.evaluate(report, None, base.for_floor(floor))
    (ab,) = [r for r in res if r.rule == "absolute" and r.scope == "overall"]
    assert ab.status == rules.OK and rules.verdict(res) == "passed"
    assert "acceptance rate 0.230 (95% CI 0.215-0.245) at k=5 >= floor 0.200 (pair version tag acceptance_floor)" in ab.message
    # without its own floor the policy's 0.40 judges it, and says so
    res = rules.evaluate(report, None, base)
    (ab,) = [r for r in res if r.rule == "absolute" and r.scope == "overall"]
    assert ab.firing and "floor 0.400 (policy default)" in ab.message and rules.verdict(res) == "failed"
    # the gate uses the same floor, and names it when it refuses
    metrics = {"acceptance_rate": 0.23, "acceptance_rate_ci_low": 0.215, "acceptance_rate_ci_high": 0.245,
               "per_token_acceptance": 0.55, "num_speculative_tokens": 5.0, "num_prompts": 40.0, "num_draft_tokens": 4000.0}
    assert evaluate_gate(metrics, policy_gate().for_pair(tags)).status == "passed"
    refused = evaluate_gate(metrics, policy_gate().for_pair({}))
    assert refused.status == "failed" and "< floor 0.40 (policy default)" in refused.reasons[0]
    with pytest.raises(ValueError, match="acceptance_floor must be a number in"):
        floor_for(base.policy, {FLOOR_TAG: "high"})


def _runs(alpha: float, k: int, prompts: int = 24, tokens: int = 96, seed: int = 0) -> list[PromptRun]:
    """Leviathan's i.i.d. model: each draft accepted with probability alpha until the first rejection."""
    rng, runs = random.Random(seed), []
    for i in range(prompts):
        st, emitted = DecodingStats(num_speculative_tokens=k), 0
        while emitted < tokens:
            n = 0
            while n < k and rng.random() < alpha:
                n += 1
            st.record_step(k, n, rejected=n < k)
            emitted += n + 1
        runs.append(PromptRun(row=PromptResult(f"p{i}", "chat"), stats=st))
    return runs


def test_relative_rule_does_not_fire_when_only_k_changed():
    v1, v2 = aggregate(_runs(0.9, 3), 3, n_resamples=500), aggregate(_runs(0.9, 8, seed=1), 8, n_resamples=500)
    assert v2.acceptance_rate < 0.85 * v1.acceptance_rate  # the rate falls with k: a rate-based rule would fire
    res = rules.evaluate(SimpleNamespace(overall=v2, categories={}), SimpleNamespace(overall=v1, categories={}),
                         RuleSettings(speed_enabled=False))
    (rel,) = [r for r in res if r.rule == "relative"]
    assert rel.status == rules.OK and rel.metric == "per_token_acceptance" and rel.baseline == pytest.approx(0.9, abs=0.03)
    assert rules.verdict(res) == "passed"


K = 4
BEFORE, DURING = [40, 25, 15, 10, 10], [120, 70, 40, 30, 20]  # accepted-length histograms of two scrapes


def _llamacpp_text(state) -> str:
    """llama-server's /metrics text for the speculative counters (HELP/TYPE lines with ``_total``)."""
    names, out = dict(ENGINES["llamacpp"].counters), []
    for role, value in ((DRAFT_TOKENS, state.draft_tokens), (ACCEPTED, state.accepted), (DRAFTS, state.drafts)):
        out += [f"# TYPE {names[role]}_total counter", f"{names[role]}_total {value}"]
    out += [f"# TYPE {names[PER_POSITION]}_total counter"]
    out += [f'{names[PER_POSITION]}_total{{position="{i}"}} {v}' for i, v in enumerate(state.per_position)]
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("fmt", ["vllm", "llamacpp"])
def test_production_windows_judge_the_same_rate_from_the_same_counters(fmt):
    s0 = histogram_state("m", "0", [BEFORE], K, created=1000.0)
    s1 = histogram_state("m", "0", [BEFORE, DURING], K, created=1000.0)
    eng, render = (ENGINES["vllm"], lambda s: render_vllm([s]).decode()) if fmt == "vllm" else (ENGINES["llamacpp"], _llamacpp_text)
    t0 = dt.datetime(2026, 12, 1, 10, 0, tzinfo=dt.timezone.utc)
    prev = Scrape(t0, parse_exposition(render(s0), eng)[0])
    cur = Scrape(t0 + dt.timedelta(minutes=15), parse_exposition(render(s1), eng)[0])
    [wc] = pool_window(scrape_series(prev, cur, eng), prev.at.timestamp(), cur.at.timestamp()).values()
    g = window_metrics(wc)
    accepted = sum(j * n for j, n in enumerate(DURING))
    drafted = K * sum(DURING)
    assert (g.num_accepted_tokens, g.num_draft_tokens) == (accepted, drafted)  # the engine's own counters
    res = rules.evaluate(SimpleNamespace(overall=g, categories={}), None, RuleSettings(speed_enabled=False))
    (ab,) = [r for r in res if r.rule == "absolute"]
    # the rate vLLM prints as "Draft acceptance rate" and llama.cpp as accepted/drafted: 320 / 1120
    assert ab.metric == "acceptance_rate" and ab.value == pytest.approx(accepted / drafted) == pytest.approx(0.2857, abs=1e-4)
    assert ab.firing and f"acceptance rate {accepted / drafted:.3f}" in ab.message and "at k=4 < floor 0.400" in ab.message
    assert "per-token acceptance" in ab.message  # shown beside it


def test_below_floor_note_says_the_rate_at_smaller_k():
    rates = rates_by_k([0.59, 0.30, 0.16, 0.075, 0.035])
    assert rates[1] == pytest.approx(0.59) and rates[5] == pytest.approx(1.16 / 5)
    floor = floor_for(AcceptancePolicy(), {})
    note = below_floor_note(rates, 5, floor)
    assert note == ("acceptance rate 0.23 at k = 5 is already below floor 0.40 (policy default); at smaller k: "
                    "0.59 at k = 1, 0.44 at k = 2, 0.35 at k = 3, 0.28 at k = 4 (highest k at or above the floor: 2)")
    assert below_floor_note(rates, 5, floor_for(AcceptancePolicy(), {FLOOR_TAG: "0.2"})) is None
    assert below_floor_note(rates, 1, floor) is None and below_floor_note({}, 4, floor) is None


def _stored(g) -> str:
    """A GroupMetrics as the history store keeps it (JSON, NaN -> null)."""
    return json.dumps(nan_to_none(asdict(g)))


def test_migration_0008_rederives_stored_verdicts_and_keeps_the_numbers(tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'h.db'}")
    db.upgrade("0007_per_token_acceptance")
    old = RuleSettings(policy=AcceptancePolicy(estimator="per_token"), speed_enabled=False)
    base, stale = _night(**HEALTHY), _night(**STALE, categories={"chat": 0.62})
    stale_results = rules.evaluate(stale, None, old)
    assert rules.verdict(stale_results) == "passed"  # what issue 30's default said of the stale pair
    rows = [(1, "passed", base, rules.evaluate(base, None, old), None),
            (2, "passed", stale, stale_results, 1)]
    with db.engine.begin() as conn:
        for rid, status, rep, res, baseline in rows:
            conn.execute(text(
                "INSERT INTO validation_runs (id, pair_name, pair_version, heldout_name, heldout_version, config_hash, "
                "scheduled_date, status, attempts, mlflow_logged, overall, categories, rule_results, baseline_run_id, "
                "acceptance_rate) VALUES (:id, 'p', :v, 'h', '1', 'c', :d, :s, 1, 0, :o, '{}', :r, :b, :a)"),
                dict(id=rid, v=str(rid), d=NIGHTS[rid - 1], s=status, o=_stored(rep.overall),
                     r=json.dumps([x.to_dict() for x in res]), b=baseline, a=rep.overall.acceptance_rate))
    db.upgrade("head")
    with db.engine.connect() as conn:
        got = conn.execute(text("SELECT id, status, acceptance_rate, overall, rule_results FROM validation_runs "
                                "ORDER BY id")).mappings().all()
    assert [r["status"] for r in got] == ["passed", "failed"]
    assert got[1]["acceptance_rate"] == pytest.approx(0.296)  # numbers kept
    assert json.loads(got[1]["overall"]) == json.loads(_stored(stale.overall))
    stored = {(r["rule"], r["scope"]): r for r in json.loads(got[1]["rule_results"])}
    assert stored[("absolute", "overall")]["status"] == "firing" and stored[("absolute", "overall")]["metric"] == "acceptance_rate"
    assert stored[("relative", "overall")]["status"] == "firing"  # against its stored baseline, per token
    assert stored[("speed", "overall")]["status"] == "not_applicable"  # kept as stored


def test_migration_0008_keeps_the_stored_verdicts_of_production_windows_and_engine_checks(tmp_path):
    """Issue 51: the upgrade re-derived a stored production window's ``passed`` into ``failed`` with the nightly
    floor; a window and an engine check are judged by their own rules, so their stored verdicts stay."""
    db = Database(f"sqlite:///{tmp_path / 'h.db'}")
    db.upgrade("0007_per_token_acceptance")
    old = RuleSettings(policy=AcceptancePolicy(estimator="per_token"), speed_enabled=False)
    stale = _night(**STALE)
    results = json.dumps([x.to_dict() for x in rules.evaluate(stale, None, old)])
    with db.engine.begin() as conn:
        for rid, source in ((1, "nightly"), (2, "production"), (3, "engine:llamacpp")):
            conn.execute(text(
                "INSERT INTO validation_runs (id, pair_name, pair_version, heldout_name, heldout_version, config_hash, "
                "scheduled_date, status, attempts, mlflow_logged, overall, categories, rule_results, source, "
                "acceptance_rate) VALUES (:id, 'p', '1', :h, '1', 'c', :d, 'passed', 1, 0, :o, '{}', :r, :src, :a)"),
                dict(id=rid, h=f"h{rid}", d=NIGHTS[0], o=_stored(stale.overall), r=results, src=source,
                     a=stale.overall.acceptance_rate))
    db.upgrade("0008_floor_on_acceptance_rate")
    with db.engine.connect() as conn:
        got = dict(conn.execute(text("SELECT id, status FROM validation_runs")).all())
        kept = conn.execute(text("SELECT rule_results FROM validation_runs WHERE id = 2")).scalar_one()
    assert got == {1: "failed", 2: "passed", 3: "passed"}
    assert json.loads(kept) == json.loads(results)
    db.upgrade("head")
    with db.engine.connect() as conn:
        assert dict(conn.execute(text("SELECT id, status FROM validation_runs")).all()) == {1: "failed", 2: "passed",
                                                                                         3: "passed"}


def test_recommend_warns_when_its_k_is_already_below_the_floor():
    from specdec.validation.candidates import CandidateResult
    from specdec.validation.recommend_cli import floor_warnings

    stale = CandidateResult(spec="derived:bf16", k=4, acceptance_by_k={1: 0.56, 2: 0.43, 3: 0.35, 4: 0.296})
    healthy = CandidateResult(spec="ngram", k=4, acceptance_by_k={1: 0.9, 2: 0.8, 3: 0.7, 4: 0.6})
    assert floor_warnings(SimpleNamespace(candidates=[stale, healthy])) == [
        "derived:bf16: acceptance rate 0.30 at k = 4 is already below floor 0.40 (policy default); at smaller k: "
        "0.56 at k = 1, 0.43 at k = 2, 0.35 at k = 3 (highest k at or above the floor: 2)"]


def test_a_production_window_is_judged_by_the_floor_its_nightly_run_used():
    from monitoring.production.rules import floor_of_nightly

    own = RuleSettings().for_floor(floor_for(AcceptancePolicy(), {FLOOR_TAG: "0.2"}))
    report = make_report(0.23, ci_half=0.015, k=5, num_draft_tokens=4000)
    stored = [r.to_dict() for r in rules.evaluate(report, None, own)]
    s = floor_of_nightly(SimpleNamespace(rule_results=stored), RuleSettings())
    assert (s.policy.threshold, s.policy.floor_source) == (0.2, "pair version tag acceptance_floor")
    assert floor_of_nightly(None, RuleSettings()).policy.threshold == 0.40  # no nightly run: the policy's
