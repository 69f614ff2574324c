"""The demo's held-out size follows the measured one-token pass (issue 30): it fits the 10-minute budget
on a slow CPU by shrinking, and keeps the full size on a fast one."""

from __future__ import annotations

import pytest

from flows import demo_budget as B
from tests.support.gate import policy_gate
from tests.support.store import model_store


def test_size_shrinks_with_the_one_token_pass_and_fits_the_budget():
    fast, slow = B.choose(0.028), B.choose(0.056)  # the Xeon's and the EPYC's fp32 one-token pass
    assert (fast.per_category, fast.max_new_tokens) == (2, 48) and fast.fits
    assert slow.fits and slow.predicted_s <= B.MARGIN * B.BUDGET_S
    assert slow.per_category * slow.max_new_tokens < 2 * 48
    # the prediction grows with every input, so a smaller size is always cheaper
    assert B.predicted_seconds(0.056, 2, 48) > B.predicted_seconds(0.056, 2, 40) > B.predicted_seconds(0.056, 1, 48)
    hopeless = B.choose(1.0)
    assert not hopeless.fits and (hopeless.per_category, hopeless.max_new_tokens) == B.CHOICES[-1]
    with pytest.raises(ValueError, match="> 0"):
        B.choose(0.0)


def test_the_size_gives_the_promotion_gate_its_evidence():
    """On a CPU with a 99 ms pass the sizes within the margin are too small for the gate (1 x 40 tokens
    drafted 175 tokens at 84 ms, the gate wants 200, and the demo stopped before promoting). With the
    gate's floor the demo takes the cheapest size that has it, as long as it fits the whole budget."""
    floor = policy_gate().min_draft_tokens
    bare, gated = B.choose(0.099), B.choose(0.099, floor)
    assert (bare.per_category, bare.max_new_tokens) == (1, 32) and not B.has_evidence(1, 40, floor)
    assert (gated.per_category, gated.max_new_tokens) == (1, 48) and B.has_evidence(1, 48, floor)
    assert gated.fits and B.MARGIN * B.BUDGET_S < gated.predicted_s <= B.BUDGET_S
    fast = B.choose(0.028, floor)
    assert (fast.per_category, fast.max_new_tokens) == (2, 48)  # a fast CPU keeps the full size


def test_one_token_pass_is_measured_on_the_model(tmp_path):
    from specdec.models import load_causal_lm
    from tests.support.models import save_tiny_checkpoint

    model = load_causal_lm(str(save_tiny_checkpoint(tmp_path / "tiny")), dtype="float32", device="cpu",
                           store=model_store()).model
    t1 = B.one_token_pass_seconds(model, reps=3)
    assert 0 < t1 < 1.0


def test_a_busy_machine_is_announced_with_how_much_longer_the_demo_takes():
    """Issue 41: the demo says at its start when the machine is busy and by how much that lengthens it."""
    assert B.busy_factor(0.0, 2) == 1.0 and B.busy_factor(0.3, 2) == 1.15
    assert B.busy_factor(2.5, 2) == 2.25
    assert B.busy_note(0.3, 2, 540.0) is None  # idle enough: nothing to say
    assert B.busy_note(2.5, 2, 540.0) == (
        "the machine is busy: load 2.5 on 2 CPUs from other work; expect the demo to take about 2.2x as long as "
        "on an idle machine (~20 min instead of ~9)")
    with pytest.raises(ValueError, match="cpus"):
        B.busy_factor(1.0, 0)
