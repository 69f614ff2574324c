"""Tiny, offline, seeded models and tokenizers for tests, CI, the docker stack test and the GPU smoke check.

Nothing here touches the network, and the module imports nothing from this repository: the docker
stack test runs its source inside the worker image, which does not ship ``tests/``. The models are random Llama models built from a config (fp32),
so every test runs in seconds on a CPU.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<user>", "<assistant>", "<system>"]
TINY_CHARS = string.ascii_letters + string.digits + string.punctuation + " \n"


def tiny_tokenizer(chat_template: bool = True):
    """A character-level ``PreTrainedTokenizerFast`` (7 special tokens + 96 characters = 103 ids).

    Returns:
        transformers.PreTrainedTokenizerFast with ``bos/eos/unk/pad`` set and, if requested, a
        small chat template (``<user>…</s><assistant>``).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    for ch in TINY_CHARS:
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        additional_special_tokens=["<user>", "<assistant>", "<system>"],
    )
    if chat_template:
        fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_llama(
    vocab_size: int = 103,
    *,
    seed: int = 0,
    hidden_size: int = 32,
    num_layers: int = 2,
    max_position_embeddings: int = 512,
    init_std: float = 0.5,
    eos_token_id: int = 2,
):
    """A random ``LlamaForCausalLM`` in fp32, eval mode, built from a config (no download).

    Args:
        vocab_size: number of token ids (rows of the embedding and LM head).
        seed: torch seed for the weight init, so two calls with the same seed are identical.
        init_std: ``initializer_range``; a larger value gives peakier, more varied distributions.
    Returns:
        transformers.LlamaForCausalLM on CPU.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        initializer_range=init_std,
        bos_token_id=1,
        eos_token_id=eos_token_id,
        pad_token_id=3,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    return model


def perturbed_copy(model, *, scale: float, seed: int = 1):
    """A deep copy of ``model`` with Gaussian noise of relative size ``scale`` added to every weight.

    ``scale=0`` returns an exact copy; larger values lower draft/target agreement smoothly.
    """
    import copy

    clone = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in clone.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale * p.std().clamp_min(1e-6))
    return clone


def save_tiny_checkpoint(path: str | Path, *, seed: int = 0, vocab_size: int = 103, perturb: float = 0.0,
                         hidden_size: int = 32, init_std: float = 0.5) -> Path:
    """Save a tiny Llama + character tokenizer as a local HF checkpoint directory (safetensors).

    Returns the directory, loadable with :func:`specdec.load_causal_lm`.
    """
    path = Path(path)
    model = tiny_llama(vocab_size, seed=seed, hidden_size=hidden_size, init_std=init_std)
    if perturb:
        model = perturbed_copy(model, scale=perturb, seed=seed + 1000)
    model.save_pretrained(path, safe_serialization=True)
    tiny_tokenizer().save_pretrained(path)
    return path
