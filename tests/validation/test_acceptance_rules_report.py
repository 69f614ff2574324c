"""Both acceptance rules in a validation report, from the one teacher-forced pass (docs/metrics.md "Two
acceptance rules"): at T = 0 they coincide with greedy (top-1) agreement; at T > 0 the exact rule is α_tf and
the argmax rule is not; the report names the served rule; per category and per draft position; JSON round trip."""

from __future__ import annotations

import math

import pytest

from specdec import SamplingConfig
from specdec.validation import ValidationConfig, ValidationRequest, validate
from specdec.validation.report import ValidationReport
from tests.support.models import perturbed_copy, tiny_llama, tiny_tokenizer
from tests.validation.heldouts import toy_heldout

K, NEW_TOKENS = 3, 16


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0)


def _report(target, sampling: SamplingConfig, draft_sampling: str = "sampled") -> ValidationReport:
    from specdec.core.config import SpeculativeConfig

    spec = SpeculativeConfig(K, sampling, NEW_TOKENS, draft_sampling)
    cfg = ValidationConfig(spec, bootstrap_resamples=300)
    [r] = validate(ValidationRequest(target, [perturbed_copy(target, scale=0.03)], toy_heldout(6, "ab", (5, 30)), cfg,
                                     tokenizer=tiny_tokenizer()))
    return r


def test_greedy_both_rules_are_greedy_agreement(target):
    r = _report(target, SamplingConfig())
    for g in [r.overall, *r.categories.values()]:
        assert 0.2 < g.exact_rule_acceptance < 0.95
        assert g.exact_rule_acceptance == g.argmax_rule_acceptance == pytest.approx(g.top1_agreement, abs=1e-12)
        assert g.exact_rule_per_position == g.argmax_rule_per_position and len(g.exact_rule_per_position) == K
        assert g.exact_rule_acceptance_ci == g.argmax_rule_acceptance_ci
    assert r.acceptance_rule == "exact"


@pytest.mark.parametrize("draft_sampling, served", [("sampled", "exact"), ("argmax", "argmax")])
def test_sampled_rules_differ_and_the_report_names_the_served_one(target, draft_sampling, served, tmp_path):
    r = _report(target, SamplingConfig(temperature=0.7), draft_sampling)
    g = r.overall
    assert r.acceptance_rule == served
    assert g.exact_rule_acceptance == pytest.approx(g.alpha_tf)
    assert abs(g.exact_rule_acceptance - g.argmax_rule_acceptance) > 0.05
    for rule in ("exact", "argmax"):
        per = getattr(g, f"{rule}_rule_per_position")
        lo, hi = getattr(g, f"{rule}_rule_acceptance_ci")
        assert per[0] == pytest.approx(getattr(g, f"{rule}_rule_acceptance"))  # position 1: every window
        assert per[0] > per[1] > per[2] > 0  # a chain only loses acceptance
        assert lo <= getattr(g, f"{rule}_rule_acceptance") <= hi and hi - lo < 0.5
    assert {c: len(v.argmax_rule_per_position) for c, v in r.categories.items()} == {"a": K, "b": K}
    back = ValidationReport.read(r.write(tmp_path))
    assert back.acceptance_rule == served
    assert back.overall.argmax_rule_per_position == pytest.approx(g.argmax_rule_per_position)
    assert back.categories["a"].exact_rule_acceptance == pytest.approx(r.categories["a"].exact_rule_acceptance)
    assert not math.isnan(back.overall.exact_rule_acceptance_ci[0])
