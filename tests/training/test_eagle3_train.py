"""Training EAGLE-3 heads on a tiny target: learning, reload, warm start, resume after a kill, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.support.store import model_store
from tests.training.eagle3_support import TINY_LAYER_IDS, quick_config, tiny_target_dir

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return tiny_target_dir(tmp_path_factory.mktemp("eagle3-target") / "t")


@pytest.fixture(scope="module")
def target(target_dir):
    from specdec.models import load_causal_lm

    return load_causal_lm(str(target_dir), store=model_store())


@pytest.fixture(scope="module")
def parent(target, tmp_path_factory):
    """An uninterrupted training run (the reference for resume and the parent for warm starts)."""
    from specdec.training import train_eagle3_head

    out = tmp_path_factory.mktemp("eagle3-parent") / "head"
    return train_eagle3_head(target, out_dir=out, config=quick_config(), layer_ids=TINY_LAYER_IDS, progress=False)


def _train_features(target, n=8):
    from specdec.training.eagle3 import build_training_sequences
    from specdec.training.eagle3_features import all_target_features

    return all_target_features(target.model, build_training_sequences(target, quick_config())[:n], TINY_LAYER_IDS)


def _loss(head, target, feats) -> float:
    from specdec.training.eagle3 import collate, train_step
    from specdec.training.eagle3_features import draft_token_ids

    d2t = head.d2t if head.d2t is not None else torch.zeros(head.config.draft_vocab_size, dtype=torch.long)
    w = target.model.get_output_embeddings().weight.detach()[draft_token_ids(d2t)]
    with torch.no_grad():
        return float(train_step(head, collate(feats, "cpu"), w, quick_config()).loss)


def test_training_lowers_the_loss_and_raises_teacher_forced_agreement(target, parent):
    from specdec.training.eagle3_eval import teacher_forced_agreement
    from specdec.training.eagle3_init import new_head

    feats = _train_features(target)
    fresh = new_head(target, TINY_LAYER_IDS, parent.head.d2t.cpu(), parent.head.t2d.cpu(), seed=0)
    before, after = teacher_forced_agreement(fresh, target, feats), teacher_forced_agreement(parent.head, target, feats)
    assert before["alpha_tf"] < 0.1, before  # 64 draft tokens: an untrained head is near chance
    assert after["alpha_tf"] > before["alpha_tf"] + 0.1, (before, after)
    assert after["accepted_per_draft"] > before["accepted_per_draft"] + 0.1
    assert _loss(parent.head, target, feats) < 0.8 * _loss(fresh, target, feats)
    assert parent.metrics["steps"] == parent.metrics["total_steps"] == 20 and not parent.metrics["stopped_early"]


def test_written_directory_reloads_with_the_head_loader(target, parent):
    from specdec.models.eagle3 import is_eagle3_dir, load_eagle3
    from specdec.models.hashes import tokenizer_sha256, weights_sha256

    out = parent.out_dir
    assert is_eagle3_dir(out) and not (out / "checkpoint").exists()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and cfg["draft_vocab_size"] == 64
    assert cfg["eagle_aux_hidden_state_layer_ids"] == TINY_LAYER_IDS
    loaded = load_eagle3(out)
    trained = parent.head.state_dict()
    assert loaded.state_dict().keys() == trained.keys()
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, trained[k].cpu()), k
    doc = json.loads((out / "training.json").read_text())
    assert doc["lineage"]["target_weights_sha256"] == weights_sha256(target.path)
    assert doc["lineage"]["parent"] is None and len(doc["lineage"]["training_data_sha256"]) == 64
    assert tokenizer_sha256(out) == tokenizer_sha256(target.path)  # the head registers with the target's tokenizer


def test_warm_start_starts_from_the_parent_weights(target, parent, tmp_path):
    from specdec.models.hashes import weights_sha256
    from specdec.training import train_eagle3_head

    # one step at a negligible learning rate: the child is the parent, vocabulary and aux layers kept
    child = train_eagle3_head(target, out_dir=tmp_path / "child", init_from=parent.out_dir, progress=False,
                              config=quick_config(lr=1e-12, epochs=1, draft_vocab_size=32, num_sequences=4))
    p = parent.head.state_dict()
    for k, v in child.head.state_dict().items():
        assert torch.allclose(v.float(), p[k].float(), atol=1e-7), k
    assert torch.equal(child.head.d2t, parent.head.d2t)
    assert child.lineage["parent_weights_sha256"] == weights_sha256(parent.out_dir)
    assert child.lineage["aux_hidden_state_layer_ids"] == TINY_LAYER_IDS
    fresh = train_eagle3_head(target, out_dir=tmp_path / "fresh", layer_ids=TINY_LAYER_IDS, progress=False,
                              config=quick_config(lr=1e-12, epochs=1, num_sequences=4))
    assert not torch.allclose(fresh.head.fc.weight, parent.head.fc.weight)


_KILLABLE = """
import sys
from specdec.models import load_causal_lm
from specdec.training import train_eagle3_head
from tests.support.store import model_store
from tests.training.eagle3_support import TINY_LAYER_IDS, quick_config
train_eagle3_head(load_causal_lm(sys.argv[1],
                                 store=model_store()), out_dir=sys.argv[2], config=quick_config(checkpoint_every=2),
                  layer_ids=TINY_LAYER_IDS, progress=False)
"""


def test_resume_after_a_kill_gives_the_uninterrupted_result(target, target_dir, parent, tmp_path):
    from specdec.training import train_eagle3_head

    out = tmp_path / "killed"
    state = out / "checkpoint" / "state.pt"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _KILLABLE, str(target_dir), str(out)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 600
    while not state.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert state.exists(), proc.stderr.read().decode()[-2000:]
    step = torch.load(state, weights_only=False)["step"]
    assert 2 <= step < 20 and not (out / "model.safetensors").exists()
    resumed = train_eagle3_head(target, out_dir=out, config=quick_config(checkpoint_every=2),
                                layer_ids=TINY_LAYER_IDS, progress=False)
    ref = parent.head.state_dict()
    for k, v in resumed.head.state_dict().items():
        assert torch.equal(v, ref[k]), k
    assert resumed.metrics["steps"] == 20


def test_a_checkpoint_of_another_run_is_refused(target, tmp_path):
    from specdec.training import CheckpointMismatchError, train_eagle3_head

    out = tmp_path / "h"
    train_eagle3_head(target, out_dir=out, config=quick_config(epochs=2, num_sequences=8, max_minutes=0.0),
                      layer_ids=TINY_LAYER_IDS, progress=False)
    assert (out / "checkpoint" / "state.pt").exists()  # stopped at --max-minutes: resumable
    with pytest.raises(CheckpointMismatchError, match="another training run"):
        train_eagle3_head(target, out_dir=out, config=quick_config(epochs=2, num_sequences=8, lr=1e-2),
                          layer_ids=TINY_LAYER_IDS, progress=False)


def test_short_or_missing_data_is_one_clear_error(target, tmp_path):
    from specdec.training import TrainingDataError, train_eagle3_head

    with pytest.raises(TrainingDataError, match="training corpus not found"):
        train_eagle3_head(target, out_dir=tmp_path / "a", corpus=tmp_path / "none.jsonl", config=quick_config(),
                          layer_ids=TINY_LAYER_IDS, progress=False)
    small = tmp_path / "small.jsonl"
    small.write_text(json.dumps({"text": "x" * 300}) + "\n")
    with pytest.raises(TrainingDataError, match="only 1 usable training sequences"):
        train_eagle3_head(target, out_dir=tmp_path / "b", corpus=small, config=quick_config(),
                          layer_ids=TINY_LAYER_IDS, progress=False)
    with pytest.raises(ValueError, match="unknown data recipe"):
        quick_config(recipe="web").check()


def test_resume_during_the_target_passes_gives_the_uninterrupted_result(target, parent, tmp_path):
    """A run killed while computing target features left its sequences and the first features in
    ``checkpoint/partial.pt``: the resumed run computes only the rest and ends where the uninterrupted one did."""
    from specdec.training import eagle3 as E
    from specdec.training import eagle3_checkpoint as ckpt
    from specdec.training.eagle3_features import draft_vocab_mapping, target_features, token_frequencies

    cfg, out = quick_config(), tmp_path / "partial"
    seqs = E.build_training_sequences(target, cfg)
    d2t, t2d = draft_vocab_mapping(token_frequencies(seqs, target.model.config.vocab_size), cfg.draft_vocab_size)
    feats = [target_features(target.model, s, TINY_LAYER_IDS) for s in seqs[:3]]
    run_key = E._run_key(cfg, E._fingerprint(target), None)
    ckpt.save_partial(out, run_key, {"seqs": seqs, "d2t": d2t, "t2d": t2d, "features": feats,
                                     "feature_minutes": 0.0, "data_minutes": 0.0})
    resumed = E.train_eagle3_head(target, out_dir=out, config=cfg, layer_ids=TINY_LAYER_IDS, progress=False)
    ref = parent.head.state_dict()
    for k, v in resumed.head.state_dict().items():
        assert torch.equal(v, ref[k]), k
    assert resumed.lineage["training_data_sha256"] == parent.lineage["training_data_sha256"]


def test_the_head_names_its_target_as_verifier(target, parent):
    cfg = json.loads((parent.out_dir / "config.json").read_text())
    assert cfg["speculators_config"]["verifier"] == {"name_or_path": str(target.path),
                                                      "architectures": ["LlamaForCausalLM"]}
