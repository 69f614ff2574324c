"""Held-out prompt sets: the shipped Spec-Bench and HumanEval sets, user JSONL files, stratified subsets.

Shipped sets (``specdec/data/heldout/``, byte-for-byte copies with their licences and attribution):

- ``spec_bench``: Spec-Bench ``question.jsonl`` (Xia et al. 2024), 480 prompts in six categories
  ``mt_bench, translation, summarization, qa, math_reasoning, rag``. The MT-bench records keep
  their original category (writing, roleplay, ...) as ``source_category`` and are grouped under
  ``mt_bench``. Multi-turn MT-bench records use **only the first turn** (the second turn refers
  to an answer the model has not produced in a single-prompt evaluation).
- ``humaneval``: OpenAI HumanEval (Chen et al. 2021), 164 code-completion prompts, category
  ``code``, given as raw ``text`` (no chat template).
- ``spec_bench+humaneval``: both (644 prompts, seven categories).

User files are JSONL (optionally ``.gz``), one object per line with ``id``, ``category`` and one of
``prompt`` (a string, sent as one user message), ``messages`` (a list of
``{"role": ..., "content": ...}``) or ``text`` (raw text, no chat template). Spec-Bench/MT-bench
style records (``question_id``, ``category``, ``turns``) are read like the shipped set.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
from collections import Counter
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = [
    "BUILTIN_SETS",
    "HeldoutFormatError",
    "HeldoutPrompt",
    "HeldoutSet",
    "SPEC_BENCH_CATEGORIES",
    "load_heldout",
    "prompt_token_ids",
]

SPEC_BENCH_CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
MT_BENCH_SOURCE_CATEGORIES = frozenset(
    {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
)
BUILTIN_SETS = ("spec_bench", "humaneval", "spec_bench+humaneval")
_DATA = "data/heldout"


class HeldoutFormatError(ValueError):
    """A held-out file is malformed. The message names the file and, where it applies, the line."""


@dataclass
class HeldoutPrompt:
    """One held-out prompt.

    Exactly one of ``messages`` (chat messages, each ``{"role": str, "content": str}``) and
    ``text`` (raw text fed without a chat template) is set. ``source_category`` keeps the dataset's
    own category when it was mapped (e.g. MT-bench ``writing`` -> ``mt_bench``).
    """

    id: str
    category: str
    messages: list[dict[str, str]] | None = None
    text: str | None = None
    source_category: str | None = None

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.text is None):
            raise ValueError(f"prompt {self.id!r}: exactly one of messages/text must be set")

    @property
    def is_empty(self) -> bool:
        """True when the prompt has no non-whitespace content."""
        if self.text is not None:
            return not self.text.strip()
        return not any(str(m.get("content", "")).strip() for m in self.messages or [])

    def canonical(self) -> dict[str, Any]:
        """The normalised content that the set version hashes (id, category, messages or text)."""
        d: dict[str, Any] = {"id": self.id, "category": self.category}
        if self.messages is not None:
            d["messages"] = [{"role": m["role"], "content": m["content"]} for m in self.messages]
        else:
            d["text"] = self.text
        return d


@dataclass
class HeldoutSet:
    """A named, versioned list of prompts.

    Attributes:
        name: ``spec_bench``, ``humaneval``, ``spec_bench+humaneval`` or a user file's stem.
        version: ``sha256`` hex digest of the normalised content (see :func:`content_version`);
            independent of file formatting, key order and record order.
        prompts: the prompts, in file order.
        source_version: for a subset, the version of the full set it was drawn from (else equal
            to ``version``).
    """

    name: str
    version: str
    prompts: list[HeldoutPrompt]
    source_version: str = ""
    subset_spec: dict[str, int] | None = field(default=None)

    def __post_init__(self) -> None:
        if not self.source_version:
            self.source_version = self.version

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def categories(self) -> list[str]:
        """Sorted distinct category names."""
        return sorted({p.category for p in self.prompts})

    def category_counts(self) -> dict[str, int]:
        """``{category: number of prompts}``, sorted by category."""
        return dict(sorted(Counter(p.category for p in self.prompts).items()))

    def subset(self, limit: int | None, seed: int = 0) -> "HeldoutSet":
        """A deterministic stratified subset of ``limit`` prompts, spread evenly over categories.

        Each category gets ``limit // C`` prompts (C = number of categories); the remaining
        ``limit % C`` go one each to categories picked by a seeded shuffle. A category with fewer
        prompts than its share gives all it has and the shortfall is spread over the others the
        same way. Inside a category the prompts are the first ones of a permutation seeded by
        ``(seed, category)``, so a larger limit with the same seed gives a superset, and the
        choice in one category does not depend on the others. The result keeps file order.

        Args:
            limit: number of prompts wanted; ``None`` or ``>= len(self)`` returns the whole set.
            seed: integer seed.
        Returns:
            A new :class:`HeldoutSet` with the same ``name``, its own ``version`` (hash of the
            subset's content) and ``source_version`` = this set's version.
        Raises:
            ValueError: if ``limit < 1``.
        """
        if limit is None or limit >= len(self.prompts):
            return self
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        by_cat: dict[str, list[int]] = {}
        for i, p in enumerate(self.prompts):
            by_cat.setdefault(p.category, []).append(i)
        quota = _allocate(limit, {c: len(v) for c, v in by_cat.items()}, seed)
        chosen: list[int] = []
        for cat, idx in by_cat.items():
            perm = list(idx)
            random.Random(f"specdec-heldout:{seed}:{cat}").shuffle(perm)
            chosen.extend(perm[: quota[cat]])
        prompts = [self.prompts[i] for i in sorted(chosen)]
        return HeldoutSet(
            name=self.name,
            version=content_version(prompts),
            prompts=prompts,
            source_version=self.source_version,
            subset_spec={"limit": limit, "seed": seed},
        )


def _allocate(limit: int, sizes: dict[str, int], seed: int) -> dict[str, int]:
    """Split ``limit`` over categories as evenly as their sizes allow (seeded remainder)."""
    cats = sorted(sizes)
    quota = dict.fromkeys(cats, 0)
    rng = random.Random(f"specdec-heldout-alloc:{seed}")
    left = min(limit, sum(sizes.values()))
    while left > 0:
        open_cats = [c for c in cats if quota[c] < sizes[c]]
        share = left // len(open_cats)
        if share == 0:  # fewer prompts left than open categories: seeded pick
            rng.shuffle(open_cats)
            for c in open_cats[:left]:
                quota[c] += 1
            break
        for c in open_cats:
            quota[c] += min(share, sizes[c] - quota[c])
        left = min(limit, sum(sizes.values())) - sum(quota.values())
    return quota


def content_version(prompts: list[HeldoutPrompt]) -> str:
    """``sha256`` of the normalised content: canonical JSON (sorted keys, compact, UTF-8) of each
    prompt's ``id``, ``category`` and ``messages``/``text``, one line each, sorted by ``id``."""
    h = hashlib.sha256()
    for p in sorted(prompts, key=lambda p: p.id):
        h.update(json.dumps(p.canonical(), sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode())
        h.update(b"\n")
    return h.hexdigest()


def load_heldout(name_or_path: str | Path) -> HeldoutSet:
    """Load a shipped held-out set by name, or a user JSONL file by path.

    Args:
        name_or_path: one of :data:`BUILTIN_SETS` (``spec_bench``, ``humaneval``,
            ``spec_bench+humaneval``) or a path to a ``.jsonl`` / ``.jsonl.gz`` file (format in the
            module docstring).
    Returns:
        :class:`HeldoutSet` with ``version`` = sha256 of the normalised content.
    Raises:
        FileNotFoundError: the name is not a shipped set and no such file exists.
        HeldoutFormatError: a line is not JSON, lacks ``id``/``category``/a prompt field, has the
            wrong types, or repeats an id; the message names the file and the line number. Also
            raised for a file with no records.
    """
    key = str(name_or_path)
    if key in BUILTIN_SETS and not Path(key).exists():
        prompts: list[HeldoutPrompt] = []
        for part in key.split("+"):
            prompts.extend(_load_builtin(part))
        _check_unique(prompts, key)
        return HeldoutSet(name=key, version=content_version(prompts), prompts=prompts)
    path = Path(name_or_path)
    if not path.is_file():
        raise FileNotFoundError(
            f"held-out set {key!r}: not a shipped set ({', '.join(BUILTIN_SETS)}) and no such file"
        )
    prompts = _parse_jsonl(path)
    name = path.name.removesuffix(".gz").removesuffix(".jsonl")
    return HeldoutSet(name=name, version=content_version(prompts), prompts=prompts)


def _load_builtin(name: str) -> list[HeldoutPrompt]:
    root = resources.files("specdec").joinpath(_DATA)
    if name == "spec_bench":
        return _parse_jsonl(Path(str(root.joinpath("spec_bench/question.jsonl"))))
    if name == "humaneval":
        return _parse_jsonl(Path(str(root.joinpath("humaneval/HumanEval.jsonl.gz"))), default_category="code")
    raise FileNotFoundError(f"no shipped held-out set named {name!r}")


def _open_lines(path: Path) -> list[str]:
    raw = path.read_bytes()
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except OSError as e:
            raise HeldoutFormatError(f"{path}: not a valid gzip file ({e})") from e
    try:
        return raw.decode("utf-8-sig").splitlines()  # a UTF-8 byte-order mark (Windows editors) is dropped
    except UnicodeDecodeError as e:
        raise HeldoutFormatError(f"{path}: not UTF-8 text ({e})") from e


MAX_REPORTED_LINES = 20  # bad lines named in one error (the count says how many there were)


def _parse_jsonl(path: Path, default_category: str | None = None) -> list[HeldoutPrompt]:
    """Every record of a JSONL file as a prompt; every bad line is reported at once (one at a
    time before), in one :class:`HeldoutFormatError`."""
    prompts: list[HeldoutPrompt] = []
    bad: list[str] = []
    for lineno, line in enumerate(_open_lines(path), start=1):
        if not line.strip():
            continue
        try:
            prompts.append(_parse_line(line, f"{path}:{lineno}", default_category))
        except HeldoutFormatError as e:
            bad.append(str(e))
    if bad:
        more = f" (and {len(bad) - MAX_REPORTED_LINES} more)" if len(bad) > MAX_REPORTED_LINES else ""
        head = f"{len(bad)} bad lines: " if len(bad) > 1 else ""
        raise HeldoutFormatError(head + "; ".join(bad[:MAX_REPORTED_LINES]) + more)
    if not prompts:
        raise HeldoutFormatError(f"{path}: no prompts (empty file)")
    _check_unique(prompts, str(path))
    return prompts


def _parse_line(line: str, where: str, default_category: str | None) -> HeldoutPrompt:
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        raise HeldoutFormatError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(rec, dict):
        raise HeldoutFormatError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    return _record_to_prompt(rec, where, default_category)


_KNOWN_KEYS = ("id", "category", "prompt", "messages", "text", "task_id", "question_id", "turns")


def _unknown_keys(rec: dict[str, Any]) -> str:
    """`` (unknown key 'promt': did you mean 'prompt'?)`` for keys close to a known one, else ``""``."""
    import difflib

    hints = []
    for k in rec:
        if k not in _KNOWN_KEYS:
            close = difflib.get_close_matches(str(k), _KNOWN_KEYS, n=1, cutoff=0.6)
            if close:
                hints.append(f"unknown key {k!r}: did you mean {close[0]!r}?")
    return f" ({'; '.join(hints)})" if hints else ""


def _record_to_prompt(rec: dict[str, Any], where: str, default_category: str | None) -> HeldoutPrompt:
    if "task_id" in rec and "prompt" in rec and "id" not in rec:  # HumanEval layout
        rec = {"id": rec["task_id"], "category": rec.get("category", default_category or "code"), "text": rec["prompt"]}
    if "question_id" in rec and "turns" in rec and "id" not in rec:  # Spec-Bench / MT-bench layout
        turns = rec["turns"]
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise HeldoutFormatError(f"{where}: 'turns' must be a non-empty list of strings")
        cat = rec.get("category")
        if not isinstance(cat, str):
            raise HeldoutFormatError(f"{where}: missing or non-string 'category'")
        mapped = "mt_bench" if cat in MT_BENCH_SOURCE_CATEGORIES else cat
        return HeldoutPrompt(
            id=str(rec["question_id"]),
            category=mapped,
            messages=[{"role": "user", "content": turns[0]}],  # first turn only
            source_category=cat if mapped != cat else None,
        )
    if "id" not in rec:
        raise HeldoutFormatError(f"{where}: missing key 'id'{_unknown_keys(rec)}")
    if not isinstance(rec["id"], (str, int)) or isinstance(rec["id"], bool):
        raise HeldoutFormatError(f"{where}: 'id' must be a string or integer")
    cat = rec.get("category", default_category)
    if cat is None:
        raise HeldoutFormatError(f"{where}: missing key 'category'")
    if not isinstance(cat, str) or not cat.strip():
        raise HeldoutFormatError(f"{where}: 'category' must be a non-empty string")
    given = [k for k in ("prompt", "messages", "text") if k in rec]
    if len(given) != 1:
        what = "missing" if not given else f"more than one of {given}"
        raise HeldoutFormatError(f"{where}: {what}: need exactly one of 'prompt', 'messages', 'text'"
                                 f"{_unknown_keys(rec) if not given else ''}")
    pid = str(rec["id"])
    if "messages" in rec:
        msgs = rec["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise HeldoutFormatError(f"{where}: 'messages' must be a non-empty list")
        clean = []
        for j, m in enumerate(msgs):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise HeldoutFormatError(f"{where}: messages[{j}] must be an object with string 'role' and 'content'")
            clean.append({"role": m["role"], "content": m["content"]})
        return HeldoutPrompt(id=pid, category=cat, messages=clean)
    key = given[0]
    if not isinstance(rec[key], str):
        raise HeldoutFormatError(f"{where}: '{key}' must be a string")
    if key == "prompt":
        return HeldoutPrompt(id=pid, category=cat, messages=[{"role": "user", "content": rec[key]}])
    return HeldoutPrompt(id=pid, category=cat, text=rec[key])


def _check_unique(prompts: list[HeldoutPrompt], where: str) -> None:
    seen: set[str] = set()
    for p in prompts:
        if p.id in seen:
            raise HeldoutFormatError(f"{where}: duplicate prompt id {p.id!r}")
        seen.add(p.id)


def prompt_token_ids(prompt: HeldoutPrompt, tokenizer) -> list[int]:
    """Token ids that the models see for ``prompt``.

    ``messages`` go through the tokenizer's chat template (with ``add_generation_prompt=True``)
    when it has one; without a template the message contents are joined with newlines and
    tokenized like text. ``text`` is tokenized with the tokenizer's default special tokens
    (e.g. BOS), without a chat template.

    Args:
        prompt: the held-out prompt.
        tokenizer: a ``transformers`` tokenizer.
    Returns:
        list of int token ids (may be empty for an empty text prompt with no BOS).
    """
    if prompt.messages is not None:
        if getattr(tokenizer, "chat_template", None):
            rendered = tokenizer.apply_chat_template(prompt.messages, tokenize=False, add_generation_prompt=True)
            return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])
        text = "\n".join(m["content"] for m in prompt.messages)
    else:
        text = prompt.text or ""
    return list(tokenizer(text)["input_ids"])

