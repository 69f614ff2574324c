"""validate on tiny seeded models: exact identities, estimator agreement, skips, exactness audit.

Sizes: 12 prompts x 32 new tokens (384 teacher-forced positions, ~100-150 verification steps for
the perturbed draft). With alpha ~0.6 the 95% CIs are about +-0.05 (alpha_tf) and +-0.1 (alpha_hat),
while the acceptance rate at k=4 is ~0.35: the overlap test below would fail if either estimator
were replaced by the acceptance rate (checked explicitly), so it has real power.
"""

from __future__ import annotations

import copy
import math

import pytest

from specdec import NgramDrafter, SamplingConfig
from tests.validation.heldouts import toy_heldout
from tests.support.models import perturbed_copy, tiny_llama, tiny_tokenizer
from specdec.validation import ValidationConfig, ValidationRequest, validate

N_PROMPTS, NEW_TOKENS, K = 12, 32, 4
PERTURB = 0.03


def _overlap(a: list[float], b: list[float]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0)


@pytest.fixture(scope="module")
def greedy_reports(target):
    """Three drafters on one shared target-only run: exact copy, perturbed copy, n-gram."""
    drafters = [copy.deepcopy(target), perturbed_copy(target, scale=PERTURB), NgramDrafter()]
    cfg = ValidationConfig(num_speculative_tokens=K, max_new_tokens=NEW_TOKENS, bootstrap_resamples=1000)
    return validate(ValidationRequest(target, drafters, toy_heldout(N_PROMPTS, "abc", (5, 30)), cfg, tokenizer=tiny_tokenizer(),
                                      target_ref="tiny"))


def test_draft_equal_to_target_gives_exact_ones(greedy_reports):
    r = greedy_reports[0]
    g = r.overall
    assert r.drafter_kind == "model" and g.num_prompts == N_PROMPTS and g.num_skipped == 2
    assert g.acceptance_rate == 1.0 and g.alpha_hat == 1.0 and g.top1_agreement == 1.0
    assert g.alpha_tf == pytest.approx(1.0, abs=1e-9) and g.total_variation == pytest.approx(0.0, abs=1e-9)
    assert g.kl_divergence == pytest.approx(0.0, abs=1e-6)
    # every drafted token accepted: the CI is the exact binomial one, [0.025 ** (1 / n), 1], never a point
    assert g.acceptance_rate_ci == pytest.approx([0.025 ** (1 / g.num_draft_tokens), 1.0]) and g.alpha_tf_ci == pytest.approx([1.0, 1.0])
    assert all(x == 1.0 for x in g.conditional_per_position_acceptance)
    assert g.exactness_checked == N_PROMPTS and g.exactness_mismatches == 0
    assert sorted(r.categories) == ["a", "b", "c"] and sum(c.num_prompts for c in r.categories.values()) == N_PROMPTS
    # pooled counters agree with the per-prompt rows
    assert g.num_accepted_tokens == sum(p.num_accepted_tokens for p in r.prompts)
    assert g.num_tf_positions == sum(p.num_tf_positions for p in r.prompts if p.status == "ok")


def test_skipped_prompts_carry_their_reason(greedy_reports):
    rows = {p.prompt_id: p for p in greedy_reports[1].prompts}
    assert rows["empty"].status == "skipped" and rows["empty"].skip_reason == "empty prompt"
    assert rows["long"].status == "skipped" and "too long" in rows["long"].skip_reason and "512" in rows["long"].skip_reason
    assert all(rows[f"p{i}"].status == "ok" for i in range(N_PROMPTS))
    assert any("skipped" in n for n in greedy_reports[1].notes)


def test_perturbed_draft_lower_and_estimators_agree(greedy_reports):
    g = greedy_reports[1].overall
    assert 0.3 < g.alpha_tf < 0.95 and 0.3 < g.alpha_hat < 0.95
    assert g.top1_agreement == pytest.approx(g.alpha_tf)  # greedy: p, q one-hot
    assert g.kl_divergence > 0.01 and g.total_variation == pytest.approx(1 - g.alpha_tf)
    assert _overlap(g.alpha_hat_ci, g.alpha_tf_ci), (g.alpha_hat_ci, g.alpha_tf_ci)
    assert not any("disagree" in n for n in greedy_reports[1].notes)
    # power: the acceptance rate (decays with position) is clearly lower, outside both intervals
    assert g.acceptance_rate < g.alpha_tf_ci[0] and g.acceptance_rate < g.alpha_hat_ci[0]
    assert g.alpha_hat_ci[0] <= g.alpha_hat <= g.alpha_hat_ci[1]
    assert 1.0 < g.mean_accepted_length < 1 + K
    assert g.exactness_mismatches == 0  # greedy speculative output equals target-only
    # speed fields are filled and consistent with the Leviathan model
    assert g.cost_ratio > 0 and g.speedup > 0 and 1 <= g.recommended_num_speculative_tokens <= 16
    assert g.predicted_speedup_at_recommended >= g.predicted_speedup


def test_shared_target_only_run(greedy_reports):
    a, b, c = ([p.target_only_seconds for p in r.prompts] for r in greedy_reports)
    assert a == b == c
    assert greedy_reports[0].heldout_version == greedy_reports[1].heldout_version


def test_ngram_scores_only_proposing_positions(greedy_reports):
    r = greedy_reports[2]
    g = r.overall
    assert r.drafter_kind == "ngram" and math.isnan(g.kl_divergence)
    assert 0 < g.tf_coverage < 1 and g.num_tf_positions < greedy_reports[0].overall.num_tf_positions
    assert g.exactness_mismatches == 0 and g.cost_ratio < 0.5
    assert any("n-gram drafter" in n for n in r.notes)


def test_sampling_estimators_agree(target):
    cfg = ValidationConfig(
        num_speculative_tokens=K, max_new_tokens=NEW_TOKENS, sampling=SamplingConfig(temperature=1.0), bootstrap_resamples=1000
    )
    [r] = validate(ValidationRequest(target, [perturbed_copy(target, scale=PERTURB)], toy_heldout(N_PROMPTS, "abc", (5, 30)), cfg,
                                    tokenizer=tiny_tokenizer()))
    g = r.overall
    assert 0.3 < g.alpha_tf < 0.95
    assert _overlap(g.alpha_hat_ci, g.alpha_tf_ci), (g.alpha_hat_ci, g.alpha_tf_ci)
    assert g.acceptance_rate < g.alpha_tf_ci[0]
    assert g.top1_agreement != pytest.approx(g.alpha_tf)  # sampled: alpha_tf is not argmax agreement
    assert g.exactness_checked == 0  # the audit is for greedy only
    assert r.config["temperature"] == 1.0


def test_bad_inputs(target):
    with pytest.raises(ValueError, match="tokenizer"):
        validate(ValidationRequest(target, [NgramDrafter()], toy_heldout(N_PROMPTS, "abc", (5, 30))))
    with pytest.raises(TypeError):
        validate(ValidationRequest(target, ["not a drafter"], toy_heldout(N_PROMPTS, "abc", (5, 30)), tokenizer=tiny_tokenizer()))
    with pytest.raises(ValueError):
        ValidationConfig(num_speculative_tokens=0)
