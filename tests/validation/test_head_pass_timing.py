"""An EAGLE-3 head's cost ratio c is per head pass, as for a draft model (not per drafting step).

A head drafts k tokens in k passes (one catch-up pass over the newly verified positions, then one per
further draft); the speed model charges ``c * proposed`` per step, so c must be one pass's cost. The
head's first pass of a generation (the catch-up over the whole prompt) is its prefill and is
excluded, as the target's prefill is.
"""

from __future__ import annotations

from specdec.core.head_drafter import Eagle3Drafter
from specdec.validation import ValidationConfig
from specdec.validation.prompt_run import DrafterUnderTest
from specdec.validation.runner import DecodeSetup, run_prompts
from specdec.validation.timing import PassTimer
from tests.support.eagle3 import EOS, cached_pair
from tests.support.models import tiny_tokenizer
from tests.validation.heldouts import toy_heldout

K = 3


def test_head_draft_passes_are_head_passes_without_the_prompt_catch_up():
    target, head = cached_pair(0)
    drafter = Eagle3Drafter(head, [1, 2, 4])
    cfg = ValidationConfig(num_speculative_tokens=K, max_new_tokens=24)
    prompts = [p for p in toy_heldout(3, "ab", (3, 40)).prompts if p.id.startswith("p")]
    target_timer, d = PassTimer(target), DrafterUnderTest(drafter, None, "eagle3", None, None, PassTimer(head))
    with target_timer, d.timer:
        setup = DecodeSetup(target, tiny_tokenizer(), [d], cfg, eos=EOS, ctx_limit=512, target_timer=target_timer)
        runs = [r[0] for _, r in run_prompts(prompts, setup)]
    assert len(runs) == 3
    for r in runs:
        assert r.stats.draft_forward_passes >= 2  # the prompt catch-up and at least one drafting pass
        assert r.draft_passes == r.stats.draft_forward_passes - 1
        assert r.draft_pass_s > 0
    # k head passes per drafting step, one target pass: counting one draft pass per target pass (the
    # n-gram rule) would overstate c about k-fold
    assert sum(r.draft_passes for r in runs) > 1.5 * sum(r.target_passes for r in runs)


def test_validate_times_the_heads_own_module():
    """``validate`` hooks the head (not nothing, as for an n-gram drafter), so the run above applies."""
    from specdec import NgramDrafter
    from specdec.validation.api import _drafters_under_test

    target, head = cached_pair(0)
    head_ctx, ngram_ctx = _drafters_under_test([Eagle3Drafter(head, [1, 2, 4]), NgramDrafter()], target)
    assert head_ctx.model is None and head_ctx.timer.model is head
    assert ngram_ctx.timer.model is None
