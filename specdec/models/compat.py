"""Draft/target pair compatibility: do token ids mean the same tokens on both sides?"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec.models.load import LoadedModel


#: Texts both tokenizers must encode to the same ids and decode to the same text.
PROBE_TEXTS = (
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "  leading spaces, tabs\tand\nnewlines\n\n  ",
    "Numbers: 0 1 12 123 1234 3.14159 -42 1e-5 100,000",
    "def f(x):\n    return {'a': [x ** 2 for x in range(10)]}  # code",
    "Ünïcödé: café, naïve, 東京, Привет, مرحبا, 😀🚀",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "</s><s>[INST] <<SYS>> hi <</SYS>> [/INST]",
)
_SPECIAL = ("bos", "eos", "pad", "unk")


class IncompatiblePairError(ValueError):
    """Draft and target cannot be paired: ids do not mean the same tokens on both sides.

    Attributes:
        problems: one human-readable line per mismatch (vocabulary, special tokens, token text,
            embedding size).
    """

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("incompatible draft/target pair: " + "; ".join(self.problems))


@dataclass
class CompatibilityResult:
    """Outcome of :func:`check_pair_compatible`.

    Attributes:
        compatible: True when the draft may be used with the target.
        shared_vocab_size: ids ``[0, shared_vocab_size)`` exist in both models' output layers
            (``min`` of the config vocab sizes); the draft must only propose ids below it and
            target/draft rows beyond it get probability 0.
        target_vocab_size, draft_vocab_size: rows of each model's embedding/LM head (config).
        tokenizer_vocab_size: ``len(tokenizer)`` (identical on both sides when compatible).
        notes: non-fatal observations (padded rows, differing chat templates, ...).
        problems: the mismatches found (empty when compatible).
    """

    compatible: bool
    shared_vocab_size: int
    target_vocab_size: int
    draft_vocab_size: int
    tokenizer_vocab_size: int = 0
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON-serialisable dict of all fields."""
        from dataclasses import asdict

        return asdict(self)


def _config_vocab_size(config) -> int | None:
    if config is None:
        return None
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    return getattr(config, "vocab_size", None)


def _fmt_ids(diffs: list[tuple[int, str | None, str | None]], limit: int = 5) -> str:
    shown = ", ".join(f"id {i}: target {t!r} vs draft {d!r}" for i, t, d in diffs[:limit])
    more = f" (+{len(diffs) - limit} more)" if len(diffs) > limit else ""
    return shown + more


def check_pair_compatible(target_tokenizer, draft_tokenizer, target_config, draft_config, *,
                          strict: bool = True, target_generation_config=None,
                          draft_generation_config=None) -> CompatibilityResult:
    """Check that a draft model can propose tokens for a target model (same ids, same tokens).

    Speculative decoding (Leviathan et al. 2022) compares p and q id by id, so every id the draft
    can propose must denote the same token for the target. Checked, in order:

    1. vocabulary: ``len(tokenizer)`` equal and every id maps to the same token string
       (``get_vocab()``, added tokens included); the first differing ids are named;
    2. special tokens: bos/eos/pad/unk ids equal;
    3. token text: :data:`PROBE_TEXTS` encode to the same ids and decode to the same text on both
       sides (catches different normalizers, pre-tokenizers or merges over the same vocabulary);
    4. embedding rows: the tokenizer vocabulary fits in both configs' ``vocab_size``. Padded rows
       are allowed (e.g. target 103 rows, draft 110): ``shared_vocab_size = min`` of the two;
    5. what can make a compatible-looking pair fail or mislead mid-run: the end-of-sequence ids the
       model configs (and generation configs, when given) declare must agree (a draft trained to
       stop on another id keeps proposing past the target's EOS, or stops drafting where the target
       goes on), and a ``bos_token_id`` that differs is a problem too. Noted, not refused: a draft
       with a shorter context than the target (decoding refuses prompts beyond it up front), a
       sliding-window draft (batched decoding refuses it), and draft embedding rows fewer than the
       target's (a target id beyond them stops decoding with an error).

    Args:
        target_tokenizer, draft_tokenizer: ``transformers`` tokenizers.
        target_config, draft_config: model configs (``vocab_size`` = embedding rows), or None to
            use ``len(tokenizer)``.
        target_generation_config, draft_generation_config: the models' ``generation_config`` (their
            ``eos_token_id`` is what generation stops on), or None.
        strict: raise on a mismatch (default); if False return ``compatible=False`` with ``problems``.
    Returns:
        :class:`CompatibilityResult`.
    Raises:
        IncompatiblePairError: a mismatch was found and ``strict`` is True.
    """
    problems: list[str] = []
    notes: list[str] = []
    t_len, d_len = len(target_tokenizer), len(draft_tokenizer)
    same_vocabulary = _check_vocabulary(target_tokenizer, draft_tokenizer, problems)  # 1.
    _check_special_tokens(target_tokenizer, draft_tokenizer, problems, notes)  # 2.
    if same_vocabulary:  # 3. (token text is only meaningful once the vocabularies agree)
        _check_token_text(target_tokenizer, draft_tokenizer, problems)
    if getattr(target_tokenizer, "chat_template", None) != getattr(draft_tokenizer, "chat_template", None):
        notes.append("chat templates differ (prompts are built with the target's template)")

    # 4. embedding rows
    t_rows = _config_vocab_size(target_config) or t_len
    d_rows = _config_vocab_size(draft_config) or d_len
    for who, rows, tok_len in (("target", t_rows, t_len), ("draft", d_rows, d_len)):
        if tok_len > rows:
            problems.append(f"{who} tokenizer has {tok_len} ids but the {who} model has only "
                            f"{rows} embedding rows (config.vocab_size)")
    shared = min(t_rows, d_rows)
    if t_rows != d_rows:
        notes.append(f"padded embedding rows: target {t_rows}, draft {d_rows}; ids >= {shared} get "
                     f"probability 0 and are never proposed (tokenizer has {t_len} ids)")
    _check_runtime_properties(target_config, draft_config, target_generation_config, draft_generation_config,
                              problems, notes)

    result = CompatibilityResult(
        compatible=not problems, shared_vocab_size=shared, target_vocab_size=t_rows,
        draft_vocab_size=d_rows, tokenizer_vocab_size=t_len, notes=notes, problems=problems)
    if problems and strict:
        err = IncompatiblePairError(problems)
        err.result = result
        raise err
    return result


def _check_vocabulary(target_tokenizer, draft_tokenizer, problems: list[str]) -> bool:
    """Step 1 of :func:`check_pair_compatible`: sizes and every id's token string. True when every id agrees."""
    t_len, d_len = len(target_tokenizer), len(draft_tokenizer)
    t_vocab = {i: tok for tok, i in target_tokenizer.get_vocab().items()}
    d_vocab = {i: tok for tok, i in draft_tokenizer.get_vocab().items()}
    if t_len != d_len:
        problems.append(f"tokenizer vocabulary sizes differ: target {t_len} ids, draft {d_len} ids")
    diffs = [(i, t_vocab.get(i), d_vocab.get(i))
             for i in sorted(set(t_vocab) | set(d_vocab)) if t_vocab.get(i) != d_vocab.get(i)]
    if diffs:
        problems.append(f"tokenizer vocabulary differs at {len(diffs)} ids: {_fmt_ids(diffs)}")
    return not diffs


def _check_special_tokens(target_tokenizer, draft_tokenizer, problems: list[str], notes: list[str]) -> None:
    """Step 2 of :func:`check_pair_compatible`: bos/eos/pad/unk ids equal (a problem), special-id sets (a note)."""
    for name in _SPECIAL:
        t_id = getattr(target_tokenizer, f"{name}_token_id", None)
        d_id = getattr(draft_tokenizer, f"{name}_token_id", None)
        if t_id != d_id:
            problems.append(
                f"special token {name} differs: target id {t_id} "
                f"({getattr(target_tokenizer, f'{name}_token', None)!r}) vs draft id {d_id} "
                f"({getattr(draft_tokenizer, f'{name}_token', None)!r})")
    if set(target_tokenizer.all_special_ids) != set(draft_tokenizer.all_special_ids):
        notes.append(f"special-token sets differ: target {sorted(target_tokenizer.all_special_ids)}"
                     f" vs draft {sorted(draft_tokenizer.all_special_ids)}")


def _check_token_text(target_tokenizer, draft_tokenizer, problems: list[str]) -> None:
    """Step 3 of :func:`check_pair_compatible`: :data:`PROBE_TEXTS` encode to the same ids and decode to the same
    text on both sides; the first difference found is the problem."""
    for text in PROBE_TEXTS:
        t_ids = target_tokenizer.encode(text, add_special_tokens=False)
        d_ids = draft_tokenizer.encode(text, add_special_tokens=False)
        if t_ids != d_ids:
            first = next((j for j, (a, b) in enumerate(zip(t_ids, d_ids)) if a != b), min(len(t_ids), len(d_ids)))
            problems.append(
                f"token text: {text[:30]!r}... tokenizes differently (first difference at "
                f"position {first}: target {t_ids[first:first + 3]} vs draft {d_ids[first:first + 3]})")
            return
        t_txt, d_txt = target_tokenizer.decode(t_ids), draft_tokenizer.decode(t_ids)
        if t_txt != d_txt:
            problems.append(f"token text: ids {t_ids[:6]}... decode to {t_txt[:30]!r} on the "
                            f"target but {d_txt[:30]!r} on the draft")
            return


def _ids(value) -> frozenset[int]:
    """An id or list of ids (or None) as a set."""
    if value is None:
        return frozenset()
    if isinstance(value, (list, tuple, set, frozenset)):
        return frozenset(int(v) for v in value)
    return frozenset([int(value)])


def _check_runtime_properties(target_config, draft_config, target_gen, draft_gen, problems: list[str],
                              notes: list[str]) -> None:
    """Step 5 of :func:`check_pair_compatible`: stop ids, context, sliding window, embedding rows."""
    for where, t_cfg, d_cfg in (("config", target_config, draft_config), ("generation_config", target_gen, draft_gen)):
        for attr in ("eos_token_id", "bos_token_id"):
            t_v, d_v = _ids(getattr(t_cfg, attr, None)), _ids(getattr(d_cfg, attr, None))
            if t_v and d_v and t_v != d_v:
                problems.append(f"{where} {attr} differs: target {sorted(t_v)}, draft {sorted(d_v)} (the draft "
                                f"would {'stop' if attr == 'eos_token_id' else 'start'} on a different token than the target)")
    t_ctx = getattr(target_config, "max_position_embeddings", None)
    d_ctx = getattr(draft_config, "max_position_embeddings", None)
    if t_ctx and d_ctx and d_ctx < t_ctx:
        notes.append(f"the draft's context ({d_ctx} tokens) is shorter than the target's ({t_ctx}): prompt + "
                     f"max_new_tokens + k beyond {d_ctx} tokens is refused")
    window = getattr(draft_config, "sliding_window", None)
    if window and getattr(draft_config, "use_sliding_window", True) is not False:
        notes.append(f"the draft uses sliding-window attention ({window} tokens): batched decoding refuses it")
    t_rows, d_rows = _config_vocab_size(target_config), _config_vocab_size(draft_config)
    if t_rows and d_rows and d_rows < t_rows:
        notes.append(f"the draft embeds only {d_rows} ids, the target scores {t_rows}: a target token id >= {d_rows} "
                     "stops decoding with an error")


def check_loaded_pair(target: LoadedModel, draft: LoadedModel, *, strict: bool = True) -> CompatibilityResult:
    """:func:`check_pair_compatible` on two :class:`LoadedModel` (their tokenizers and configs).

    Raises:
        IncompatiblePairError: as :func:`check_pair_compatible`.
    """
    return check_pair_compatible(target.tokenizer, draft.tokenizer, target.model.config, draft.model.config,
                                 strict=strict, target_generation_config=getattr(target.model, "generation_config", None),
                                 draft_generation_config=getattr(draft.model, "generation_config", None))
