"""Every drafter wrapper has every member of the drafter protocol as a real (static) member.

Since Python 3.12, ``isinstance(x, Drafter)`` (a runtime-checkable ``Protocol``) looks members up with
``inspect.getattr_static``, which never calls ``__getattr__``: a wrapper that forwarded ``model`` or
``adopt_prefix`` through ``__getattr__`` was a drafter on 3.11 and "lacks members of the drafter protocol" on
3.12 (issue 39: ``validate --method both`` crashed there). These checks use ``getattr_static`` themselves, so
they fail on any Python, 3.11 included, when a wrapper forwards a protocol member dynamically.
"""

from __future__ import annotations

import ast
import inspect
import typing
from pathlib import Path

import pytest
import torch

from specdec.core.drafters import Drafter, DrafterWrapper, ModelDrafter, NgramDrafter, as_drafter, unwrap_drafter
from tests.support.models import tiny_llama

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("specdec", "benchmarks", "flows", "registry", "monitoring")


def protocol_members() -> set[str]:
    """The members ``isinstance(x, Drafter)`` checks (3.12+: ``__protocol_attrs__``; 3.11: the same set)."""
    attrs = getattr(Drafter, "__protocol_attrs__", None)
    return set(attrs) if attrs is not None else set(typing._get_protocol_attrs(Drafter))


def wrapper_classes() -> list[type]:
    """Every drafter wrapper in the product and the benchmarks: the known ones, whatever their base class, and
    every subclass of :class:`DrafterWrapper` (a new one is found once its module is imported here)."""
    from benchmarks.perf_methods import StepRecorder
    from specdec.validation.replay import RecordingDrafter

    out, todo = [RecordingDrafter, StepRecorder], [DrafterWrapper]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo.extend(cls.__subclasses__())
    return list(dict.fromkeys(out))


def test_protocol_members_are_the_documented_ones():
    assert protocol_members() == {"forward_passes", "target_layer_ids", "model", "start", "propose", "accept", "select",
                                  "can_adopt_prefix", "adopt_prefix"}


def test_known_wrappers_are_found():
    names = {c.__name__ for c in wrapper_classes()}
    assert {"DrafterWrapper", "RecordingDrafter", "StepRecorder"} <= names


@pytest.mark.parametrize("inner_kind", ["ngram", "model"])
def test_every_wrapper_has_every_protocol_member_statically(inner_kind):
    inner = NgramDrafter() if inner_kind == "ngram" else ModelDrafter(tiny_llama(50, seed=0))
    for cls in wrapper_classes():
        w = cls(inner)
        missing = []
        for name in sorted(protocol_members()):
            try:
                inspect.getattr_static(w, name)
            except AttributeError:
                missing.append(name)
        assert not missing, f"{cls.__qualname__} reaches {missing} only dynamically (3.12 isinstance fails)"
        assert isinstance(w, Drafter) and as_drafter(w) is w
        assert w.model is inner.model and w.target_layer_ids is inner.target_layer_ids
        assert unwrap_drafter(w) is inner


def test_no_drafter_class_defines_getattr():
    """No class that drafts (defines ``propose``) forwards through ``__getattr__`` (the ast of every source)."""
    offenders = []
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef):
                    methods = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
                    if "propose" in methods and "__getattr__" in methods:
                        offenders.append(f"{path.relative_to(ROOT)}:{node.name}")
    assert not offenders


def test_wrapper_forwards_state_and_decodes_identically():
    """A wrapped model drafter decodes token-identically and its pass counter is the inner one's."""
    from specdec import SamplingConfig, speculative_generate
    from specdec.validation.replay import RecordingDrafter

    target = tiny_llama(60, seed=1).eval()
    prompt = torch.tensor([[1, 5, 6, 7, 5, 6]])
    greedy = SamplingConfig(temperature=0.0)
    inner = ModelDrafter(tiny_llama(60, seed=2).eval())
    rec = RecordingDrafter(inner)
    a = speculative_generate(target, rec, prompt, num_speculative_tokens=3, max_new_tokens=12, sampling=greedy)
    b = speculative_generate(target, tiny_llama(60, seed=2).eval(), prompt, num_speculative_tokens=3,
                             max_new_tokens=12, sampling=greedy)
    assert a.token_ids == b.token_ids
    assert rec.forward_passes == inner.forward_passes > 0 and rec.blocks
    rec.forward_passes = 0
    assert inner.forward_passes == 0

