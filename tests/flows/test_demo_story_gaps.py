"""When the demo's story does not play out, its last line names what did not happen and why."""

from __future__ import annotations

from types import SimpleNamespace

from flows import demo
from flows.tasks import NightlyResult


def _night(status: str, transition: str | None) -> NightlyResult:
    return NightlyResult("p", "challenger", "2", status, alert_transition=transition)


def test_an_overloaded_night_3_is_named_with_its_reason(monkeypatch):
    speeds = {"inconclusive": {"speed_rule": "inconclusive", "speed_reason": "machine overloaded"}}
    monkeypatch.setattr(demo, "_night_speed", lambda res, _s: speeds.get(res.status, {"speed_rule": "ok",
                                                                                        "speed_reason": None}))
    fake = SimpleNamespace(settings=SimpleNamespace(monitoring=None), floors={"nightly_2": {"fired": ["absolute"], "status": "firing"}})
    gaps = demo._story_gaps(fake, _night("failed", "fire"), _night("inconclusive", None), promoted=True)
    assert gaps == ["night 3 did not resolve (status inconclusive, speed inconclusive (machine overloaded): "
                    "rerun on an idle machine)"]
    gaps = demo._story_gaps(fake, _night("passed", None), _night("passed", "resolve"), promoted=False)
    assert gaps == ["night 2 did not fire (status passed)", "the re-derived pair was not promoted"]


def test_a_night_2_that_fires_without_the_floor_is_named(monkeypatch):
    """Issue 41: night 2 must fire on the floor (the acceptance rate at k below 40%), not only on the relative rule."""
    monkeypatch.setattr(demo, "_night_speed", lambda res, _s: {"speed_rule": "ok", "speed_reason": None})
    judged = {"metric": "acceptance_rate", "value": 0.52, "threshold": 0.4, "status": "ok", "fired": ["relative", "speed"]}
    fake = SimpleNamespace(settings=SimpleNamespace(monitoring=None), floors={"nightly_2": judged})
    gaps = demo._story_gaps(fake, _night("failed", "fire"), _night("passed", "resolve"), promoted=True)
    assert gaps == ["night 2 fired without the floor (acceptance_rate 0.52 vs 0.4: ok; fired: relative, speed)"]


def test_a_floor_that_fired_only_in_a_category_is_named(monkeypatch):
    """This session's idle demo: the overall rate 0.344 with its CI reaching 0.420 (inconclusive), the floor firing
    only for two categories. The story's floor is the overall one, so the demo names the gap."""
    monkeypatch.setattr(demo, "_night_speed", lambda res, _s: {"speed_rule": "firing", "speed_reason": None})
    judged = {"metric": "acceptance_rate", "value": 0.344, "threshold": 0.4, "status": "insufficient_evidence",
              "fired": ["absolute", "relative", "speed"]}
    fake = SimpleNamespace(settings=SimpleNamespace(monitoring=None), floors={"nightly_2": judged})
    gaps = demo._story_gaps(fake, _night("failed", "fire"), _night("passed", "resolve"), promoted=True)
    assert gaps == ["night 2 fired without the floor (acceptance_rate 0.344 vs 0.4: insufficient_evidence; "
                    "fired: absolute, relative, speed)"]
