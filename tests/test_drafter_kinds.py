"""Drafter kinds as objects: no kind string is compared outside the kinds registry, and the registry
itself parses, checks, round-trips and keys every kind.

The source check is built with ``ast`` over every product module (nothing is imported but the
registry, whose labels and names define what a kind string is, so a fifth kind is covered the day
it is registered). A kind string is a stored label (``ngram``, ``derived:int8``, ``eagle3``,
``model``), a kind name (``derived``) or a spec prefix (``derived:``, ``eagle3:<...>``,
``ngram:<...>``, ``model:<...>``). Flagged: ``==``/``!=``/``in``/``not in``/``is`` against one (or a
tuple/list/set holding one), a string method call taking one (``startswith``, ``removeprefix``,
``replace``, ...), a dict literal keyed by them that is looked up on the spot (``{...}.get(kind)``,
``{...}[kind]``) and a ``match`` case on one. Precisions (``recipe.kind == "int4"``) are the derived
recipe's parameter, not kinds, and are not flagged.
"""

from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from specdec.kinds import (
    DERIVED,
    EAGLE3,
    LAYERSKIP,
    MODEL,
    NGRAM,
    DrafterKind,
    DrafterSpecError,
    KindTable,
    MissingKindEntry,
    RegisteredDrafter,
    ResolvedDrafter,
    draft_identity,
    drafter_parts,
    kind_of,
    kind_of_label,
    kinds,
    register,
    stored_labels,
)

from tests.support.store import model_store
from tests.support.registry import open_registry_at

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("specdec", "registry", "monitoring", "flows")
REGISTRY_PACKAGE = ROOT / "specdec" / "kinds"
NAMES = {k.name for k in kinds()}
LABELS = set(stored_labels()) | NAMES
STRING_METHODS = {"startswith", "endswith", "removeprefix", "removesuffix", "replace", "split", "rsplit", "partition",
                  "rpartition", "find", "rfind", "index", "count"}


def _is_kind_string(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        s = node.value
        return s in LABELS or (":" in s and s.partition(":")[0] in NAMES)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_kind_string(e) for e in node.elts)
    return False


def kind_comparisons(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` for every drafter-kind string comparison in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(_is_kind_string(x) for x in (node.left, *node.comparators)):
            found.append((node.lineno, "comparison"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in STRING_METHODS and any(_is_kind_string(a) for a in node.args):
                found.append((node.lineno, f".{node.func.attr}()"))
            elif node.func.attr == "get" and isinstance(node.func.value, ast.Dict) and \
                    any(k is not None and _is_kind_string(k) for k in node.func.value.keys):
                found.append((node.lineno, "dict dispatch"))
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Dict) and \
                any(k is not None and _is_kind_string(k) for k in node.value.keys):
            found.append((node.lineno, "dict dispatch"))
        elif isinstance(node, ast.MatchValue) and _is_kind_string(node.value):
            found.append((node.lineno, "match case"))
    return found


#: comparisons against a kind-looking string that are not about drafter kinds: (file, text on the line) -> reason
EXCEPTIONS = {
    ("specdec/models/eagle3/checkpoint.py", 'get("speculators_model_type") == "eagle3"'):
        "the speculators file format's own model-type field (what a config.json says it is), not our drafter kind",
    ("specdec/models/eagle3/config.py", 'get("speculators_model_type") != "eagle3"'):
        "the speculators file format's own model-type field, checked when a head config is read",
}


def _product_files() -> list[Path]:  # every product module but the kinds registry's
    return [p for pkg in PRODUCT for p in sorted((ROOT / pkg).rglob("*.py"))
            if REGISTRY_PACKAGE not in p.parents and "migrations" not in p.parts]


@pytest.mark.parametrize("snippet", [
    'if kind == "ngram": pass',
    'ok = "eagle3" != pv.drafter_kind',
    'x = kind in ("model", "other")',
    'x = spec.startswith("derived:")',
    'x = label.startswith(("eagle3:", "x"))',
    'x = spec.removeprefix("model:")',
    'x = draft.replace("derived:", "")',
    'x = r.kind == "derived:bf16"',
    'x = {"derived": 1, "eagle3": 2}.get(d, 0)',
    'x = {"ngram": 1}[kind]',
    'match kind:\n    case "eagle3":\n        pass',
])
def test_the_check_finds_a_kind_comparison(snippet):
    assert kind_comparisons(snippet), snippet


@pytest.mark.parametrize("snippet", [
    'x = recipe.kind == "int4"',  # a precision, the recipe's own parameter
    'x = ref.startswith("models:/")',  # an MLflow URI, not a kind
    'x = line.startswith("model name")',
    'x = {"model": m, "source": s}',  # a dict key written, not a dispatch on a kind
    'x = kind_of(spec).model_free',
    'x = ("derived:bf16", "ngram")',  # candidate specs listed, not compared
])
def test_the_check_leaves_other_strings_alone(snippet):
    assert kind_comparisons(snippet) == []


def test_no_drafter_kind_string_comparison_outside_the_registry():
    files = _product_files()
    assert len(files) > 100 and ROOT / "specdec" / "validation" / "serving.py" in files
    bad, used = [], set()
    for p in files:
        lines = p.read_text().splitlines()
        for line, what in kind_comparisons("\n".join(lines)):
            rel = str(p.relative_to(ROOT))
            hit = next((e for e in EXCEPTIONS if e[0] == rel and e[1] in lines[line - 1]), None)
            if hit:
                used.add(hit)
            else:
                bad.append(f"{rel}:{line} {what}: {lines[line - 1].strip()}")
    assert bad == []
    assert used == set(EXCEPTIONS), "an exception no longer needed: drop it"
    assert len(EXCEPTIONS) <= 5 and all(EXCEPTIONS.values())


# ---- the registry -------------------------------------------------------------------------------------


def test_every_kind_is_registered_once_and_model_is_the_default():
    assert [k.name for k in kinds()] == ["ngram", "derived", "eagle3", "layerskip", "model"]
    assert kinds()[-1] is MODEL and kind_of("./my-draft") is MODEL and kind_of("org/name") is MODEL
    with pytest.raises(ValueError, match="registered already"):
        register(NgramKindTwin())


class NgramKindTwin(DrafterKind):
    name = "ngram"


def test_stored_labels_are_exactly_todays():
    """They are in MLflow tags and history databases: they never change."""
    assert set(stored_labels()) == {"model", "ngram", "derived:int8", "derived:int4", "derived:bf16", "derived:fp8",
                                    "eagle3", "layerskip"}


@pytest.mark.parametrize("label", sorted({"model", "ngram", "derived:int8", "derived:int4", "derived:bf16",
                                          "derived:fp8", "eagle3", "layerskip"}))
def test_label_round_trips_through_its_kind(label):
    kind = kind_of(label)
    assert kind_of_label(label) is kind and label in kind.labels()
    if kind is not EAGLE3:  # an eagle3 spec needs a head directory; its label is the kind's name
        assert kind.label(label) == label
    assert kind_of(ResolvedDrafter(drafter=None, kind=label)) is kind


@pytest.mark.parametrize("spec,label", [("ngram", "ngram"), ("ngram:4", "ngram"), ("ngram:4:2", "ngram"),
                                        ("derived:bf16", "derived:bf16"), ("model:./d", "model"), ("./d", "model"),
                                        ("auto", "model"), ("layerskip", "layerskip"), ("layerskip:4", "layerskip")])
def test_specs_map_to_their_stored_label(spec, label):
    assert kind_of(spec).label(spec) == label


@pytest.mark.parametrize("spec,msg", [
    ("", "empty drafter spec"), ("   ", "empty drafter spec"),
    ("ngram:x", "bad n-gram spec"), ("ngram:1:2:3", "bad n-gram spec"), ("ngram:1:3", "min_ngram <= max_ngram"),
    ("derived:int3", "not a derived draft spec"), ("derived", "not a derived draft spec"),
    ("model:", "model: needs a reference"),
    ("eagle3", "needs a head directory"), ("eagle3:", "needs a head directory"),
    ("eagle3:models:/head/3", "registry URI"), ("eagle3:/no/such/head", "no EAGLE-3 head at"),
    ("layerskip:0", "bad layer-skip spec"), ("layerskip:x", "bad layer-skip spec"), ("layerskip:2:3", "bad layer-skip spec"),
])
def test_a_bad_spec_is_one_clear_line(spec, msg):
    with pytest.raises(DrafterSpecError, match=msg) as e:
        kind_of(spec).check(spec)
    assert "\n" not in str(e.value) and len(str(e.value)) < 200


def test_kind_of_label_is_none_for_no_label():
    assert kind_of_label(None) is None and kind_of_label("") is None and kind_of_label("mtp") is None


def test_facts_per_kind():
    facts = {k.name: (k.needs_draft_weights, k.model_free, k.derives_from_target, k.reads_target_features, k.retrainable)
             for k in kinds()}
    assert facts == {"model": (True, False, False, False, False), "ngram": (False, True, False, False, False),
                     "derived": (False, False, True, False, False), "eagle3": (True, False, False, True, True),
                     "layerskip": (False, False, True, False, False)}


class _Loader:
    """A DraftLoader that counts what it is asked (no registry here)."""

    def __init__(self):
        self.asked = []

    def weights_sha256(self, uri):
        self.asked.append(uri)
        return "sha-of-" + uri

    def checkpoint(self, uri, *, shared=False):
        raise AssertionError("a cache key loads nothing")

    def directory(self, uri):
        raise AssertionError("a cache key downloads nothing")


def _reg(label, **kw):
    return RegisteredDrafter(label=label, uri=kw.get("uri", "models:/d/1"), weights_sha256="w1",
                             base_uri="models:/t/2", recipe=kw.get("recipe"), target_key=("target", "models:/t/2"),
                             device="cpu", dtype="torch.float32")


def test_cache_keys_are_stable_and_name_what_the_weights_depend_on():
    loader = _Loader()
    from specdec.core.drafters import NgramDrafter

    d = NgramDrafter()
    assert NGRAM.cache_key(_reg("ngram"), loader) == ("ngram", d.max_ngram, d.min_ngram)  # no recipe: the defaults
    assert NGRAM.cache_key(_reg("ngram", recipe={"max_ngram": 3, "min_ngram": 1}), loader) == ("ngram", 3, 1)
    assert MODEL.cache_key(_reg("model"), loader) == ("model", "models:/d/1", "w1", "cpu", "torch.float32")
    assert EAGLE3.cache_key(_reg("eagle3"), loader) == ("eagle3", "models:/d/1", "w1", ("target", "models:/t/2"),
                                                        "cpu", "torch.float32")
    recipe = {"kind": "int8", "method": "m"}
    key = DERIVED.cache_key(_reg("derived:int8", recipe=recipe), loader)
    assert key == ("derived", "models:/t/2", "sha-of-models:/t/2", "derived:int8", repr(sorted(recipe.items())),
                   "cpu", "torch.float32")
    assert key == DERIVED.cache_key(_reg("derived:int8", recipe=dict(reversed(recipe.items()))), loader)
    assert MODEL.cache_key(_reg("model", uri="models:/d/2"), loader) != MODEL.cache_key(_reg("model"), loader)


def test_draft_identity_groups_weight_backed_kinds_by_their_weights():
    assert draft_identity("ngram", "none", "none") == ("ngram", "none", "none")
    assert draft_identity("derived:int8", "w", "t") == draft_identity("model", "w", "t") == ("model-or-derived", "w", "t")
    assert draft_identity(None, None, None) == ("model-or-derived", "", "")


def test_a_registered_ngram_loads_its_recipe_sizes():
    for recipe, sizes in [({"max_ngram": 3, "min_ngram": 1}, (3, 1)), ({"max_ngram": 4, "min_ngram": 2}, (4, 2)), (None, (3, 2))]:
        d = NGRAM.load(_reg("ngram", recipe=recipe), None, _Loader()).drafter
        assert (d.max_ngram, d.min_ngram) == sizes
    assert NGRAM.pair_recipe("ngram") == {"max_ngram": 3, "min_ngram": 2} and NGRAM.pair_recipe("ngram:5") == {"max_ngram": 5, "min_ngram": 2}
    with pytest.raises(DrafterSpecError, match="bad n-gram recipe"):
        NGRAM.load(_reg("ngram", recipe={"max_ngram": "x"}), None, _Loader())


def test_resolve_and_parts_of_an_ngram():
    r = kind_of("ngram:4:2").resolve("ngram:4:2", None, store=model_store())
    assert (r.kind, r.ref, r.drafter.max_ngram, r.drafter.min_ngram) == ("ngram", "max_ngram=4,min_ngram=2", 4, 2)
    obj, model, label, ref, recipe = drafter_parts(r)
    assert obj is r.drafter and model is None and label == "ngram" and ref == r.ref and recipe == {"max_ngram": 4, "min_ngram": 2}
    assert drafter_parts(r.drafter)[2] == "ngram" and drafter_parts(r.drafter)[4] == recipe  # read off the bare object


def test_parts_of_a_bare_causal_lm_and_a_derived_draft():
    from tests.support.models import tiny_llama

    target = tiny_llama(61, hidden_size=32)
    obj, model, label, _, _ = drafter_parts(target)
    assert obj is model is target and label == "model"
    r = kind_of("derived:bf16").resolve("derived:bf16", SimpleNamespace(model=target), store=model_store())
    obj, model, label, _, recipe = drafter_parts(r)
    assert model is obj and model.dtype == torch.bfloat16 and label == "derived:bf16" and recipe["kind"] == "bf16"
    assert DERIVED.same_as_target("derived:bf16", torch.bfloat16) and DERIVED.same_as_target("derived:bf16", torch.float32) is None
    with pytest.raises(TypeError, match="drafter must be"):
        drafter_parts(object())


@pytest.mark.parametrize("engine", ["vllm", "sglang", "transformers"])
def test_serving_of_each_kind_names_its_method(engine):
    from specdec.engines.profiles import engine_profile
    from specdec.validation.serving import serving_config

    methods = {k.name: (k.vllm_method, k.sglang_algorithm) for k in kinds()}
    for label in stored_labels():
        kind = kind_of(label)
        if kind is LAYERSKIP and engine != "transformers":  # no engine but transformers has early exit
            with pytest.raises(ValueError, match="early-exit"):
                serving_config(engine, label, 3, draft="d")
            continue
        if not engine_profile(engine).serves(kind):
            with pytest.raises(ValueError, match="vllm or sglang"):
                serving_config(engine, label, 3, draft="d")
            continue
        recipe = {"num_layers": 4} if kind is LAYERSKIP else None
        sc = serving_config(engine, label, 3, draft="d", drafter_recipe=recipe)
        text = json.dumps(sc)
        if engine != "transformers":
            assert methods[kind.name][engine == "sglang"] in text
        if kind is LAYERSKIP:  # the target's own layers: transformers' early exit, no draft reference
            assert sc["generate_kwargs"]["assistant_early_exit"] == 4 and '"d"' not in text
            continue
        assert ('"d"' in text) != kind.model_free


def test_layerskip_kind_resolves_the_targets_own_layers_and_keys_on_the_target():
    from tests.support.models import tiny_llama

    target = tiny_llama(61, hidden_size=32, num_layers=4)
    r = kind_of("layerskip:3").resolve("layerskip:3", SimpleNamespace(model=target), store=model_store())
    assert (r.kind, r.recipe["num_layers"], r.drafter.config.num_hidden_layers) == ("layerskip", 3, 3)
    assert r.drafter.lm_head is target.lm_head and r.drafter.model.layers[2] is target.model.layers[2]
    obj, model, label, _, recipe = drafter_parts(r.drafter)  # a bare layer-skip draft is claimed by its kind
    assert model is obj and label == "layerskip" and recipe["num_layers"] == 3
    assert kind_of("layerskip").resolve("layerskip", SimpleNamespace(model=target),
                                        store=model_store()).recipe["num_layers"] == 2
    with pytest.raises(DrafterSpecError, match="num_layers must be in 1..3"):
        kind_of("layerskip:4").resolve("layerskip:4", SimpleNamespace(model=target), store=model_store())
    loaded = LAYERSKIP.load(_reg("layerskip", recipe={"num_layers": 1}), SimpleNamespace(model=target), _Loader())
    assert loaded.drafter.config.num_hidden_layers == 1 and loaded.drafter.model.embed_tokens is target.model.embed_tokens
    key = LAYERSKIP.cache_key(_reg("layerskip", recipe={"num_layers": 1}), _Loader())
    assert key == ("layerskip", ("target", "models:/t/2"), repr([("num_layers", 1)]))
    assert LAYERSKIP.pair_recipe("layerskip:5") == {"num_layers": 5} and LAYERSKIP.pair_recipe("layerskip") is None


def test_derived_serving_notes_and_descriptions():
    assert "target cast to bf16" in DERIVED.serving_note("derived:bf16")
    assert "int4 weight-only quantization" in DERIVED.serving_note("derived:int4")
    assert MODEL.serving_note("model") is None
    assert [k.describe(lab) for k in kinds() for lab in k.labels()[:1]] == [
        "n-gram drafter (prompt lookup, no model)", "derived:int8 (the target with int8 weights)", "EAGLE-3 head",
        "layer-skip draft (the target's own first layers, shared weights)", "draft model"]


def test_ngram_finding_reads_its_group():
    g = SimpleNamespace(tf_coverage=0.5, draft_tokens_per_step=1.25, num_speculative_tokens=4)
    assert "coverage 50%" in NGRAM.finding(g) and MODEL.finding(g) is None
    assert not math.isnan(g.tf_coverage)


class _MtpKind(DrafterKind):
    """A fifth kind as its author would write it: one class (the model kind's defaults do the rest)."""

    name = "mtp"
    needs_draft_weights = True
    vllm_method = "mtp"
    sglang_algorithm = "NEXTN"

    def check(self, spec):
        if not self.ref(spec.strip()) or spec.strip() == self.name:
            raise DrafterSpecError("mtp: needs the target's MTP module, e.g. mtp:./mtp-head")
        return spec.strip()


def kind_tables() -> dict[str, KindTable]:
    """Every module-level :class:`KindTable` of the product, found in the source (``module.NAME`` -> the table),
    so a table added later is covered without listing it here."""
    import importlib

    found = {}
    for p in _product_files():
        for node in ast.parse(p.read_text()).body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "KindTable":
                name = (node.targets[0] if isinstance(node, ast.Assign) else node.target).id
                module = ".".join(p.relative_to(ROOT).with_suffix("").parts)
                found[f"{module}.{name}"] = getattr(importlib.import_module(module), name)
    return found


def test_the_per_layer_tables_are_found_and_complete():
    tables = kind_tables()
    assert {"specdec.validation.replay.TRACERS", "registry.register.REGISTRARS", "registry.pairs.DRAFT_SIDES",
            "specdec.engines.vllm.VLLM_SERVING", "specdec.engines.serving_profiles.SGLANG_SERVING",
            "specdec.engines.serving_profiles.TRANSFORMERS_SERVING", "specdec.engines.llamacpp.LLAMACPP_SERVING"} <= set(tables)
    assert all(isinstance(t, KindTable) for t in tables.values())
    assert {name: t.missing() for name, t in tables.items()} == {name: [] for name in tables}


def test_a_fifth_kind_is_one_class_one_registration_and_one_entry_per_table(monkeypatch, tmp_path):
    import specdec.kinds as registry
    from specdec.validation.serving import serving_config

    monkeypatch.setattr(registry, "_KINDS", list(registry._KINDS))  # the registration is undone after the test
    mtp = register(_MtpKind())
    assert kind_of("mtp:./head") is mtp and kind_of_label("mtp") is mtp and "mtp" in stored_labels()
    assert kind_of("mtp:./head").label("mtp:./head") == "mtp" and kind_of("./other") is MODEL
    with pytest.raises(DrafterSpecError, match="needs the target's MTP module"):
        kind_of("mtp").check("mtp")
    assert draft_identity("mtp", "w", "t") == ("model-or-derived", "w", "t")
    # registered but not filed: every layer's table names it, and refuses it, until it has its entry there
    tables = kind_tables()
    assert {name: t.missing() for name, t in tables.items()} == {name: ["mtp"] for name in tables}
    for name, table in tables.items():
        with pytest.raises(MissingKindEntry, match=r"drafter kind\(s\) mtp"):
            table.check()
        with pytest.raises(MissingKindEntry, match="'mtp' has no entry"):
            table[mtp]
    from registry.register import register_pair_from_refs

    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))  # the registration lock's directory
    with pytest.raises(MissingKindEntry, match="'mtp' has no entry in the pair registrars"):
        register_pair_from_refs("./target", "mtp:./head", name="mtp-pair", registry=open_registry_at(f"sqlite:///{tmp_path}/never-opened.db"),
                                store=model_store())
    with pytest.raises(MissingKindEntry, match="'mtp' has no entry in the vLLM serving table"):
        serving_config("vllm", "mtp", 2, draft="./head")  # serving is each engine profile's table
    for table in tables.values():  # filed like a draft model: complete again
        monkeypatch.setitem(table._entries, mtp, table[MODEL])
    assert all(t.missing() == [] for t in kind_tables().values())
    assert serving_config("vllm", "mtp", 2, draft="./head")["speculative_config"]["method"] == "mtp"
    assert serving_config("sglang", "mtp", 2, draft="./head")["args"][:2] == ["--speculative-algorithm", "NEXTN"]


@pytest.mark.parametrize("spec,said", [("bogus:3", "unknown drafter kind 'bogus': use ngram"),
                                       ("ngarm:3", "unknown drafter kind 'ngarm': did you mean 'ngram'?"),
                                       ("derivd:int8", "did you mean 'derived'?")])
def test_a_kind_typo_names_the_kinds_not_a_missing_path(spec, said):
    """``--draft bogus:3`` said "model path not found: <cwd>/bogus:3" (new-user try, issue 51)."""
    from specdec.kinds import DrafterSpecError, check_drafter_spec

    with pytest.raises(DrafterSpecError, match=re.escape(said)):
        check_drafter_spec(spec)


def test_model_refs_with_a_colon_prefix_still_pass(tmp_path):
    from specdec.kinds import check_drafter_spec

    (tmp_path / "odd:name").mkdir()
    assert check_drafter_spec(f"model:{tmp_path}") == f"model:{tmp_path}"
    assert check_drafter_spec(str(tmp_path / "odd:name")) == str(tmp_path / "odd:name")
    assert check_drafter_spec("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
