"""A continuation-cache entry that fails its check is recomputed, never used, never a traceback
(issue 25, item 2). Before: one changed token id moved the replayed acceptance rate (0.0205 ->
0.0169 on the real pair) and a garbage or out-of-range entry gave a traceback."""

from __future__ import annotations

import json

import pytest
import torch

from specdec import SamplingConfig
from specdec.validation import ValidationConfig
from specdec.validation.continuation_cache import ContinuationCache, ContinuationKey
from specdec.validation.heldout import HeldoutPrompt, HeldoutSet, content_version
from specdec.validation.api import ValidationRequest, validate
from tests.support.models import perturbed_copy, tiny_llama, tiny_tokenizer

VOCAB = 103


def _key(**over) -> ContinuationKey:
    base = dict(target_weights="w" * 64, heldout_version="h1", prompt_id="p0", prompt_ids=[5, 6, 7], chat_template="t",
                max_new_tokens=16, sampling=SamplingConfig(), seed=0, stop_token_ids=frozenset({2}),
                dtype=torch.float32, device="cpu")
    return ContinuationKey.build(**{**base, **over})


def _edit(path, fn) -> None:
    entry = json.loads(path.read_text())
    fn(entry)
    path.write_text(json.dumps(entry))


CORRUPTIONS = {
    "one-token-changed": lambda p: _edit(p, lambda e: e["tokens"].__setitem__(1, e["tokens"][1] + 1)),
    "garbage-bytes": lambda p: p.write_bytes(b"\x00\xffnot json at all\x89"),
    "truncated": lambda p: p.write_text(p.read_text()[:25]),
    "tokens-not-a-list": lambda p: _edit(p, lambda e: e.__setitem__("tokens", {"a": 1})),
    "string-token": lambda p: _edit(p, lambda e: e["tokens"].__setitem__(0, "9")),
    "json-null": lambda p: p.write_text("null"),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_a_corrupted_entry_is_a_miss_not_a_traceback(tmp_path, case, caplog):
    cache = ContinuationCache(tmp_path)
    path = cache.put(_key(), [9, 10, 11, 12], "target-only")
    assert cache.get(_key(), vocab_size=VOCAB) == [9, 10, 11, 12]
    CORRUPTIONS[case](path)
    assert cache.get(_key(), vocab_size=VOCAB) is None
    assert cache.rejected == 1 and "failed its check" in caplog.text
    cache.put(_key(), [9, 10, 11, 12], "target-only")  # the caller recomputes and overwrites
    assert cache.get(_key(), vocab_size=VOCAB) == [9, 10, 11, 12]


def test_out_of_range_or_too_long_entries_are_refused_even_with_a_valid_checksum(tmp_path):
    cache = ContinuationCache(tmp_path)
    cache.put(_key(), [9, VOCAB + 5], "target-only")  # as if a bug had stored it
    assert cache.get(_key(), vocab_size=VOCAB) is None and cache.rejected == 1
    cache.put(_key(), [-1, 3], "target-only")
    assert cache.get(_key(), vocab_size=VOCAB) is None
    cache.put(_key(max_new_tokens=2), [1, 2, 3], "target-only")
    assert cache.get(_key(max_new_tokens=2), vocab_size=VOCAB) is None


def test_a_replay_with_a_tampered_entry_gives_the_clean_number(tmp_path):
    """The real replay path: one token id changed in one entry; the rerun recomputes that entry and
    reports exactly the acceptance of the clean run."""
    prompts = [HeldoutPrompt(id=f"q{i}", category="a", messages=[{"role": "user", "content": f"item {i} abc"}])
               for i in range(4)]
    held = HeldoutSet("toy", content_version(prompts), prompts)
    target, tok = tiny_llama(VOCAB, seed=0), tiny_tokenizer()
    draft = perturbed_copy(target, scale=0.05, seed=3)
    cfg = ValidationConfig(max_new_tokens=10, bootstrap_resamples=50)
    cache = ContinuationCache(tmp_path)

    def run():
        [r] = validate(ValidationRequest(target, [draft], held, cfg, method="replay", tokenizer=tok, cache=cache, kmax=4))
        return r

    clean = run()
    entry = next(p for p in tmp_path.rglob("*.json") if p.name != "weights-sha256.json")
    _edit(entry, lambda e: e["tokens"].__setitem__(0, (e["tokens"][0] + 1) % VOCAB))
    again = run()
    assert cache.rejected == 1
    assert again.replay["continuations"]["cache"] == 3
    assert again.overall.num_accepted_tokens == clean.overall.num_accepted_tokens
    assert again.overall.acceptance_rate == clean.overall.acceptance_rate
