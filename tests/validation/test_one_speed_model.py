"""One speed model: exactly one function in the product predicts a speedup, and every consumer
(report groups, the replayed curve, recommend, the nightly's validate) picks the same k from
the same counters and costs."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.models import perturbed_copy, tiny_llama, tiny_tokenizer
from specdec.validation.aggregate import REPLAY_BASIS, predict
from specdec.validation.config import ValidationConfig
from specdec.validation.continuation_cache import ContinuationCache
from specdec.validation.heldout import HeldoutPrompt, HeldoutSet, content_version
from specdec.validation.recommend import CandidateResult, _choose_k
from specdec.validation.replay_curve import recommend_from_curve, row_counters
from specdec.validation.api import ValidationRequest, validate
from specdec.validation.report import GroupMetrics
from specdec.validation.speed import StepCounters, VerifyCost, best_k, predicted_speedup
from specdec.validation.timing import Calibration

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("specdec", "registry", "monitoring", "flows")
COST_NAMES = {"c", "cost_ratio", "c_hat", "draft_cost"}


def _names(node: ast.AST) -> set[str]:
    return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute))}


def _predicts_speedup(fn: ast.FunctionDef) -> bool:
    """A function that computes a predicted speedup: it multiplies a draft cost ratio by a token count
    and divides, or evaluates Leviathan's closed form (alpha ** (k + 1)), or is named like one."""
    if "speedup" in fn.name and ("predict" in fn.name or fn.name == "_speedup"):
        return True
    mult = [n for n in ast.walk(fn) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult)
            and (_names(n.left) & COST_NAMES or _names(n.right) & COST_NAMES)]
    div = any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) for n in ast.walk(fn))
    power = any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow) and "alpha" in _names(n.left)
                and isinstance(n.right, ast.BinOp) for n in ast.walk(fn))
    return bool(mult and div) or power


def test_exactly_one_function_in_the_product_predicts_a_speedup():
    found = []
    for pkg in PRODUCT:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for fn in ast.walk(tree):
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and _predicts_speedup(fn):
                    found.append(f"{path.relative_to(ROOT)}:{fn.name}")
    assert found == ["specdec/validation/speed.py:predicted_speedup"], found


def test_the_scan_would_find_a_second_model():
    src = "def s(alpha, c, k):\n    return (1 - alpha ** (k + 1)) / ((1 - alpha) * (c * k + 1))\n"
    assert _predicts_speedup(ast.parse(src).body[0])
    src = "def f(a, d, t, cost_ratio, v):\n    return (a + d) / (cost_ratio * t + v * d)\n"
    assert _predicts_speedup(ast.parse(src).body[0])


def _heldout() -> HeldoutSet:
    prompts = [HeldoutPrompt(id=f"p{i}", category=cat, messages=[{"role": "user", "content": text}])
               for i, (cat, text) in enumerate([
        ("chat", "the cat sat on the mat and the cat"), ("code", "def f(x): return x + x + x"),
        ("chat", "one two three one two three one"), ("code", "for i in range(10): print(i)")])]
    return HeldoutSet("toy", content_version(prompts), prompts)


@pytest.mark.parametrize("c, v_points", [(0.3, {1: 1.05, 2: 1.1, 4: 1.3, 8: 2.2}), (0.05, {1: 1.0, 8: 1.1})])
def test_report_replay_curve_recommend_and_nightly_pick_the_same_k(tmp_path, c, v_points):
    target, tok = tiny_llama(103, seed=0), tiny_tokenizer()
    draft = perturbed_copy(target, scale=0.05, seed=3)
    v = VerifyCost.fit(v_points)
    cal = Calibration(v, [c], 0.01)
    cfg = ValidationConfig(num_speculative_tokens=2, max_new_tokens=24)
    # the nightly's entry (validate, here replay only) with the run's costs
    rep = validate(ValidationRequest(target, [draft], _heldout(), cfg, method="replay", kmax=8, tokenizer=tok,
                                     cache=ContinuationCache(tmp_path), calibration=cal))[0]
    rows = rep.replay["acceptance_by_k"]
    by_k = {r["k"]: row_counters(r) for r in rows}
    k_model, s_model = best_k(by_k, c, v)  # the one function, directly
    assert rep.replay["recommended_num_speculative_tokens"] == k_model
    assert rep.overall.recommended_num_speculative_tokens == k_model and rep.overall.recommended_k_basis == REPLAY_BASIS
    assert recommend_from_curve([dict(r) for r in rows], c, v)["recommended_num_speculative_tokens"] == k_model
    cand = CandidateResult(spec="derived:x")
    _choose_k(cand, rep, c, v, list(range(1, 9)))  # recommend
    assert cand.k == k_model
    g = GroupMetrics(num_speculative_tokens=2)  # a report group given the same counters
    predict(g, by_k[2], v, c, counters_by_k=by_k)
    assert g.recommended_num_speculative_tokens == k_model and g.predicted_speedup_at_recommended == pytest.approx(s_model)
    assert g.predicted_speedup == pytest.approx(predicted_speedup(by_k[2], c, v))
    # the replayed rows are exact greedy counters: the prediction at k uses the steps as they ran
    assert by_k[2].steps - by_k[2].steps_by_proposed.get(0, 0) == rows[1]["num_drafts"]
    assert by_k[2].proposed == rows[1]["num_draft_tokens"] and isinstance(by_k[2], StepCounters)
