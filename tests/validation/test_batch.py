"""Batched validation (``ValidationConfig.batch_size`` > 1, ``--batch-size``) on tiny seeded models.

Greedy batched rows equal their B = 1 outputs (tested in ``tests/core/test_batch.py``), so with B = 3
every per-prompt counter, α_tf and the exactness audit must equal the B = 1 run's exactly. The
held-out set mixes prompt lengths (3..60 characters, so rows are left-padded), has one prompt
whose output ends at EOS after one token (rows finish at different steps), one empty and one
over-long prompt (filtered before grouping), and 7 runnable prompts: groups of 3, 3 and 1 (the
last takes the B = 1 path inside the batched loop). A shifted or swapped row assignment changes
the counters of at least one prompt, so the equality checks have power.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specdec import NgramDrafter, SamplingConfig, SpeculativeConfig
from specdec.validation.report import ValidationReport
from tests.validation.heldouts import toy_heldout
from tests.support.models import perturbed_copy, save_tiny_checkpoint, tiny_llama, tiny_tokenizer
from specdec.validation import ValidationConfig, ValidationRequest, validate
from specdec.validation.prompt_run import DrafterUnderTest
from specdec.validation.runner import DecodeSetup, left_pad, run_prompts, token_shares
from specdec.validation.timing import PassTimer

K, NEW_TOKENS, B = 3, 20, 3
COUNTERS = ("status", "skip_reason", "prompt_tokens", "new_tokens", "target_only_tokens", "num_drafts",
            "num_draft_tokens", "num_accepted_tokens", "num_tf_positions", "alpha_tf", "top1_agreement",
            "exact_match", "first_divergence")  # fmt: skip


def _ok_groups(report) -> list[list]:
    ok = [p for p in report.prompts if p.status == "ok"]
    return [ok[i : i + B] for i in range(0, len(ok), B)]


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0)


@pytest.fixture(scope="module")
def reports(target):
    """B = 1 and B = 3 on the same prompts, a model drafter and the n-gram drafter each."""
    drafters = [perturbed_copy(target, scale=0.03), NgramDrafter()]
    out = {}
    for b in (1, B):
        cfg = ValidationConfig(num_speculative_tokens=K, max_new_tokens=NEW_TOKENS, batch_size=b, bootstrap_resamples=200)
        out[b] = validate(ValidationRequest(target, drafters, toy_heldout(7, "ab", (3, 60), empty_at=2), cfg,
                                            tokenizer=tiny_tokenizer(), target_ref="tiny"))
    return out


def test_greedy_batched_rows_equal_unbatched(reports):
    for one, many in zip(reports[1], reports[B]):
        assert [p.prompt_id for p in many.prompts] == [p.prompt_id for p in one.prompts]  # held-out order
        for a, b in zip(one.prompts, many.prompts):
            assert [getattr(b, f) for f in COUNTERS] == [getattr(a, f) for f in COUNTERS], a.prompt_id
        assert many.overall.num_prompts == 7 and many.overall.num_skipped == 2
        assert many.overall.exactness_checked == 7 and many.overall.exactness_mismatches == 0
        assert all(p.exact_match for p in many.prompts if p.status == "ok")
        g1, gb = one.overall, many.overall
        assert (gb.num_drafts, gb.num_draft_tokens, gb.num_accepted_tokens, gb.accepted_per_position) == (
            g1.num_drafts, g1.num_draft_tokens, g1.num_accepted_tokens, g1.accepted_per_position
        )  # fmt: skip
        assert gb.alpha_tf == g1.alpha_tf and gb.alpha_hat == g1.alpha_hat
    # the set really exercises mixed lengths and rows finishing at different steps
    rows = [p for p in reports[B][0].prompts if p.status == "ok"]
    assert len({p.prompt_tokens for p in rows}) == len(rows) and len({p.new_tokens for p in rows}) > 1
    assert reports[B][0].overall.num_drafts > 20  # the model drafter really drafted


def test_config_records_batch_size(reports):
    assert all(r.config["batch_size"] == B for r in reports[B])
    assert all(r.config["batch_size"] == 1 for r in reports[1])


def test_seconds_are_token_shares_of_the_batch(reports):
    for r in reports[B]:
        g = r.overall
        assert g.target_only_seconds > 0 and g.speculative_seconds > 0 and g.speedup > 0
        ok = [p for p in r.prompts if p.status == "ok"]
        assert sum(p.target_only_seconds for p in ok) == pytest.approx(g.target_only_seconds, rel=1e-12)
        assert sum(p.speculative_seconds for p in ok) == pytest.approx(g.speculative_seconds, rel=1e-12)
        for group in _ok_groups(r):  # within a batched call: seconds per emitted token are shared
            spec = [p.speculative_seconds / p.new_tokens for p in group]
            ref = [p.target_only_seconds / p.target_only_tokens for p in group]
            assert spec == pytest.approx([spec[0]] * len(group), rel=1e-9)
            assert ref == pytest.approx([ref[0]] * len(group), rel=1e-9)
        assert g.cost_ratio > 0 and g.verify_cost_ratio > 0 and g.target_step_seconds > 0
    # the target-only batch is shared by every drafter
    assert [p.target_only_seconds for p in reports[B][0].prompts] == [p.target_only_seconds for p in reports[B][1].prompts]


def test_pass_timers_exclude_the_batched_prefill(target):
    """Per group: split pass counts add up to the batched decode passes (prefill excluded)."""
    tok = tiny_tokenizer()
    draft = perturbed_copy(target, scale=0.03)
    cfg = ValidationConfig(num_speculative_tokens=K, max_new_tokens=NEW_TOKENS, batch_size=4)
    prompts = [p for p in toy_heldout(7, "ab", (3, 60), empty_at=2).prompts if p.id.startswith("p")][:4]
    target_timer, d = PassTimer(target), DrafterUnderTest(draft, draft, "model", None, None, PassTimer(draft))
    with target_timer, d.timer:
        setup = DecodeSetup(target, tok, [d], cfg, eos=2, ctx_limit=512, target_timer=target_timer)
        runs = [r[0] for _, r in run_prompts(prompts, setup)]
    # one batched pass per emitted token of the longest row; the first is the prefill
    assert sum(r.target_steps for r in runs) == pytest.approx(max(r.target_only_tokens for r in runs) - 1)
    # the row that finishes last took part in every batched pass
    assert sum(r.target_passes for r in runs) == pytest.approx(max(r.stats.target_forward_passes for r in runs) - 1)
    assert sum(r.draft_passes for r in runs) == pytest.approx(max(r.stats.draft_forward_passes for r in runs) - 1)
    assert all(r.target_pass_s > 0 and r.draft_pass_s > 0 and r.target_step_s > 0 for r in runs)
    # the rows' DecodingStats seconds are shares of the batch's, not each the whole batch
    total = sum(r.stats.target_seconds + r.stats.draft_seconds for r in runs)
    assert 0 < total <= sum(r.speculative_seconds for r in runs)


def test_sampling_batched_is_reproducible(target):
    cfg = ValidationConfig(
        num_speculative_tokens=K, max_new_tokens=12, sampling=SamplingConfig(temperature=1.0), batch_size=2,
        bootstrap_resamples=50, warmup=False,
    )  # fmt: skip
    draft = perturbed_copy(target, scale=0.03)
    a, b = (validate(ValidationRequest(target, [draft], toy_heldout(7, "ab", (3, 60), empty_at=2), cfg,
                                       tokenizer=tiny_tokenizer()))[0] for _ in range(2))
    key = ("new_tokens", "num_drafts", "num_draft_tokens", "num_accepted_tokens", "alpha_tf")
    assert [[getattr(p, f) for f in key] for p in a.prompts] == [[getattr(p, f) for f in key] for p in b.prompts]
    assert a.overall.num_prompts == 7 and a.overall.exactness_checked == 0  # audit is greedy only
    assert a.overall.num_draft_tokens > 0


def test_bad_batch_size():
    for bad in (0, -1):
        with pytest.raises(ValueError, match="batch_size"):
            ValidationConfig(batch_size=bad)
    for bad in (True, 2.0, "2"):
        with pytest.raises(TypeError, match="batch_size"):
            ValidationConfig(batch_size=bad)


def test_left_pad_and_token_shares():
    tok = tiny_tokenizer()
    ids, mask = left_pad([[5, 6, 7], [8]], tok.pad_token_id, "cpu")
    assert ids.tolist() == [[5, 6, 7], [3, 3, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert token_shares([3, 1]) == [0.75, 0.25] and token_shares([0, 0]) == [0.5, 0.5]
    with pytest.raises(ValueError):
        left_pad([[1], []], 0, "cpu")


def test_flow_settings_pass_batch_size(monkeypatch):
    from flows.deploy import deployment_parameters
    from flows.loading import build_validation_config
    from flows.settings import NightlySettings

    monkeypatch.setenv("SPECDEC_NIGHTLY_BATCH_SIZE", "4")
    s = NightlySettings()
    assert s.batch_size == 4 and deployment_parameters(s)["batch_size"] == 4
    monkeypatch.setenv("SPECDEC_NIGHTLY_BATCH_SIZE", "0")
    with pytest.raises(ValueError):
        NightlySettings()
    monkeypatch.delenv("SPECDEC_NIGHTLY_BATCH_SIZE")
    assert NightlySettings().batch_size == 1
    cfg = build_validation_config(SpeculativeConfig(3, max_new_tokens=8), limit=None, batch_size=4)
    assert cfg.batch_size == 4 and cfg.to_dict()["batch_size"] == 4 and cfg.num_speculative_tokens == 3


runner = CliRunner()


def test_cli_batch_size_end_to_end(tmp_path):
    from specdec.cli import app

    target = save_tiny_checkpoint(tmp_path / "target", seed=0)
    draft = save_tiny_checkpoint(tmp_path / "draft", seed=0, perturb=0.03)
    held = tmp_path / "mine.jsonl"
    rows = [{"id": f"q{i}", "category": ["chat", "code"][i % 2], "prompt": "tell me " + "more " * i} for i in range(5)]
    rows.insert(1, {"id": "too-long", "category": "chat", "text": "y" * 700})
    held.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    base = ["validate", "--target", str(target), "--draft", f"model:{draft}", "--heldout", str(held),
            "--max-new-tokens", "10", "-k", "3", "--device", "cpu", "--bootstrap-resamples", "100"]  # fmt: skip
    res = runner.invoke(app, [*base, "--batch-size", "2", "--out", str(tmp_path / "out")], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "batch size 2" in res.output
    report = ValidationReport.read(tmp_path / "out")
    assert report.config["batch_size"] == 2
    assert report.overall.num_prompts == 5 and report.overall.num_skipped == 1
    assert report.overall.exactness_checked == 5 and report.overall.exactness_mismatches == 0
    assert [p.prompt_id for p in report.prompts] == [r["id"] for r in rows]
    bad = runner.invoke(app, [*base, "--batch-size", "0", "--out", str(tmp_path / "bad")], env={"COLUMNS": "200"})
    assert bad.exit_code != 0 and not (tmp_path / "bad" / "report.json").exists()


def test_nightly_cli_and_flow_reject_bad_batch_size():
    from flows.cli import nightly_app
    from flows.nightly import nightly_validation_flow

    res = runner.invoke(nightly_app, ["run", "--batch-size", "0"])
    assert res.exit_code == 2 and "batch-size" in res.output
    with pytest.raises(ValueError, match="batch_size"):
        nightly_validation_flow.fn(batch_size=0)
