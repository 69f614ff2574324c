"""A measured speedup outside the speed model's band re-times its slow prompts once (issue 30); the
report keeps both the first and the re-timed measurement, and a run inside the band is not re-timed."""

from __future__ import annotations

import math

import pytest

from specdec.validation import ValidationConfig, ValidationRequest, validate
from specdec.validation.prompt_run import PromptRun
from specdec.validation.report import PromptResult
from specdec.validation.runner import band_outliers
from tests.support.models import perturbed_copy, tiny_llama, tiny_tokenizer
from tests.validation.heldouts import toy_heldout


def _run(pid: str, ratio: float) -> PromptRun:
    return PromptRun(row=PromptResult(pid, "a"), target_only_tokens=10, target_only_seconds=1.0,
                     speculative_tokens=10, speculative_seconds=1.0 / ratio)


def test_band_outliers_are_the_prompts_on_the_disagreeing_side():
    runs = [_run("a", 0.5), _run("b", 0.55), _run("c", 0.6), _run("d", 0.9)]
    assert band_outliers(runs, 0.8, (0.8, 1.25)) == ["a", "b", "c"]  # median 0.6 < 0.64: the slow ones
    assert band_outliers(runs, 0.6, (0.8, 1.25)) == []  # inside the band: nothing
    assert band_outliers(runs, 0.4, (0.8, 1.25)) == ["b", "c", "d"]  # median above 1.25 x 0.4 = 0.5: the fast ones
    assert band_outliers(runs, math.nan, (0.8, 1.25)) == []


@pytest.mark.parametrize("band,retimed", [((50.0, 60.0), True), ((0.0, 1e9), False)])
def test_a_run_outside_the_band_is_retimed_once(monkeypatch, band, retimed):
    import specdec.validation.aggregate as aggregate
    import specdec.validation.speed as speed

    # (50, 60): every measurement "disagrees" with the model; (0, 1e9): none does
    monkeypatch.setattr(speed, "TIMING_BAND", band)
    monkeypatch.setattr(aggregate, "timing_band", lambda m, p: speed.timing_band(m, p, band))
    target = tiny_llama(seed=0)
    cfg = ValidationConfig(num_speculative_tokens=3, max_new_tokens=16, bootstrap_resamples=200)
    [r] = validate(ValidationRequest(target, [perturbed_copy(target, scale=0.03)], toy_heldout(6, "ab", (5, 20)), cfg,
                                     tokenizer=tiny_tokenizer()))
    g = r.overall
    if retimed:
        assert g.num_remeasured == g.num_prompts == 6 and not math.isnan(g.speedup_before_retime)
    else:  # (a group that ran under a co-tenant's load may still be re-timed by the runner: not counted here)
        assert math.isnan(g.speedup_before_retime)
    assert g.exactness_mismatches == 0 and not math.isnan(g.speedup)
