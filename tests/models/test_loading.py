"""Loading local / Hub-cache checkpoints, content hashes, settings, and the atomic cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specdec.models import (
    LoadedModel,
    ModelNotFoundError,
    load_causal_lm,
    tokenizer_sha256,
    weights_sha256,
)
from specdec.models.resolve import atomic_cache_dir
from specdec.settings import get_settings
from tests.support.models import save_tiny_checkpoint, tiny_llama, tiny_tokenizer
from tests.support.store import model_store


@pytest.fixture(autouse=True)
def tmp_home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SPECDEC_MODELS_DIR", raising=False)
    return tmp_path / "home"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny")


def test_settings_defaults_and_env(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECDEC_HOME")
    monkeypatch.chdir(tmp_path)
    s = get_settings()
    assert s.home == (tmp_path / ".specdec").resolve()
    assert s.models_dir == s.home / "models"
    monkeypatch.setenv("SPECDEC_HOME", "rel/home")
    monkeypatch.setenv("SPECDEC_MODELS_DIR", str(tmp_path / "m"))
    monkeypatch.setenv("SPECDEC_DTYPE", "bf16")
    s = get_settings()
    assert s.home == (tmp_path / "rel/home").resolve() and s.models_dir == tmp_path / "m"
    assert s.resolved_dtype("cpu") is torch.bfloat16
    monkeypatch.setenv("SPECDEC_DTYPE", "int3")
    with pytest.raises(ValueError, match="int3"):
        get_settings().resolved_dtype("cpu")


def test_load_local_checkpoint(ckpt):
    lm = load_causal_lm(ckpt, store=model_store())
    assert isinstance(lm, LoadedModel)
    assert lm.path == ckpt.resolve() and lm.source == {"kind": "local", "ref": str(ckpt.resolve()), "revision": None}
    assert not lm.model.training
    ref = tiny_llama(103, seed=0)
    for (n, p), (n2, p2) in zip(lm.model.state_dict().items(), ref.state_dict().items()):
        assert n == n2 and torch.equal(p, p2), n
    ids = torch.tensor([[1, 10, 11, 12]])
    assert torch.equal(lm.model(ids).logits, ref(ids).logits)
    assert lm.tokenizer.get_vocab() == tiny_tokenizer().get_vocab()
    assert lm.tokenizer.chat_template == tiny_tokenizer().chat_template


def test_load_dtype(ckpt):
    lm = load_causal_lm(str(ckpt), dtype="bfloat16", store=model_store())
    assert {p.dtype for p in lm.model.parameters()} == {torch.bfloat16}
    lm = load_causal_lm(ckpt, dtype=torch.float16, device="cpu", store=model_store())
    assert next(lm.model.parameters()).dtype is torch.float16


@pytest.mark.parametrize("ref, match", [
    ("/nonexistent/model/dir", "not found"),
    ("./relative/missing", "not found"),
    ("missing-model.gguf", "GGUF file not found"),
    ("not a valid id!", "not found"),
])
def test_missing_refs(ref, match):
    with pytest.raises(ModelNotFoundError, match=match) as e:
        load_causal_lm(ref, store=model_store())
    assert isinstance(e.value, FileNotFoundError)


def test_dir_without_config_and_plain_file(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        load_causal_lm(tmp_path / "empty", store=model_store())
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelNotFoundError, match="is a file"):
        load_causal_lm(tmp_path / "weights.bin", store=model_store())
    with pytest.raises(ValueError, match="revision"):
        load_causal_lm(tmp_path / "empty", revision="main", store=model_store())


def _fake_hub_cache(root: Path, repo_id: str, commit: str) -> Path:
    """Lay out a real Hugging Face cache entry (refs/main -> snapshots/<commit>)."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    save_tiny_checkpoint(repo / "snapshots" / commit)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return repo / "snapshots" / commit


def test_hub_id_from_offline_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    snap = _fake_hub_cache(tmp_path / "hub", "tiny-org/tiny-llama", commit)
    lm = load_causal_lm("tiny-org/tiny-llama", store=model_store())
    assert lm.path == snap
    assert lm.source["kind"] == "hub" and lm.source["revision"] == commit
    assert lm.source["ref"] == "tiny-org/tiny-llama"
    with pytest.raises(ModelNotFoundError, match="HF_HUB_OFFLINE=1") as e:
        load_causal_lm("tiny-org/not-cached", store=model_store())
    assert "tiny-org/not-cached" in str(e.value)
    with pytest.raises(ModelNotFoundError, match="revision 'v9'"):
        load_causal_lm("tiny-org/tiny-llama", revision="v9", store=model_store())


def test_bin_checkpoint_converted_once_to_safetensors(tmp_path, tmp_home):
    src = tmp_path / "bin"
    model = tiny_llama(103, seed=3)
    src.mkdir()
    model.config.save_pretrained(src)
    torch.save(model.state_dict(), src / "pytorch_model.bin")
    tiny_tokenizer().save_pretrained(src)
    lm = load_causal_lm(src, store=model_store())
    assert lm.path.parent == tmp_home / "models" / "converted"
    assert list(lm.path.glob("*.safetensors")) and lm.source["kind"] == "local"
    for (n, p), p2 in zip(lm.model.state_dict().items(), model.state_dict().values()):
        assert torch.equal(p, p2), n
    assert load_causal_lm(src, store=model_store()).path == lm.path


def test_weights_sha256_deterministic_and_sensitive(tmp_path, ckpt):
    h = weights_sha256(ckpt)
    assert len(h) == 64 and h == weights_sha256(ckpt)
    assert weights_sha256(save_tiny_checkpoint(tmp_path / "same")) == h  # same seed, same bytes
    assert weights_sha256(save_tiny_checkpoint(tmp_path / "perturbed", perturb=1e-3)) != h
    # a single changed element changes the hash
    from safetensors.torch import load_file, save_file

    sd = load_file(ckpt / "model.safetensors")
    name = next(iter(sd))
    sd[name] = sd[name].clone()
    sd[name].view(-1)[0] += 1.0
    (tmp_path / "one").mkdir()
    save_file(sd, tmp_path / "one" / "model.safetensors", metadata={"format": "pt"})
    assert weights_sha256(tmp_path / "one") != h
    with pytest.raises(ModelNotFoundError):
        weights_sha256(tmp_path / "nothing-here")


def test_tokenizer_sha256(tmp_path, ckpt):
    h = tokenizer_sha256(ckpt)
    assert len(h) == 64 and h == tokenizer_sha256(ckpt)
    # the same tokenizer, as an object or re-saved after a load, hashes the same
    assert tokenizer_sha256(tiny_tokenizer()) == h
    lm = load_causal_lm(ckpt, store=model_store())
    assert tokenizer_sha256(lm.tokenizer) == h
    assert tokenizer_sha256(tiny_tokenizer(chat_template=False)) != h
    other = tiny_tokenizer()
    other.eos_token = "<pad>"
    assert tokenizer_sha256(other) != h
    (tmp_path / "none").mkdir()
    with pytest.raises(ModelNotFoundError):
        tokenizer_sha256(tmp_path / "none")


def test_atomic_cache_interrupted_build_leaves_nothing(tmp_path):
    final = tmp_path / "cache" / "key"

    def failing(tmp: Path) -> None:
        (tmp / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt  # e.g. Ctrl-C in the middle of a conversion

    with pytest.raises(KeyboardInterrupt):
        atomic_cache_dir(final, failing)
    assert not final.exists()
    assert [p.name for p in final.parent.iterdir() if not p.name.endswith(".lock")] == []

    # a leftover temp dir of a killed process is cleaned; the retry succeeds
    stale = final.parent / ".tmp-key-deadbeef"
    stale.mkdir()
    calls = []

    def ok(tmp: Path) -> None:
        calls.append(tmp)
        (tmp / "source.json").write_text(json.dumps({"kind": "test"}))

    assert atomic_cache_dir(final, ok) == final
    assert not stale.exists() and (final / "source.json").is_file()
    assert atomic_cache_dir(final, ok) == final and len(calls) == 1  # reused, not rebuilt
