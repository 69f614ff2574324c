"""Interoperability with ``speculators`` (vllm-project/speculators, checked: 0.9.0 with transformers
5.19.0 and torch 2.13.0 in its own venv; our side: the product venv).

1. A head written by :func:`specdec.models.eagle3.save_eagle3` loads with speculators' own
   ``Eagle3DraftModel.from_pretrained`` and gives the same logits as our core, at every TTT depth
   (speculators' training forward, which runs the same attention pattern as drafting).
2. A head created with speculators' classes (random weights, ``save_pretrained``) loads with
   :func:`specdec.models.eagle3.load_eagle3` and gives the same logits; it then drafts exactly.

speculators pins transformers <= 5.19 and pulls heavy extras, so it lives in a second venv: the
one named by ``SPECDEC_SPECULATORS_PYTHON`` (its python), else ``speculators-venv`` in the test cache
(:mod:`tests.support.cache`: ``$SPECDEC_TEST_CACHE``, else ``.specdec/``),
created here on first use (skipped, with the pip error, where the registry is unreachable). The
speculators side is ``tests/interop/speculators_side.py``, run by subprocess; inputs and logits
travel as ``.pt`` files.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from filelock import FileLock

from specdec import SamplingConfig, autoregressive_generate, speculative_generate
from specdec.core.features import target_features
from specdec.core.head_drafter import Eagle3Drafter
from specdec.models.eagle3 import load_eagle3, save_eagle3
from tests.support.cache import test_cache_dir
from tests.support.eagle3 import head_config, random_head, tiny_target

ROOT = Path(__file__).resolve().parents[2]
SIDE = ROOT / "tests" / "interop" / "speculators_side.py"
#: the versions the interoperability tests were run with (docs/validation.md, "EAGLE-3 heads")
PINS = ["speculators==0.9.0", "hs-connectors==0.9.0"]
DEPS = ["torch==2.13.0", "transformers<=5.19", "safetensors", "pydantic", "pydantic-settings", "loguru", "openai", "datasets"]
IDS = torch.tensor([[5, 17, 33, 8, 91, 4, 60, 61, 44, 70, 12, 30]])
TTT = 3


def _pip(python: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-m", "pip", "install", "-q", *args], capture_output=True, text=True, timeout=3600)


@pytest.fixture(scope="session")
def speculators_python() -> Path:
    """The python of a venv with speculators installed (created under .specdec on first use)."""
    given = os.environ.get("SPECDEC_SPECULATORS_PYTHON")
    if given:
        return Path(given)
    venv = test_cache_dir() / "speculators-venv"
    python = venv / "bin" / "python"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(venv) + ".lock"):  # pytest-xdist workers: one creates it, the others wait
        return _speculators_venv(venv, python)


def _speculators_venv(venv: Path, python: Path) -> Path:
    """``venv``'s python, the venv (re)created first unless it was completed with today's pins."""
    complete = " ".join(PINS + DEPS) + "\n"
    if (venv / ".complete").is_file() and (venv / ".complete").read_text() == complete:
        return python
    made = subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], capture_output=True, text=True)
    if made.returncode:
        pytest.skip(f"cannot create a venv for speculators: {made.stderr.strip().splitlines()[-1:]}")
    for args in (["--no-deps", *PINS], DEPS):
        r = _pip(python, *args)
        if r.returncode:
            pytest.skip(f"cannot install {' '.join(args)} (registry unreachable?): "
                        f"{(r.stderr.strip().splitlines() or ['pip failed'])[-1]}")
    (venv / ".complete").write_text(complete)
    return python


def _run_side(python: Path, *args) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # never our code on that side
    env["HF_HUB_OFFLINE"] = "1"
    r = subprocess.run([str(python), str(SIDE), *map(str, args)], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return torch.load(args[3])


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    t = tiny_target(0)
    path = tmp_path_factory.mktemp("target")
    t.save_pretrained(path)  # speculators' loader reads the verifier's config and weights from here
    t.saved_path = path
    return t


def _inputs(target, tmp_path, head_cfg=None, **sizes) -> tuple[Path, torch.Tensor]:
    _, feats = target_features(target, IDS, [1, 2, 4])
    T = IDS.shape[1] - 1
    path = tmp_path / "inputs.pt"
    torch.save({"input_ids": IDS[:, 1:].clone(), "hidden_states": feats[:, :T].float().clone(), "ttt_steps": TTT,
                "hidden": 32, "vocab": 103, "layer_ids": [1, 2, 4], "seed": 0, **sizes}, path)
    return path, feats[:, :T]


def _ours(head, features) -> torch.Tensor:
    ids = torch.cat([IDS[:, 1:], torch.zeros(1, TTT, dtype=torch.long)], dim=1)  # speculators pads with 0
    return torch.stack(head.chain_logits(ids, features, TTT))


@pytest.mark.parametrize("kwargs", [{"draft_vocab_size": 40},
                                    {"layer_type": "qwen3", "norm_before_residual": True},
                                    {"num_layers": 2, "draft_vocab_size": 64}])
def test_a_head_written_here_loads_in_speculators_with_the_same_logits(speculators_python, target, tmp_path, kwargs):
    head = random_head(head_config(target, **kwargs), target, seed=1)
    save_eagle3(head, tmp_path / "head", verifier=str(target.saved_path), verifier_architectures=["LlamaForCausalLM"])
    inputs, feats = _inputs(target, tmp_path)
    out = _run_side(speculators_python, "load", tmp_path / "head", inputs, tmp_path / "out.pt")
    assert out["versions"]["speculators"] == "0.9.0"
    torch.testing.assert_close(out["logits"], _ours(head, feats), rtol=0, atol=1e-5)


@pytest.mark.parametrize("layer_type", ["llama", "qwen3"])
def test_a_head_made_by_speculators_loads_here_with_the_same_logits(speculators_python, target, tmp_path, layer_type):
    inputs, feats = _inputs(target, tmp_path, draft_vocab=48)
    out = _run_side(speculators_python, "create", tmp_path / "head", inputs, tmp_path / "out.pt", layer_type)
    head = load_eagle3(tmp_path / "head")
    assert head.config.layer_type == layer_type and head.d2t is not None
    torch.testing.assert_close(_ours(head, feats), out["logits"], rtol=0, atol=1e-5)
    ids = IDS[:, :5]  # and it drafts exactly
    ref = autoregressive_generate(target, ids, max_new_tokens=12, sampling=SamplingConfig()).token_ids
    got = speculative_generate(target, Eagle3Drafter(head, [1, 2, 4]), ids, num_speculative_tokens=3, max_new_tokens=12,
                               sampling=SamplingConfig())
    assert got.token_ids == ref
