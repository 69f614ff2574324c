"""The speed model counts the prompts (issue 30): the target's prefill on both sides, and the draft's
own prefill, which only a draft that cannot adopt the target's prompt KV pays (a draft derived from an
earlier target: the demo's stale pair)."""

from __future__ import annotations

import math

import pytest

from specdec.validation.speed import StepCounters, VerifyCost, predicted_speedup

V = VerifyCost.fit({5: 1.8})


def test_prompt_costs_enter_the_one_speed_model():
    steps = StepCounters({5: 20.0}, 28.0)  # 20 steps of 5 drafts, 48 tokens emitted: a stale pair
    bare = predicted_speedup(steps, 0.45, V)
    assert bare == pytest.approx(48 / (20 * (0.45 * 5 + 1.8)))
    both = StepCounters({5: 20.0}, 28.0, prompt_cost=5.0)  # prefill on both sides pulls towards 1x
    assert bare < predicted_speedup(both, 0.45, V) < 1.0
    assert predicted_speedup(both, 0.45, V) == pytest.approx((48 + 5) / (81 + 5))
    stale = StepCounters({5: 20.0}, 28.0, prompt_cost=5.0, draft_prompt_cost=6.0)  # its draft prefills itself
    assert predicted_speedup(stale, 0.45, V) == pytest.approx((48 + 5) / (81 + 5 + 6))
    assert math.isnan(predicted_speedup(StepCounters({}, 0.0, prompt_cost=5.0), 0.45, V))  # no steps


def test_which_drafts_prefill_the_prompt_themselves():
    import copy

    from specdec.core.drafters import ModelDrafter, NgramDrafter
    from specdec.models.derived import DerivedDraftRecipe, derive_draft
    from specdec.validation.prompt_run import DrafterUnderTest
    from specdec.validation.runner import draft_prefill_tokens
    from tests.support.models import tiny_llama

    target = tiny_llama(seed=0)
    bf16 = derive_draft(target, DerivedDraftRecipe.from_spec("derived:bf16"))
    other_target = copy.deepcopy(target)  # e.g. the fine-tuned target: the old draft is not its copy

    def under_test(obj, model):
        return DrafterUnderTest(obj, model, "x", None, None, None)

    n = ModelDrafter.ADOPT_PREFIX_MIN_TOKENS + 10
    assert draft_prefill_tokens(under_test(ModelDrafter(bf16), bf16), target, n) == 0  # adopts the target's KV
    assert draft_prefill_tokens(under_test(ModelDrafter(bf16), bf16), other_target, n) == n  # stale: its own prefill
    assert draft_prefill_tokens(under_test(NgramDrafter(), None), target, n) == 0
    assert math.isclose(draft_prefill_tokens(under_test(bf16, bf16), target, n), n)  # a bare module: no adoption


def test_prefill_cost_is_a_line_through_two_measured_lengths():
    """Prefill per token falls with the length (wider GEMMs), so a cost measured on the shortest
    prompt alone over-charges the long ones and pulls every prediction towards 1x."""
    from specdec.validation.timing import PrefillCost

    line = PrefillCost.through([(40, 1.9), (256, 7.3)])  # one-token passes, as measured on SmolLM2 (2 threads)
    assert line.per_token == pytest.approx(5.4 / 216) and line(40) == pytest.approx(1.9)
    assert line(1000) == pytest.approx(1.9 + 960 * 5.4 / 216)  # 25.9, where 1.9 / 40 per token gave 47.5
    assert line(0) == 0.0  # a draft that adopts the target's KV prefills nothing
    assert PrefillCost.through([(40, 2.0)])(1000) == pytest.approx(50.0)  # one length: through the origin
    assert PrefillCost.through([(40, 2.0), (256, 1.5)]).per_token == 0.0  # a noisy slope never goes negative
