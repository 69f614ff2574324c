"""Small input edges of validation (issue 25, item 7): a held-out file saved with a UTF-8 BOM loads
like the same file without one; a category with one prompt has no CI ("not estimable") instead of a
single point presented as an interval; the terminal table says so."""

from __future__ import annotations

import json
import math

from tests.support.models import perturbed_copy, tiny_llama, tiny_tokenizer
from specdec.validation import ValidationConfig, ValidationRequest, validate
from specdec.validation.cli import _ci
from specdec.validation.heldout import load_heldout
from specdec.validation.metrics import bootstrap_ratio_ci

RECORDS = [{"id": f"c{i}", "category": "chat", "text": f"hello there number {i} abc def"} for i in range(6)]
RECORDS.append({"id": "lonely", "category": "solo", "text": "only prompt of its category ghi"})


def _write(path, bom: bool):
    text = "\n".join(json.dumps(r) for r in RECORDS) + "\n"
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))
    return path


def test_a_bom_file_loads_like_the_same_file_without_one(tmp_path):
    """Before: HeldoutFormatError "invalid JSON (Expecting value at column 1)" on line 1."""
    with_bom = load_heldout(_write(tmp_path / "bom.jsonl", bom=True))
    plain = load_heldout(_write(tmp_path / "plain.jsonl", bom=False))
    assert with_bom.version == plain.version and [p.id for p in with_bom.prompts] == [p.id for p in plain.prompts]


def test_one_prompt_gives_no_ci_not_a_point():
    assert all(math.isnan(x) for x in bootstrap_ratio_ci([3], [4]))
    lo, hi = bootstrap_ratio_ci([3, 1], [4, 4])
    assert lo < hi


def test_a_one_prompt_category_reports_its_ci_as_not_estimable(tmp_path):
    target = tiny_llama(seed=0)
    heldout = load_heldout(_write(tmp_path / "bom.jsonl", bom=True))
    cfg = ValidationConfig(num_speculative_tokens=3, max_new_tokens=8, bootstrap_resamples=200)
    [rep] = validate(ValidationRequest(target, [perturbed_copy(target, scale=0.03)], heldout, cfg, tokenizer=tiny_tokenizer()))
    solo, chat = rep.categories["solo"], rep.categories["chat"]
    assert solo.num_prompts == 1 and not math.isnan(solo.acceptance_rate)
    assert all(math.isnan(x) for x in solo.acceptance_rate_ci), solo.acceptance_rate_ci
    assert chat.acceptance_rate_ci[0] <= chat.acceptance_rate <= chat.acceptance_rate_ci[1]
    assert _ci(solo.acceptance_rate, solo.acceptance_rate_ci).endswith("[CI not estimable]")
