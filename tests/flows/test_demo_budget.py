"""The demo's held-out size follows the measured one-token pass (issue 30): it fits the 10-minute budget
on a slow CPU by shrinking, and keeps the full size on a fast one."""

from __future__ import annotations

import pytest

from flows import demo_budget as B


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


def test_one_token_pass_is_measured_on_the_model(tmp_path):
    from specdec.models import load_causal_lm
    from tests.support.models import save_tiny_checkpoint

    model = load_causal_lm(str(save_tiny_checkpoint(tmp_path / "tiny")), dtype="float32", device="cpu").model
    t1 = B.one_token_pass_seconds(model, reps=3)
    assert 0 < t1 < 1.0
