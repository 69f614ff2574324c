"""The night's wall-time model (specdec.validation.speed.night_seconds): what each input does to it."""

from __future__ import annotations

import pytest

from specdec.validation.speed import NightPlan, NightRates, night_seconds

CORE = NightRates(continuation_seconds_per_token=0.05, replay_seconds_per_prompt=0.4, setup_seconds=10.0,
                  pool_seconds=1.0)
ENGINE = NightRates(continuation_seconds_per_token=0.01, replay_seconds_per_prompt=0.4, engine_streams=2,
                    setup_seconds=5.0, pool_seconds=1.0)


def test_one_worker_is_the_sum_of_its_prompts():
    assert night_seconds(NightPlan(48, 64), CORE) == pytest.approx(10 + 48 * (64 * 0.05 + 0.4) + 1)
    assert night_seconds(NightPlan(48, 64, pairs=3), CORE) == pytest.approx(10 + 3 * 48 * 3.6 + 1)


def test_workers_split_prompts_and_an_engine_queues_beyond_its_streams():
    one, two = night_seconds(NightPlan(48, 64), ENGINE), night_seconds(NightPlan(48, 64, workers=2), ENGINE)
    assert two - 6 == pytest.approx((one - 6) / 2)
    four = night_seconds(NightPlan(48, 64, workers=4), ENGINE)  # 4 workers on 2 streams: continuations queue
    assert four == pytest.approx(6 + 12 * (64 * 0.01 * 2 + 0.4))
    core_four = night_seconds(NightPlan(48, 64, workers=4), CORE)  # the core: every worker is its own target
    assert core_four == pytest.approx(11 + 12 * 3.6)
    assert night_seconds(NightPlan(49, 64, workers=2), ENGINE) == pytest.approx(6 + 25 * (0.64 + 0.4))


def test_cached_continuations_cost_only_the_replay():
    assert night_seconds(NightPlan(48, 64, uncached=0.0), CORE) == pytest.approx(11 + 48 * 0.4)


def test_bad_plans_are_refused():
    with pytest.raises(ValueError):
        night_seconds(NightPlan(48, 64, workers=0), CORE)
    with pytest.raises(ValueError):
        night_seconds(NightPlan(48, 64), NightRates(-1.0, 0.1))
    with pytest.raises(ValueError):
        night_seconds(NightPlan(48, 64), NightRates(0.1, 0.1, engine_streams=0))
