"""Temperature > 0 with a deterministic proposal (vLLM's argmax rule; the n-gram drafter): replay
along the decoded output gives the decoded counters exactly.

Under the argmax rule the draft ``x = argmax q`` is accepted with probability ``p(x)`` and a
rejection draws from ``p`` without ``x``, so the emitted token equals ``x`` exactly when the draft
was accepted: the counters of a sampled run are those of greedy replay along its own output
(``specdec.validation.replay_run`` docstring). Checked for every prompt case of ``test_replay.py``,
k = 1..8, two seeds, T = 0.7 and top-p 0.9, on tiny fp32 pairs. Under the sampled rule the same
identity must fail (the accepted token need not be the draft's argmax): the test could fail.
"""

from __future__ import annotations

import pytest
import torch

from specdec import SamplingConfig, SpeculativeConfig, speculative_generate
from specdec.core.drafters import NgramDrafter
from specdec.validation.config import ValidationConfig
from specdec.validation.replay import COMPARED_COUNTERS, counters_equal, draft_trace, replay_counters
from specdec.validation.replay_run import replays_exactly
from tests.validation.test_replay import _cases, drafters, target  # noqa: F401 (fixtures)

SAMPLING = SamplingConfig(temperature=0.7, top_p=0.9)
KS = range(1, 9)


def _mismatches(target, drafter, rule: str, seeds=(0, 1)) -> tuple[list[str], int]:
    bad, runs = [], 0
    for seed in seeds:
        for ids, max_new, stop in _cases(target):
            for k in KS:
                out = speculative_generate(
                    target, drafter, torch.tensor([ids]), num_speculative_tokens=k, max_new_tokens=max_new,
                    sampling=SAMPLING, eos_token_id=sorted(stop) or None, draft_sampling=rule,
                    generator=torch.Generator().manual_seed(1000 * seed + k))
                trace = draft_trace(drafter, ids, out.token_ids, 103, kmax=8, stop_token_ids=stop, exact=True)
                got = replay_counters(trace, out.token_ids, num_speculative_tokens=k, max_new_tokens=max_new,
                                      stop_token_ids=stop)
                runs += 1
                if not counters_equal(got, out.stats, exact=True):
                    bad.append(f"seed={seed} len={len(ids)} k={k}: " + str(
                        {c: (getattr(got, c), getattr(out.stats, c)) for c in COMPARED_COUNTERS
                         if getattr(got, c) != getattr(out.stats, c)}))
    return bad, runs


@pytest.mark.parametrize("name", ["close", "far"])
def test_argmax_rule_replays_exactly_along_the_sampled_output(target, drafters, name):
    bad, runs = _mismatches(target, drafters[name], "argmax")
    assert runs >= 2 * 8 * 5
    assert not bad, "\n".join(bad[:10])


def test_ngram_drafts_replay_exactly_at_temperature(target):
    bad, _ = _mismatches(target, NgramDrafter(), "sampled")
    assert not bad, "\n".join(bad[:10])


def test_sampled_rule_does_not_replay_exactly(target, drafters):
    bad, runs = _mismatches(target, drafters["far"], "sampled", seeds=(0,))
    assert bad, f"the sampled rule matched replay in all {runs} runs: the identity above would not be tested"


def test_which_drafts_replay_exactly(drafters):
    def config(**rule) -> ValidationConfig:
        return ValidationConfig(SpeculativeConfig(4, SAMPLING, 16, **rule))

    greedy, hot, argmax = ValidationConfig(), config(), config(draft_sampling="argmax")
    tau = config(draft_sampling="argmax", assistant_confidence_threshold=0.5)
    model = drafters["close"]
    assert replays_exactly(model, greedy) and replays_exactly(model, argmax)
    assert not replays_exactly(model, hot) and not replays_exactly(model, tau)
    assert replays_exactly(NgramDrafter(), hot) and replays_exactly(NgramDrafter(), tau)  # a lookup has no confidence


def test_report_counts_argmax_replay_exactly_and_lets_it_gate(tmp_path):
    """``validate`` at T = 0.7 under the argmax rule: the replay section holds exact counters
    (every k), replay gates with fp32 on both sides, and the sampled rule keeps expected values."""
    from tests.support.models import perturbed_copy, tiny_llama, tiny_tokenizer
    from tests.validation.test_replay_method import _heldout
    from specdec.validation.continuation_cache import ContinuationCache
    from specdec.validation.api import ValidationRequest, validate

    target, tok = tiny_llama(103, seed=0), tiny_tokenizer()
    draft = perturbed_copy(target, scale=0.3, seed=3)

    def run(rule: str):
        cfg = ValidationConfig(SpeculativeConfig(3, SAMPLING, 12, draft_sampling=rule), bootstrap_resamples=100)
        [r] = validate(ValidationRequest(target, [draft], _heldout(6), cfg, method="both", decode_fraction=0.5,
                                         tokenizer=tok, cache=ContinuationCache(tmp_path / rule), kmax=6))
        return r

    argmax, sampled = run("argmax"), run("sampled")
    sec = argmax.replay
    assert sec["kind"].startswith("exact counters") and sec["gate_method"] == "replay"
    assert [row["k"] for row in sec["acceptance_by_k"]] == list(range(1, 7))
    assert argmax.overall.num_prompts == 6 and isinstance(sec["replay_inside_decode_ci"], bool)
    assert sum(p["num_accepted_tokens"] for p in sec["prompts"]) == argmax.overall.num_accepted_tokens
    assert sampled.replay["kind"].startswith("expected") and sampled.replay["gate_method"] == "decode"
