"""``eagle3:<dir>`` drafter specs and head/target compatibility checks (one clear line each, before
the head's weights load)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from specdec import SamplingConfig, autoregressive_generate, speculative_generate
from specdec.models.compat import IncompatiblePairError
from specdec.kinds import DrafterSpecError, check_drafter_spec, resolve_drafter
from specdec.models.eagle3 import save_eagle3
from specdec.models.eagle3.compat import check_head_target, read_d2t
from tests.support.eagle3 import head_config, random_head, tiny_target
from tests.support.store import model_store


@pytest.fixture(scope="module")
def target():
    return tiny_target(0)


@pytest.fixture(scope="module")
def head_dir(target, tmp_path_factory):
    path = tmp_path_factory.mktemp("head")
    save_eagle3(random_head(head_config(target, draft_vocab_size=40), target, seed=1), path)
    return path


def test_eagle3_spec_resolves_to_an_exact_drafter(target, head_dir):
    r = resolve_drafter(f"eagle3:{head_dir}", SimpleNamespace(model=target), store=model_store())
    assert r.kind == "eagle3" and r.compatibility["aux_layer_ids"] == [1, 2, 4]
    ids = torch.tensor([[5, 17, 33, 8]])
    ref = autoregressive_generate(target, ids, max_new_tokens=16, sampling=SamplingConfig()).token_ids
    out = speculative_generate(target, r.drafter, ids, num_speculative_tokens=3, max_new_tokens=16, sampling=SamplingConfig())
    assert out.token_ids == ref and out.stats.num_draft_tokens > 0


@pytest.mark.parametrize("spec,msg", [
    ("eagle3:", "needs a head directory"),
    ("eagle3:models:/head/3", "registry URI"),
    ("eagle3:/no/such/head", "no EAGLE-3 head at"),
])
def test_bad_eagle3_specs_are_refused_before_loading(spec, msg):
    with pytest.raises(DrafterSpecError, match=msg) as e:
        check_drafter_spec(spec)
    assert "\n" not in str(e.value)


def test_a_directory_that_is_not_an_eagle3_head_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(DrafterSpecError, match="not an EAGLE-3 head"):
        check_drafter_spec(f"eagle3:{tmp_path}")


def _problems(config, target, d2t=None) -> list[str]:
    with pytest.raises(IncompatiblePairError) as e:
        check_head_target(config, target, d2t)
    return e.value.problems


def test_compatibility_problems_one_line_each(target, head_dir):
    other = tiny_target(0, hidden_size=48)
    assert any("hidden states of size 32, the target's are 48" in p for p in _problems(head_config(target), other))
    assert any("8-layer" in p or "outside the target's layers [0, 4]" in p
               for p in _problems(head_config(target, layer_ids=(1, 2, 5)), target))
    small = tiny_target(0, vocab_size=90)
    assert any("103-token vocabulary, the target has 90" in p for p in _problems(head_config(target), small))
    bad_d2t = read_d2t(head_dir).clone()
    bad_d2t[-1] += 500
    assert any("outside the target's vocabulary [0, 103)" in p
               for p in _problems(head_config(target, draft_vocab_size=40), target, bad_d2t))
    assert any("default aux layer ids" in p for p in _problems(head_config(target, layer_ids=None), target))
    assert check_head_target(head_config(target, draft_vocab_size=40), target, read_d2t(head_dir)) == [1, 2, 4]
