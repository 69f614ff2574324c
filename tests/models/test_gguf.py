"""GGUF -> safetensors cache conversion, on a tiny GGUF written here with the ``gguf`` package."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from specdec.models import SOURCE_FILE, file_sha256, load_causal_lm, tokenizer_sha256, weights_sha256

from tests.support.store import model_store

CHAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_tiny_gguf(path: Path, *, seed: int = 0, hidden: int = 64, layers: int = 2) -> Path:
    """A tiny llama GGUF (F32 tensors, byte-level BPE tokenizer like SmolLM2's, chat template)."""
    import gguf
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    rng = np.random.default_rng(seed)
    toks = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *bytes_to_unicode().values(), "Ġt", "he", "Ġthe"]
    heads, kv, ff, v = 4, 2, 2 * hidden, len(toks)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(v)
    w.add_rope_dimension_count(hidden // heads)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_types([3, 3, 3] + [1] * (v - 3))
    w.add_token_merges(["Ġ t", "h e", "Ġt he"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT)

    def rand(*shape):
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    w.add_tensor("token_embd.weight", rand(v, hidden))
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    hd = hidden // heads
    for i in range(layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(p + "attn_q.weight", rand(hidden, hidden))
        w.add_tensor(p + "attn_k.weight", rand(kv * hd, hidden))
        w.add_tensor(p + "attn_v.weight", rand(kv * hd, hidden))
        w.add_tensor(p + "attn_output.weight", rand(hidden, hidden))
        w.add_tensor(p + "ffn_gate.weight", rand(ff, hidden))
        w.add_tensor(p + "ffn_up.weight", rand(ff, hidden))
        w.add_tensor(p + "ffn_down.weight", rand(hidden, ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SPECDEC_MODELS_DIR", raising=False)  # the cache must land under this home
    return tmp_path / "home"


def test_gguf_converted_once_and_bit_identical(tmp_path, home):
    from transformers import AutoModelForCausalLM

    gguf_file = write_tiny_gguf(tmp_path / "tiny.gguf")
    sha = file_sha256(gguf_file)
    lm = load_causal_lm(gguf_file, store=model_store())
    cache = home / "models" / "gguf" / sha
    assert lm.path == cache and (cache / SOURCE_FILE).is_file()
    assert sorted(p.name for p in cache.parent.iterdir() if not p.name.endswith(".lock")) == [sha]
    src = json.loads((cache / SOURCE_FILE).read_text())
    assert src["kind"] == "gguf" and src["gguf_sha256"] == sha and src["gguf_file"] == "tiny.gguf"
    assert src["weights_sha256"] == weights_sha256(cache) and src["tokenizer_sha256"] == tokenizer_sha256(cache)
    assert lm.source["ref"] == str(gguf_file.resolve()) and lm.source["kind"] == "gguf"
    assert "quantization_config" not in json.loads((cache / "config.json").read_text())

    # the safetensors copy equals what transformers dequantizes from the GGUF
    direct = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="tiny.gguf", dtype=torch.float32)
    for (n, p), (n2, p2) in zip(lm.model.state_dict().items(), direct.state_dict().items()):
        assert n == n2 and torch.equal(p, p2), n
    ids = torch.tensor([[1, 70, 71, 72, 260]])
    assert torch.equal(lm.model(ids).logits, direct(ids).logits)

    tok = lm.tokenizer
    assert (tok.bos_token_id, tok.eos_token_id, tok.unk_token_id, len(tok)) == (1, 2, 0, 262)
    assert tok.chat_template == CHAT
    assert tok.decode(tok("the cat")["input_ids"]) == "the cat"

    # second load (from another path, same bytes) reuses the cache: nothing is rewritten
    mtime = (cache / "model.safetensors").stat().st_mtime_ns
    moved = gguf_file.rename(tmp_path / "elsewhere.gguf")
    lm2 = load_causal_lm(moved, store=model_store())
    assert lm2.path == cache and (cache / "model.safetensors").stat().st_mtime_ns == mtime
    assert lm2.source["ref"] == str(moved.resolve())
    # and the cache dir itself is a loadable local ref
    assert load_causal_lm(cache, store=model_store()).source["gguf_sha256"] == sha
