"""Recipe ``tasks``: chat-task prompts, features kept from the answering passes, length-bucketed batches,
bfloat16 autocast, warm-start defaults."""

from __future__ import annotations

import pytest
import torch

from tests.support.store import model_store
from tests.training.eagle3_support import TINY_LAYER_IDS, quick_config, tiny_target_dir

DOCS = [("The Hubble Space Telescope was launched in 1990. Astronomers at NASA use it to study distant galaxies. "
         "It orbits the Earth every 95 minutes and has taken more than a million pictures. ") * 3,
        ("Our bakery in Portland sells bread and cakes. Every morning Maria bakes fresh croissants for the "
         "neighbourhood. Customers say the sourdough is the best in Oregon. ") * 3]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    from specdec.models import load_causal_lm

    return load_causal_lm(str(tiny_target_dir(tmp_path_factory.mktemp("tasks") / "t")), store=model_store())


def test_task_prompts_cover_every_task_equally_and_ask_the_target_only_for_translations():
    from specdec.training.eagle3_prompts import TASKS, task_prompts

    asked = []

    def answer(turns, max_new):
        asked.append((list(turns), max_new))
        return ["Das Teleskop ist gross."] * len(turns)

    out = task_prompts(DOCS, 24, answer, seed=3)
    assert [t for t, _ in out] == list(TASKS) * 4
    assert len(asked) == 1 and len(asked[0][0]) == 4
    assert all(t.startswith("Translate English to German: ") for t in asked[0][0])
    assert all(x == "Translate German to English: Das Teleskop ist gross." for t, x in out if t == "translate")
    assert all(x.startswith("Summarize: ") for t, x in out if t == "summarize")
    assert all(x.endswith("?") for t, x in out if t == "math")
    assert task_prompts(DOCS, 24, answer, seed=3) == out
    assert task_prompts(DOCS, 24, answer, seed=4) != out
    assert task_prompts([], 5, answer) == []


def test_generated_features_are_the_teacher_forced_features_of_the_greedy_answers(target):
    """Features captured while answering (left-padded batch, prefill + one token per step) equal one
    teacher-forced pass over prompt + answer, and the answer is the target's own greedy continuation."""
    from specdec.training.eagle3_data import TrainingSequence
    from specdec.training.eagle3_features import generated_features, target_features

    tok = target.tokenizer
    prompts = [tok("hello there")["input_ids"], tok("a much longer prompt about ships")["input_ids"],
               tok("x")["input_ids"]]
    feats = generated_features(target, prompts, 9, TINY_LAYER_IDS, batch_size=2)
    assert len(feats) == 3
    for p, f in zip(prompts, feats):
        n = len(p)
        assert f.input_ids[:n].tolist() == p and not f.loss_mask[:n].any() and f.loss_mask[n:].all()
        assert 1 <= len(f.input_ids) - n <= 9
        single = target.model.generate(input_ids=torch.tensor([p]), max_new_tokens=len(f.input_ids) - n,
                                       do_sample=False, pad_token_id=0)[0]
        assert f.input_ids.tolist() == single.tolist()[:len(f.input_ids)]
        ref = target_features(target.model, TrainingSequence(f.input_ids, f.loss_mask), TINY_LAYER_IDS)
        torch.testing.assert_close(f.aux.float(), ref.aux.float(), rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(f.last.float(), ref.last.float(), rtol=2e-2, atol=2e-2)


def test_tasks_recipe_trains_a_head_end_to_end(target, tmp_path):
    from specdec.training import train_eagle3_head

    corpus = tmp_path / "docs.jsonl"
    import json

    corpus.write_text("\n".join(json.dumps({"text": d}) for d in DOCS * 6))
    res = train_eagle3_head(target, out_dir=tmp_path / "h", corpus=corpus, layer_ids=TINY_LAYER_IDS, progress=False,
                            config=quick_config(recipe="tasks", num_sequences=12, response_tokens=16, epochs=2))
    assert res.metrics["steps"] == 6 and res.metrics["num_response_tokens"] > 12
    assert (tmp_path / "h" / "model.safetensors").is_file()


def test_length_bucketed_batches_are_a_seeded_partition_of_similar_lengths():
    from specdec.training.eagle3 import batch_order

    lengths = [10 + (i * 37) % 500 for i in range(256)]
    a = batch_order(256, 4, epoch=1, seed=0, lengths=lengths)
    assert a == batch_order(256, 4, epoch=1, seed=0, lengths=lengths) != batch_order(256, 4, 2, 0, lengths)
    assert sorted(i for b in a for i in b) == list(range(256))
    spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in a) / len(a)
    unbucketed = batch_order(256, 4, epoch=1, seed=0)
    spread0 = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in unbucketed) / len(unbucketed)
    assert spread < spread0 / 4


def test_bf16_autocast_training_lowers_the_loss(target):
    from specdec.training.eagle3 import Eagle3TrainConfig, build_training_sequences, collate, train_step, use_bf16
    from specdec.training.eagle3_features import (all_target_features, draft_token_ids, draft_vocab_mapping,
                                                  token_frequencies)
    from specdec.training.eagle3_init import new_head

    assert use_bf16("bf16", torch.device("cpu")) and not use_bf16("fp32", torch.device("cpu"))
    with pytest.raises(ValueError, match="precision"):
        Eagle3TrainConfig(precision="fp16").check()
    cfg = quick_config(precision="bf16")
    seqs = build_training_sequences(target, cfg)[:8]
    feats = all_target_features(target.model, seqs, TINY_LAYER_IDS)
    d2t, t2d = draft_vocab_mapping(token_frequencies(seqs, target.model.config.vocab_size), 64)
    head = new_head(target, TINY_LAYER_IDS, d2t, t2d).train()
    w = target.model.get_output_embeddings().weight.detach()[draft_token_ids(d2t)]
    opt = torch.optim.AdamW([p for n, p in head.named_parameters() if not n.startswith(("embed", "lm_head"))], lr=3e-3)
    batch = collate(feats, "cpu")
    first = float(train_step(head, batch, w, cfg, opt).loss.detach())
    for _ in range(15):
        last = float(train_step(head, batch, w, cfg, opt).loss.detach())
    assert last < 0.7 * first
    assert head.fc.weight.dtype == torch.float32


def test_warm_start_settings_are_shorter_and_take_overrides():
    from specdec.training.eagle3 import WARM_START_DEFAULTS, Eagle3TrainConfig

    fresh, warm = Eagle3TrainConfig(), Eagle3TrainConfig.warm_start(epochs=1)
    assert warm.epochs == 1 and warm.num_sequences == WARM_START_DEFAULTS["num_sequences"]
    short = Eagle3TrainConfig.warm_start()
    assert short.num_sequences * short.epochs < fresh.num_sequences * fresh.epochs
    assert short.max_minutes <= 10 and fresh.max_minutes <= 30
    assert warm.recipe == fresh.recipe == "tasks"
