"""The acceptance canary (docs/metrics.md "The canary"): draft = target at the pair's temperature. The core passes
under both rules at T = 0 and T = 0.7; a planted drafter that samples x from its soft q but reports q one-hot (the
fallback engines shipped without saying so) fails it; ``specdec validate --canary`` writes canary.json and exits
1 on a failure."""

from __future__ import annotations

import copy
import json

import pytest
from typer.testing import CliRunner

from specdec import SamplingConfig
from specdec.cli import app
from specdec.core.config import SpeculativeConfig
from specdec.core.drafters import ModelDrafter
from specdec.kinds import ResolvedDrafter
from specdec.validation import ValidationConfig, ValidationRequest, validate
from specdec.validation.canary import canary_verdict
from tests.support.models import save_tiny_checkpoint, tiny_llama, tiny_tokenizer
from tests.validation.heldouts import toy_heldout

K, NEW_TOKENS, N_PROMPTS = 3, 24, 8
T07 = SamplingConfig(temperature=0.7)


class OneHotQDrafter(ModelDrafter):
    """Planted bug: drafts x ~ q (the sampled rule, whatever the served one) and reports q one-hot, so the
    verifier accepts x with p(x) instead of min(1, p(x)/q(x))."""

    def propose(self, contexts, limits, sampling, vocab_size, generator=None, stop_token_ids=frozenset()):
        soft = SamplingConfig(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
        proposal = super().propose(contexts, limits, soft, vocab_size, generator, stop_token_ids)
        proposal.q = None
        return proposal


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0)


def _canary(target, sampling: SamplingConfig, draft_sampling: str, drafter=None):
    cfg = ValidationConfig(SpeculativeConfig(K, sampling, NEW_TOKENS, draft_sampling), bootstrap_resamples=500)
    draft = drafter if drafter is not None else copy.deepcopy(target)
    [r] = validate(ValidationRequest(target, [ResolvedDrafter(draft, "model", ref="canary")],
                                     toy_heldout(N_PROMPTS, "ab", (5, 30)), cfg, tokenizer=tiny_tokenizer()))
    return r, canary_verdict(r)


@pytest.mark.parametrize("sampling", [SamplingConfig(), T07], ids=["T0", "T0.7"])
@pytest.mark.parametrize("draft_sampling", ["sampled", "argmax"])
def test_the_core_passes_the_canary(target, sampling, draft_sampling):
    report, verdict = _canary(target, sampling, draft_sampling)
    assert verdict.passed, [c.line() for c in verdict.checks]
    g = report.overall
    assert verdict.acceptance_rule == {"sampled": "exact", "argmax": "argmax"}[draft_sampling]
    assert g.exact_rule_acceptance == pytest.approx(1.0, abs=1e-6)
    assert not any("disagree" in n for n in report.notes)  # α̂ is compared with the served rule's teacher-forced α
    if draft_sampling == "sampled" or sampling.is_greedy:
        assert g.num_accepted_tokens == g.num_draft_tokens  # every draft accepted
    else:  # E[p(argmax p)] < 1 at T 0.7: the decoded α̂ is clearly below 1 and matches it
        assert g.argmax_rule_acceptance < 0.9 and g.alpha_hat < 0.95


@pytest.mark.parametrize("draft_sampling", ["sampled", "argmax"])
def test_a_planted_one_hot_q_fails_the_canary(target, draft_sampling):
    report, verdict = _canary(target, T07, draft_sampling, drafter=OneHotQDrafter(copy.deepcopy(target)))
    assert not verdict.passed
    tf, decoded = verdict.checks
    assert tf.passed  # the teacher-forced pass reads the draft model itself: q = p there
    assert not decoded.passed and decoded.measured < decoded.expected
    assert "canary FAILED" in verdict.finding() and report.acceptance_rule in verdict.finding()


def test_cli_canary_writes_its_verdict_and_refuses_a_draft(tmp_path):
    target = save_tiny_checkpoint(tmp_path / "target", seed=0)
    out = tmp_path / "out"
    args = ["validate", "--target", str(target), "--heldout", "spec_bench", "--limit", "6", "--max-new-tokens", "8",
            "-k", "3", "--temperature", "0.7", "--device", "cpu", "--bootstrap-resamples", "200"]
    res = CliRunner().invoke(app, [*args, "--canary", "--out", str(out)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    verdict = json.loads((out / "canary.json").read_text())
    assert verdict["passed"] and verdict["acceptance_rule"] == "exact" and len(verdict["checks"]) == 2
    assert "PASS decoded acceptance" in res.output and "acceptance rules (teacher-forced; served: exact)" in res.output
    both = CliRunner().invoke(app, [*args, "--canary", "--draft", "ngram", "--out", str(tmp_path / "o2")])
    assert both.exit_code == 1 and "give no --draft" in both.output
    neither = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "o3")])
    assert neither.exit_code == 1 and "give --draft" in neither.output
