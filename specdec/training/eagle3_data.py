"""Training data for EAGLE-3 heads: sequences of the three recipes.

Recipes (chosen by ``benchmarks/eagle3_recipes.py``):

- ``"fixed"``: the target's own distributions over fixed text. Each sequence is a chat prompt made
  from a training document ("Continue this text: <opening>") followed by the document's next tokens
  as the assistant turn; one teacher-forced target pass gives the features and the distributions.
- ``"regenerated"``: target-regenerated responses (what ``speculators`` recommends). The same chat
  prompts, answered by the target itself (greedy), then one teacher-forced pass over prompt+answer.
- ``"tasks"`` (the default; benchmarks/results/2026-12-01-eagle3-head-v3-cpu.md):
  chat-task prompts (summaries, questions, answers over a passage, translations, word problems,
  writing; :mod:`specdec.training.eagle3_prompts`) answered greedily by the target, the features
  kept from the answering passes (:func:`specdec.training.eagle3_features.generated_features`).

The training prompts come from ``specdec/data/training/c4_demo.jsonl`` (C4, ODC-BY; see its
ATTRIBUTION.md), never from the held-out sets.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

DEFAULT_CORPUS = Path(__file__).resolve().parent.parent / "data" / "training" / "c4_demo.jsonl"
RECIPES = ("fixed", "regenerated", "tasks")
Progress = Callable[[int, int], None]


class TrainingDataError(ValueError):
    """The training data is missing, empty or too short for the requested settings."""


@dataclass
class TrainingSequence:
    """One training sequence in the target's vocabulary.

    Attributes:
        input_ids: int64 ``[T]``: chat prompt followed by the response tokens.
        loss_mask: bool ``[T]``: True on response tokens (positions whose next-token distribution
            the head learns); False on the prompt.
    """

    input_ids: torch.Tensor
    loss_mask: torch.Tensor


def load_documents(path: str | Path | None = None, min_chars: int = 200) -> list[str]:
    """Documents from a JSONL file with a ``text`` key per line (default: the shipped C4 sample).

    Raises:
        TrainingDataError: the file is missing or holds no document of ``min_chars`` characters.
    """
    path = Path(path) if path else DEFAULT_CORPUS
    if not path.is_file():
        raise TrainingDataError(f"training corpus not found: {path}")
    docs = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            text = json.loads(line).get("text", "")
        except (json.JSONDecodeError, AttributeError) as e:
            raise TrainingDataError(f"{path}:{n}: not a JSON object with a 'text' key ({e})") from e
        if len(text) >= min_chars:
            docs.append(text)
    if not docs:
        raise TrainingDataError(f"{path}: no document with at least {min_chars} characters")
    return docs


def chat_prompt_ids(tokenizer: Any, user: str) -> list[int]:
    """Token ids of a one-turn chat prompt: the tokenizer's chat template with ``add_generation_prompt``
    (as :func:`specdec.validation.heldout.prompt_token_ids` renders held-out chat prompts), else
    ``user + "\\n"`` with the tokenizer's special tokens."""
    if getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                                 add_generation_prompt=True)
        return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    return list(tokenizer(user + "\n")["input_ids"])


def _split_doc(tokenizer: Any, doc: str, opening_tokens: int) -> tuple[str, list[int]]:
    ids = tokenizer(doc, add_special_tokens=False)["input_ids"]
    return tokenizer.decode(ids[:opening_tokens]), list(ids[opening_tokens:])


def build_prompts(docs: list[str], tokenizer: Any, n: int, *, opening_tokens: int = 48,
                  seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """``n`` chat prompts ``(prompt_ids, document_rest_ids)`` from ``docs`` (shuffled with ``seed``).

    The user turn is "Continue this text:" plus the document's first ``opening_tokens`` tokens; the
    rest of the document is returned for the fixed-text recipe.
    """
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    out = []
    for i in order[:n]:
        opening, rest = _split_doc(tokenizer, docs[i], opening_tokens)
        out.append((chat_prompt_ids(tokenizer, f"Continue this text:\n\n{opening}"), rest))
    return out


def fixed_text_sequences(prompts: list[tuple[list[int], list[int]]], response_tokens: int) -> list[TrainingSequence]:
    """Recipe ``fixed``: each prompt followed by ``response_tokens`` tokens of its document's text."""
    seqs = []
    for p, rest in prompts:
        r = rest[:response_tokens]
        if len(r) >= 8:
            seqs.append(_sequence(p, r))
    return seqs


def _sequence(prompt: list[int], response: list[int]) -> TrainingSequence:
    ids = torch.tensor(prompt + response, dtype=torch.long)
    mask = torch.zeros(len(ids), dtype=torch.bool)
    mask[len(prompt):] = True
    return TrainingSequence(ids, mask)


@torch.inference_mode()
def regenerated_sequences(target: Any, prompts: list[tuple[list[int], list[int]]], response_tokens: int,
                          progress: Progress | None = None, batch_size: int = 16) -> list[TrainingSequence]:
    """Recipe ``regenerated``: the target answers each prompt greedily (at most ``response_tokens``,
    up to its end-of-sequence token), ``batch_size`` left-padded prompts per ``generate`` call, batched
    in order of prompt length (less padding); the result keeps the order of ``prompts`` (prompts with
    an empty answer are left out).

    Args:
        target: a ``LoadedModel`` (``.model``, ``.tokenizer``).
        progress: called with ``(prompts done, prompts)``.
    """
    model, tok = target.model, target.tokenizer
    dev = next(model.parameters()).device
    eos = tok.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else (eos if eos is not None else 0)
    order = sorted(range(len(prompts)), key=lambda j: len(prompts[j][0]))
    answers: dict[int, list[int]] = {}
    for i in range(0, len(order), batch_size):
        idx = order[i:i + batch_size]
        chunk = [prompts[j][0] for j in idx]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk], device=dev)
        attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=dev)
        out = model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=response_tokens, do_sample=False,
                             pad_token_id=pad, eos_token_id=eos)
        for j, row in zip(idx, out[:, width:].tolist()):
            answers[j] = row[:row.index(eos) + 1] if eos is not None and eos in row else row
        if progress:
            progress(min(i + batch_size, len(prompts)), len(prompts))
    return [_sequence(prompts[j][0], answers[j]) for j in range(len(prompts)) if answers[j]]


def greedy_answers(target: Any, turns: list[str], max_new_tokens: int) -> list[str]:
    """The target's greedy answers (text, special tokens dropped) to one-turn chat prompts ``turns``."""
    tok = target.tokenizer
    seqs = regenerated_sequences(target, [(chat_prompt_ids(tok, u), []) for u in turns], max_new_tokens)
    texts = [tok.decode(s.input_ids[s.loss_mask], skip_special_tokens=True) for s in seqs]
    return texts if len(texts) == len(turns) else [""] * len(turns)  # an empty answer dropped: no pairing


def data_sha256(seqs: list[TrainingSequence]) -> str:
    """Hex sha256 over the token ids and loss masks of ``seqs`` in order (the lineage "training data hash")."""
    h = hashlib.sha256()
    for s in seqs:
        h.update(s.input_ids.numpy().astype("<i8").tobytes())
        h.update(s.loss_mask.numpy().astype("u1").tobytes())
        h.update(b"\0")
    return h.hexdigest()
