"""The engine-profile registry and the profile logic that needs no engine: one registry every engine list
comes from, llama.cpp's declared rule, the identity comparison, the deadlines' range check, impossible counters."""

from __future__ import annotations

import math

import pytest

from specdec.core.config import DRAFT_SAMPLING_RULES
from specdec.engines.answers import EngineCounters
from specdec.engines.errors import EngineAnswerError
from specdec.engines.profile import EngineLimits, PairIdentity, ProposalRule
from specdec.engines.profiles import (DEFAULT_ENGINE, ENGINE_PROFILES, checkable_names, engine_for_rule, engine_names,
                                      engine_profile, offline_names)


def test_every_engine_list_comes_from_the_one_registry():
    from monitoring.production.engines import ENGINES as PRODUCTION_METRICS
    from monitoring.production.settings import ENGINE_NAMES
    from specdec.validation.serving import ENGINES

    assert ENGINES == engine_names() == ("vllm", "sglang", "transformers", "llamacpp")
    assert ENGINE_NAMES == tuple(PRODUCTION_METRICS) == ("vllm", "sglang", "llamacpp")
    assert set(ENGINE_NAMES) == {n for n, p in ENGINE_PROFILES.items() if p.metrics is not None}
    assert checkable_names() == ("vllm", "llamacpp") and offline_names() == ("vllm",)
    for name, p in ENGINE_PROFILES.items():
        assert p.name == name and p.draft_sampling in DRAFT_SAMPLING_RULES
        assert p.metrics is None or PRODUCTION_METRICS[name] is p.metrics
    assert engine_profile("transformers").draft_sampling == "sampled"
    with pytest.raises(ValueError, match="unknown engine 'tgi'; use one of vllm, sglang, transformers, llamacpp"):
        engine_profile("tgi")
    with pytest.raises(ValueError, match="cannot ask SGLang"):
        engine_profile("sglang").connect(None, EngineLimits())


def test_one_default_engine_and_aliases_name_the_profile():
    """llama.cpp is the default wherever no engine is named (it runs on a fresh CPU machine: docs/engine-check.md);
    an endpoint without an engine is the default's, an alias names its profile."""
    from specdec.engines.profile import EngineEndpoint
    from monitoring.production.settings import ProductionSource

    assert DEFAULT_ENGINE == "llamacpp" and engine_profile(None).name == DEFAULT_ENGINE
    assert engine_profile(EngineEndpoint(url="http://127.0.0.1:1").engine).name == DEFAULT_ENGINE
    assert engine_profile("llama-server").name == engine_profile("llama.cpp").name == "llamacpp"
    assert ProductionSource(name="s", url="http://127.0.0.1:1").engine == DEFAULT_ENGINE
    # a pair that names no engine is served by the first engine with its rule that serves its kind
    from specdec.kinds import EAGLE3, LAYERSKIP

    assert engine_for_rule("argmax") == "vllm" and engine_for_rule("sampled") == "transformers"
    assert engine_for_rule("sampled", EAGLE3) == "vllm" and engine_for_rule("argmax", LAYERSKIP) == "transformers"


#: product modules where an engine name is a Python package's name, not an engine's (pip/version lists)
PACKAGE_NAME_USES = {"specdec/engines/vllm_install.py": 1, "specdec/models/resolve.py": 1, "flows/finetune.py": 1}


def _engine_name_literals() -> dict[str, list[int]]:
    """``"path": [line, ...]`` of every string literal in the product equal to an engine profile's name (docstrings
    and a profile class's own ``name`` / ``title`` left out), read with ``ast``."""
    import ast
    from pathlib import Path

    root, names, out = Path(__file__).resolve().parents[1], set(ENGINE_PROFILES), {}
    for pkg in ("specdec", "registry", "monitoring", "flows"):
        for path in sorted((root / pkg).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            tree, skip = ast.parse(path.read_text()), set()
            for node in ast.walk(tree):
                body = getattr(node, "body", None)
                if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                        and isinstance(body[0].value, ast.Constant):
                    skip.add(id(body[0].value))  # a docstring
                if isinstance(node, ast.ClassDef):
                    skip |= {id(a.value) for a in node.body if isinstance(a, ast.Assign)
                             and [getattr(t, "id", None) for t in a.targets] in (["name"], ["title"])}
            lines = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in names
                     and id(n) not in skip]
            if lines:
                out[path.relative_to(root).as_posix()] = lines
    return out


def test_engine_names_are_listed_once_and_defaults_come_from_the_registry():
    """Every engine list, default and help text is derived from the profiles: no product module spells an engine
    name (its profile class does, once), and one constant is the default engine (DEFAULT_ENGINE)."""
    import ast
    from pathlib import Path

    found = _engine_name_literals()
    assert {p: len(v) for p, v in found.items()} == PACKAGE_NAME_USES, found
    root = Path(__file__).resolve().parents[1]
    defaults = [p.relative_to(root).as_posix() for pkg in ("specdec", "registry", "monitoring", "flows")
                for p in sorted((root / pkg).rglob("*.py")) for n in ast.walk(ast.parse(p.read_text()))
                if isinstance(n, (ast.Assign, ast.AnnAssign))
                and "DEFAULT_ENGINE" in [getattr(t, "id", None) for t in getattr(n, "targets", [getattr(n, "target", None)])]]
    assert defaults == ["specdec/engines/profiles.py"]


def test_the_literal_count_sees_an_engine_name():
    """The count above can fail: a module spelling ``"vllm"`` is found."""
    import ast

    tree = ast.parse('"""vllm"""\nx = {"vllm": 1}\nclass P:\n    name = "vllm"\n')
    assert [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value == "vllm"] == [1, 2, 4]
    assert _engine_name_literals().get("specdec/engines/vllm.py") is None  # its profile's name is not counted


def test_every_profile_owns_a_complete_module_level_serving_table():
    """Serving is each engine's table (keyed by the kind): a module-level KindTable, so the drafter-kind suite's
    exhaustiveness tests cover it; which kinds an engine serves and where tau applies are the profile's answers."""
    import sys

    from specdec.kinds import EAGLE3, LAYERSKIP, MODEL, NGRAM, KindTable

    for p in ENGINE_PROFILES.values():
        table = type(p).serving_table
        assert isinstance(table, KindTable) and table.missing() == []
        assert any(v is table for v in vars(sys.modules[type(p).__module__]).values())
    served = {name: [k.name for k in (NGRAM, EAGLE3, LAYERSKIP, MODEL) if p.serves(k)] for name, p in ENGINE_PROFILES.items()}
    assert served == {"vllm": ["ngram", "eagle3", "model"], "sglang": ["ngram", "eagle3", "model"],
                      "transformers": ["ngram", "layerskip", "model"], "llamacpp": ["model"]}
    assert [n for n, p in ENGINE_PROFILES.items() if p.tau_applies(MODEL)] == ["transformers"]
    assert not engine_profile("transformers").tau_applies(NGRAM)


def test_llamacpp_reads_the_rule_its_declared_flags_serve():
    p, k4 = engine_profile("llamacpp"), ProposalRule(4, drafts_past_stop=True)
    base = ["llama-server", "-m", "t.gguf", "--spec-type", "draft-simple", "--spec-draft-model", "d.gguf"]
    assert p.served_rule({"flags": base + ["--spec-draft-n-max", "4"]}, k4).drafts_less_than(k4) == []
    assert p.served_rule({"flags": base}, k4).num_speculative_tokens == 3  # llama.cpp's default n_max
    raised = p.served_rule({"flags": base + ["--spec-draft-n-max", "4", "--spec-draft-p-min=0.8"]}, k4)
    assert raised.drafts_less_than(k4) == ["a drafting threshold p_min 0.8 > the validated 0"]
    off = p.served_rule({"flags": ["llama-server", "-m", "t.gguf"]}, k4)
    assert off.drafts_less_than(k4) == ["drafting is off"]
    assert p.served_rule({"speculative": False}, k4).num_speculative_tokens == 0  # /slots: no slot speculates
    assert p.served_rule({}, k4) is None  # nothing declared
    synth = p.served_rule({"flags": base + ["--spec-synth-len", "3"]}, k4)
    assert synth.synthetic == "--spec-synth-len 3" and "--spec-synth-len" in p.refusal({"flags": base + ["--spec-synth-len", "3"]})
    assert p.refusal({"flags": base}) is None


def test_identity_compares_hashes_first_then_file_names_and_the_vocabulary():
    p = engine_profile("llamacpp")
    pair = PairIdentity(target_file="t.gguf", target_sha256="a" * 64, draft_file="d.gguf", draft_sha256="b" * 64,
                        vocab_size=49152, model_vocab_size=49152, bos_token="<|im_start|>", eos_token="<|im_end|>")
    same = {"model_path": "/srv/t-renamed.gguf", "model_sha256": "a" * 64, "draft_path": "/x/d.gguf",
            "draft_sha256": "b" * 64, "vocab_size": 49152, "bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}
    assert p.identity_mismatches(same, pair) == {}  # a renamed file with the same bytes is the same file
    other = {**same, "draft_sha256": "c" * 64, "vocab_size": 32000}
    got = p.identity_mismatches(other, pair)
    assert set(got) == {"draft", "vocab_size"} and "the engine serves draft d.gguf (sha256 cccccccccccc)" in got["draft"]
    by_name = p.identity_mismatches({"model_path": "/srv/other.gguf"}, PairIdentity(target_file="t.gguf"))
    assert by_name == {"target": "the engine serves target other.gguf, the pair's target is t.gguf (by file name; the "
                                 "engine's file is not readable here to hash)"}


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, True, "10"])
def test_deadlines_are_range_checked(bad):
    with pytest.raises(ValueError, match="must be a finite number of seconds > 0"):
        EngineLimits(request_timeout_s=bad)


def test_impossible_counters_are_refused():
    EngineCounters(drafts=3, draft_tokens=12, accepted=7, per_position=[3, 2, 2, 0]).check()
    for bad, why in ((EngineCounters(3, 12, 13, None), "13 accepted of 12 drafted"),
                     (EngineCounters(13, 12, 1, None), "13 drafts but 12 drafted tokens"),
                     (EngineCounters(3, 12, 5, [1, 2, 2, 0]), "a later position cannot accept more"),
                     (EngineCounters(3, 12, 5, [3, 1, 0, 0]), "sum to 4, not to the 5 accepted")):
        with pytest.raises(EngineAnswerError, match=why):
            bad.check()
    with pytest.raises(EngineAnswerError, match="went down during the run"):
        EngineCounters(1, 4, 2, None).minus(EngineCounters(2, 8, 3, None))
