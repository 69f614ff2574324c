"""flows.finetune: the target-only fine-tune of the demo, on a tiny offline Llama.

What is checked: a real checkpoint is written and loads back through specdec.load_causal_lm; its
weights moved away from the base; the caller's model is untouched; the same seed gives
bit-identical weights and losses, another seed does not; training lowers the loss on a corpus the
tiny model can learn; bad inputs fail clearly without clobbering an existing checkpoint.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from flows.finetune import DEFAULT_CORPUS, FINETUNE_FILE, finetune_target, read_finetune_metadata
from specdec import load_causal_lm
from specdec.models import weights_sha256
from tests.support.models import save_tiny_checkpoint
from tests.support.store import model_store

RECIPE = dict(steps=3, lr=1e-2, batch_size=2, seq_len=16, num_threads=1)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("base") / "tiny")


@pytest.fixture(scope="module")
def base(base_dir):
    return load_causal_lm(str(base_dir), store=model_store())


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_shipped_corpus_is_tiny_shakespeare_byte_for_byte():
    data = DEFAULT_CORPUS.read_bytes()
    assert len(data) == 1_115_394
    assert hashlib.sha256(data).hexdigest() == "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
    assert data.startswith(b"First Citizen:\nBefore we proceed any further, hear me speak.")
    assert (DEFAULT_CORPUS.parent / "ATTRIBUTION.md").is_file() and (DEFAULT_CORPUS.parent / "LICENSE").is_file()


def test_finetune_saves_loadable_changed_checkpoint_and_leaves_base_untouched(base, base_dir, tmp_path):
    before = _state(base.model)
    base_sha = weights_sha256(base_dir)
    seen: list[tuple[int, float]] = []
    res = finetune_target(base, tmp_path / "ft", seed=0, on_step=lambda i, l: seen.append((i, l)), **RECIPE,
                          store=model_store())

    assert res.path == tmp_path / "ft" and res.steps == 3 and len(res.losses) == 3
    assert [i for i, _ in seen] == [1, 2, 3] and [l for _, l in seen] == res.losses
    assert res.final_loss == res.losses[-1] and all(torch.isfinite(torch.tensor(res.losses)))
    assert res.seconds > 0 and res.cpu_seconds >= 0
    assert res.base_weights_sha256 == base_sha and res.weights_sha256 == weights_sha256(res.path)
    assert res.weights_sha256 != base_sha

    # the caller's model object: same weights, still eval mode; its checkpoint bytes unchanged
    after = _state(base.model)
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert not base.model.training and weights_sha256(base_dir) == base_sha

    ft = load_causal_lm(str(res.path), store=model_store())
    assert not ft.model.training
    ft_state = ft.model.state_dict()
    assert ft_state.keys() == before.keys()
    changed = [k for k in before if not torch.equal(before[k], ft_state[k])]
    assert any("layers.0." in k for k in changed) and "model.embed_tokens.weight" in changed
    # tokenizer files copied from the base: identical ids for a probe text
    probe = "Hello, world!\nROMEO: wherefore?"
    assert ft.tokenizer(probe)["input_ids"] == base.tokenizer(probe)["input_ids"]
    assert ft.tokenizer.chat_template == base.tokenizer.chat_template

    meta = read_finetune_metadata(res.path)
    assert meta["base"]["weights_sha256"] == base_sha
    assert meta["corpus"]["sha256"] == res.corpus_sha256 and meta["corpus"]["file"] == "input.txt"
    assert meta["result"]["losses"] == res.losses and meta["result"]["seq_len"] == 16


def test_same_seed_is_bit_identical_other_seed_differs(base_dir, tmp_path):
    a = finetune_target(str(base_dir), tmp_path / "a", seed=7, **RECIPE, store=model_store())
    b = finetune_target(str(base_dir), tmp_path / "b", seed=7, **RECIPE, store=model_store())
    c = finetune_target(str(base_dir), tmp_path / "c", seed=8, **RECIPE, store=model_store())
    assert a.losses == b.losses
    assert a.weights_sha256 == b.weights_sha256
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    assert c.losses != a.losses and c.weights_sha256 != a.weights_sha256


def test_training_lowers_loss_on_learnable_corpus(base_dir, tmp_path):
    corpus = tmp_path / "abc.txt"
    corpus.write_text("abcdefgh" * 400)
    res = finetune_target(str(base_dir), tmp_path / "ft", corpus=corpus, steps=30, lr=1e-2, batch_size=4,
                          seq_len=16, warmup_steps=0, num_threads=1, store=model_store())
    assert sum(res.losses[-5:]) / 5 < 0.5 * sum(res.losses[:5]) / 5


def test_tied_embeddings_stay_tied(tmp_path):
    from transformers import LlamaForCausalLM

    from tests.support.models import tiny_llama, tiny_tokenizer

    model = tiny_llama()
    model.config.tie_word_embeddings = True
    model.tie_weights()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    model.save_pretrained(tmp_path / "tied")
    tiny_tokenizer().save_pretrained(tmp_path / "tied")
    res = finetune_target(str(tmp_path / "tied"), tmp_path / "ft", **RECIPE, store=model_store())
    ft = LlamaForCausalLM.from_pretrained(res.path)
    assert ft.config.tie_word_embeddings
    assert ft.lm_head.weight.data_ptr() == ft.model.embed_tokens.weight.data_ptr()


def test_bad_inputs_fail_clearly_and_keep_existing_output(base_dir, tmp_path):
    with pytest.raises(ValueError, match="steps"):
        finetune_target(str(base_dir), tmp_path / "x", **{**RECIPE, "steps": 0}, store=model_store())
    with pytest.raises(ValueError, match="lr"):
        finetune_target(str(base_dir), tmp_path / "x", **{**RECIPE, "lr": float("nan")}, store=model_store())
    with pytest.raises(FileNotFoundError, match="corpus"):
        finetune_target(str(base_dir), tmp_path / "x", corpus=tmp_path / "missing.txt", **RECIPE, store=model_store())
    short = tmp_path / "short.txt"
    short.write_text("abc")
    with pytest.raises(ValueError, match="fewer than seq_len"):
        finetune_target(str(base_dir), tmp_path / "x", corpus=short, **RECIPE, store=model_store())
    assert not (tmp_path / "x").exists()
    with pytest.raises(TypeError):
        finetune_target(42, tmp_path / "x", **RECIPE, store=model_store())

    out = tmp_path / "existing"
    out.mkdir()
    (out / "keep.txt").write_text("data")
    with pytest.raises(FileExistsError):
        finetune_target(str(base_dir), out, **RECIPE, store=model_store())
    assert (out / "keep.txt").read_text() == "data"
    res = finetune_target(str(base_dir), out, overwrite=True, **RECIPE, store=model_store())
    assert not (out / "keep.txt").exists() and (out / FINETUNE_FILE).is_file() and res.path == out
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
