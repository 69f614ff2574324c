"""check_pair_compatible: vocabulary, special tokens, token text and padded embedding rows."""

from __future__ import annotations

import json

import pytest

from specdec import IncompatiblePairError, check_pair_compatible
from specdec.models import check_loaded_pair, load_causal_lm
from tests.support.models import save_tiny_checkpoint, tiny_llama, tiny_tokenizer
from tests.support.store import model_store


def _rebuild(tok, edit_json=None, **kwargs):
    """A PreTrainedTokenizerFast from ``tok``'s backend JSON after ``edit_json(data)``."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    data = json.loads(tok.backend_tokenizer.to_str())
    if edit_json:
        edit_json(data)
    special = dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
                   additional_special_tokens=["<user>", "<assistant>", "<system>"])
    special.update(kwargs)
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(data)), **special)


def test_identical_pair_passes():
    tok = tiny_tokenizer()
    res = check_pair_compatible(tok, tiny_tokenizer(), tiny_llama(103).config, tiny_llama(103, seed=1).config)
    assert res.compatible and res.problems == []
    assert (res.shared_vocab_size, res.target_vocab_size, res.draft_vocab_size) == (103, 103, 103)
    d = res.to_dict()
    assert d["compatible"] is True and d["tokenizer_vocab_size"] == 103
    json.dumps(d)


def test_padded_draft_embedding_rows_pass():
    res = check_pair_compatible(tiny_tokenizer(), tiny_tokenizer(), tiny_llama(103).config, tiny_llama(110).config)
    assert res.compatible
    assert (res.shared_vocab_size, res.target_vocab_size, res.draft_vocab_size) == (103, 103, 110)
    assert any("padded" in n for n in res.notes)
    # padding on the target side works the same way
    res = check_pair_compatible(tiny_tokenizer(), tiny_tokenizer(), tiny_llama(128).config, tiny_llama(103).config)
    assert res.compatible and res.shared_vocab_size == 103


def test_embedding_smaller_than_tokenizer_fails():
    with pytest.raises(IncompatiblePairError, match="draft tokenizer has 103 ids but the draft model has only 100"):
        check_pair_compatible(tiny_tokenizer(), tiny_tokenizer(), tiny_llama(103).config, tiny_llama(100).config)


def test_swapped_tokens_fail_naming_ids():
    tok = tiny_tokenizer()
    a, b = tok.convert_tokens_to_ids(["a", "b"])

    def swap(data):
        vocab = data["model"]["vocab"]
        vocab["a"], vocab["b"] = vocab["b"], vocab["a"]

    draft = _rebuild(tok, swap)
    assert len(draft) == len(tok)
    with pytest.raises(IncompatiblePairError) as e:
        check_pair_compatible(tok, draft, tiny_llama(103).config, tiny_llama(103).config)
    msg = str(e.value)
    assert "vocabulary differs at 2 ids" in msg
    assert f"id {a}: target 'a' vs draft 'b'" in msg and f"id {b}: target 'b' vs draft 'a'" in msg
    res = check_pair_compatible(tok, draft, None, None, strict=False)
    assert not res.compatible and len(res.problems) == 1


def test_different_vocab_size_fails():
    tok = tiny_tokenizer()
    bigger = tiny_tokenizer()
    bigger.add_tokens(["<extra>"])
    with pytest.raises(IncompatiblePairError, match="sizes differ: target 103 ids, draft 104 ids") as e:
        check_pair_compatible(tok, bigger, tiny_llama(103).config, tiny_llama(110).config)
    assert "id 103: target None vs draft '<extra>'" in str(e.value)


def test_special_token_mismatch_fails():
    tok = tiny_tokenizer()
    draft = _rebuild(tok, eos_token="<system>")
    with pytest.raises(IncompatiblePairError, match=r"special token eos differs: target id 2 \('</s>'\) vs draft id 6 \('<system>'\)"):
        check_pair_compatible(tok, draft, tiny_llama(103).config, tiny_llama(103).config)
    no_pad = _rebuild(tok, pad_token=None)
    with pytest.raises(IncompatiblePairError, match="special token pad differs"):
        check_pair_compatible(tok, no_pad, None, None)


def test_token_text_mismatch_fails():
    """Same id->token table, but the draft lower-cases its input: texts tokenize differently."""
    tok = tiny_tokenizer()

    def lowercase(data):
        data["normalizer"] = {"type": "Lowercase"}

    draft = _rebuild(tok, lowercase)
    assert draft.get_vocab() == tok.get_vocab()
    with pytest.raises(IncompatiblePairError, match="token text: 'Hello, world!.*tokenizes differently"):
        check_pair_compatible(tok, draft, None, None)


def test_chat_template_difference_is_a_note():
    res = check_pair_compatible(tiny_tokenizer(), tiny_tokenizer(chat_template=False), None, None)
    assert res.compatible and any("chat templates differ" in n for n in res.notes)


def test_check_loaded_pair(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    target = load_causal_lm(save_tiny_checkpoint(tmp_path / "t"), store=model_store())
    draft = load_causal_lm(save_tiny_checkpoint(tmp_path / "d", seed=1, vocab_size=110), store=model_store())
    res = check_loaded_pair(target, draft)
    assert res.compatible and res.shared_vocab_size == 103 and res.draft_vocab_size == 110


def test_draft_config_declaring_another_eos_is_refused():
    """Before: accepted with only a note; the draft then stops drafting where the target goes on."""
    tok = tiny_tokenizer()
    target, draft = tiny_llama(103).config, tiny_llama(103).config
    draft.eos_token_id = 6
    with pytest.raises(IncompatiblePairError, match=r"config eos_token_id differs: target \[2\], draft \[6\]"):
        check_pair_compatible(tok, tok, target, draft)
    draft.eos_token_id = [2]  # a list naming the same id is the same
    assert check_pair_compatible(tok, tok, target, draft).compatible


def test_generation_config_eos_mismatch_is_refused():
    from transformers import GenerationConfig

    tok = tiny_tokenizer()
    cfg = tiny_llama(103).config
    with pytest.raises(IncompatiblePairError, match=r"generation_config eos_token_id differs: target \[2\], draft \[2, 6\]"):
        check_pair_compatible(tok, tok, cfg, cfg, target_generation_config=GenerationConfig(eos_token_id=2),
                              draft_generation_config=GenerationConfig(eos_token_id=[2, 6]))


def test_properties_that_fail_mid_run_are_noted_and_checked_up_front():
    """A shorter draft context is noted at pairing time and refused before decoding starts
    (before: it ran into the draft's position limit in the middle of a generation)."""
    import torch

    from specdec import NgramDrafter, SamplingConfig, speculative_generate

    tok = tiny_tokenizer()
    target = tiny_llama(103)
    short = tiny_llama(103)
    short.config.max_position_embeddings = 16
    res = check_pair_compatible(tok, tok, target.config, short.config)
    assert res.compatible and any("the draft's context (16 tokens) is shorter" in n for n in res.notes)
    ids = torch.arange(5, 15)[None]  # 10 prompt tokens
    with pytest.raises(ValueError, match="exceeds the draft model's context of 16 tokens"):
        speculative_generate(target, short, ids, num_speculative_tokens=2, max_new_tokens=8, sampling=SamplingConfig())
    with pytest.raises(ValueError, match="exceeds the draft model's context of 16 tokens"):
        speculative_generate(target, short, torch.cat([ids, ids]), num_speculative_tokens=2, max_new_tokens=8,
                             sampling=SamplingConfig())
    speculative_generate(target, NgramDrafter(), ids, num_speculative_tokens=2, max_new_tokens=8, sampling=SamplingConfig())
    notes = check_pair_compatible(tok, tok, tiny_llama(110).config, tiny_llama(103).config).notes
    assert any("the draft embeds only 103 ids, the target scores 110" in n for n in notes)
