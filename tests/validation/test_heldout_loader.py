"""Held-out sets: the shipped copies, user JSONL files and loader errors."""

from __future__ import annotations

import gzip
import hashlib
import json
from importlib import resources
from pathlib import Path

import pytest

from specdec.validation.heldout import (
    SPEC_BENCH_CATEGORIES,
    HeldoutFormatError,
    HeldoutPrompt,
    load_heldout,
    prompt_token_ids,
)
from tests.support.models import tiny_tokenizer

DATA = Path(str(resources.files("specdec").joinpath("data/heldout")))
SPEC_BENCH_SHA256 = "4b6d33e79484f9841c487ee87d1cf6aa8c6066f61d5d482ff09e5a007fafdf04"
HUMANEVAL_SHA256 = "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef"


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_shipped_files_are_byte_for_byte_copies_with_licences():
    spec = DATA / "spec_bench" / "question.jsonl"
    he = DATA / "humaneval" / "HumanEval.jsonl.gz"
    assert hashlib.sha256(spec.read_bytes()).hexdigest() == SPEC_BENCH_SHA256
    assert hashlib.sha256(he.read_bytes()).hexdigest() == HUMANEVAL_SHA256
    assert "Apache License" in (DATA / "spec_bench" / "LICENSE").read_text()
    assert "MIT License" in (DATA / "humaneval" / "LICENSE").read_text()
    for d in ("spec_bench", "humaneval"):
        assert "first turn" in (DATA / "spec_bench" / "ATTRIBUTION.md").read_text()
        assert (DATA / d / "ATTRIBUTION.md").read_text().count("Snapshot commit") == 1


def test_spec_bench_six_categories_first_turn_only():
    hs = load_heldout("spec_bench")
    assert hs.name == "spec_bench" and len(hs) == 480
    assert hs.category_counts() == {c: 80 for c in sorted(SPEC_BENCH_CATEGORIES)}
    first = json.loads((DATA / "spec_bench" / "question.jsonl").read_text().splitlines()[0])
    p = hs.prompts[0]
    assert p.id == str(first["question_id"]) and p.category == "mt_bench"
    assert p.source_category == first["category"] == "writing"
    assert p.messages == [{"role": "user", "content": first["turns"][0]}]  # turn 2 dropped
    assert len(hs.version) == 64 and hs.version == load_heldout("spec_bench").version


def test_humaneval_and_combined():
    he = load_heldout("humaneval")
    assert len(he) == 164 and he.categories == ["code"]
    assert he.prompts[0].id == "HumanEval/0" and he.prompts[0].text.startswith("from typing import List")
    both = load_heldout("spec_bench+humaneval")
    assert len(both) == 644 and len(both.categories) == 7
    assert both.version not in (he.version, load_heldout("spec_bench").version)


def test_user_jsonl_prompt_messages_text_and_gzip(tmp_path):
    lines = [
        json.dumps({"id": "a", "category": "x", "prompt": "hello"}),
        "",  # blank lines are allowed
        json.dumps({"id": 2, "category": "y", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}),
        json.dumps({"id": "c", "category": "x", "text": "def f():"}),
    ]
    hs = load_heldout(_write(tmp_path / "mine.jsonl", lines))
    assert hs.name == "mine" and [p.id for p in hs.prompts] == ["a", "2", "c"]
    assert hs.prompts[0].messages == [{"role": "user", "content": "hello"}]
    assert hs.prompts[1].messages[0]["role"] == "system" and hs.prompts[2].text == "def f():"
    gz = tmp_path / "mine.jsonl.gz"
    gz.write_bytes(gzip.compress((tmp_path / "mine.jsonl").read_bytes()))
    assert load_heldout(gz).version == hs.version


def test_version_is_content_hash_not_formatting(tmp_path):
    a = _write(tmp_path / "a.jsonl", ['{"id": "1", "category": "x", "prompt": "hi"}', '{"id": "2", "category": "x", "prompt": "yo"}'])
    b = _write(tmp_path / "b.jsonl", ['{"prompt":"yo","category":"x","id":"2"}', '{"category": "x",  "prompt": "hi", "id": "1"}'])
    c = _write(tmp_path / "c.jsonl", ['{"id": "1", "category": "x", "prompt": "hi!"}', '{"id": "2", "category": "x", "prompt": "yo"}'])
    assert load_heldout(a).version == load_heldout(b).version
    assert load_heldout(a).version != load_heldout(c).version


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ('{"id": "x", "category": "c", "prompt": "p"', "invalid JSON"),
        ('["not", "an", "object"]', "expected a JSON object"),
        ('{"category": "c", "prompt": "p"}', "missing key 'id'"),
        ('{"id": "x", "prompt": "p"}', "missing key 'category'"),
        ('{"id": "x", "category": "c"}', "need exactly one of"),
        ('{"id": "x", "category": "c", "prompt": "p", "text": "t"}', "more than one"),
        ('{"id": "x", "category": "c", "messages": [{"role": "user"}]}', "messages[0]"),
        ('{"id": "x", "category": "c", "messages": []}', "non-empty list"),
        ('{"id": "x", "category": "c", "prompt": 3}', "'prompt' must be a string"),
        ('{"id": "x", "category": "", "prompt": "p"}', "non-empty string"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, bad_line, message):
    path = _write(tmp_path / "bad.jsonl", ['{"id": "ok1", "category": "c", "prompt": "fine"}', "", bad_line])
    with pytest.raises(HeldoutFormatError) as ei:
        load_heldout(path)
    assert f"{path}:3" in str(ei.value) and message in str(ei.value)


def test_duplicate_ids_empty_file_and_missing_file(tmp_path):
    dup = _write(tmp_path / "dup.jsonl", ['{"id": "1", "category": "c", "prompt": "a"}'] * 2)
    with pytest.raises(HeldoutFormatError, match="duplicate prompt id '1'"):
        load_heldout(dup)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(HeldoutFormatError, match="no prompts"):
        load_heldout(empty)
    with pytest.raises(FileNotFoundError, match="not a shipped set"):
        load_heldout(tmp_path / "nope.jsonl")
    with pytest.raises(FileNotFoundError):
        load_heldout("spec_bench_typo")


def test_prompt_tokens_use_chat_template_only_for_messages():
    tok = tiny_tokenizer()
    chat = HeldoutPrompt(id="1", category="c", messages=[{"role": "user", "content": "hi"}])
    text = HeldoutPrompt(id="2", category="c", text="hi")
    ids = prompt_token_ids(chat, tok)
    assert tok.decode(ids) == "<user>hi</s><assistant>"
    assert tok.decode(prompt_token_ids(text, tok), skip_special_tokens=True) == "hi"
    no_template = tiny_tokenizer(chat_template=False)
    assert no_template.decode(prompt_token_ids(chat, no_template), skip_special_tokens=True) == "hi"
    assert HeldoutPrompt(id="3", category="c", text="  \n").is_empty
    assert HeldoutPrompt(id="4", category="c", messages=[{"role": "user", "content": ""}]).is_empty


def test_every_bad_line_at_once_and_a_misspelt_key_is_named(tmp_path):
    """issue 32, first use: ``"promt"`` was reported as "missing prompt" without naming the unknown key,
    one bad line at a time."""
    lines = ['{"id": "a", "category": "c", "promt": "p"}', '{"id": "b", "category": "c", "prompt": "ok"}',
             '{"id": "c", "category": "c"', '{"idd": "d", "category": "c", "prompt": "p"}']
    f = tmp_path / "h.jsonl"
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(HeldoutFormatError) as ei:
        load_heldout(f)
    msg = str(ei.value)
    assert msg.startswith("3 bad lines: ") and f"{f}:1:" in msg and f"{f}:3:" in msg and f"{f}:4:" in msg, msg
    assert "unknown key 'promt': did you mean 'prompt'?" in msg and "unknown key 'idd': did you mean 'id'?" in msg
