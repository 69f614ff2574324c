"""`--method replay|both`: the continuation cache, the expected counters, the report and the CLI end to end."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch
from typer.testing import CliRunner

from specdec import SamplingConfig, autoregressive_generate
from specdec.cli import app
from tests.support.models import perturbed_copy, save_tiny_checkpoint, tiny_llama, tiny_tokenizer
from specdec.validation.config import ValidationConfig
from specdec.validation.continuation_cache import ContinuationCache, ContinuationKey, model_weights_hash
from specdec.validation.heldout import HeldoutPrompt, HeldoutSet, content_version
from specdec.validation.replay import draft_trace, replay_counters
from specdec.validation.replay_expected import expected_counters, position_alphas
from specdec.validation.api import ValidationRequest, validate
from specdec.validation.replay_run import ProducerChoice, replay_prompts
from specdec.validation.report import ValidationReport
from specdec.validation.teacher_forcing import teacher_forced_logits


def _key(**over):
    base = dict(target_weights="w" * 64, heldout_version="h1", prompt_id="p0", prompt_ids=[5, 6, 7],
                chat_template="t1", max_new_tokens=16, sampling=SamplingConfig(), seed=0, stop_token_ids=frozenset({2}),
                dtype=torch.float32, device="cpu")
    base.update(over)
    return ContinuationKey.build(**base)


CHANGES = {
    "target_weights": dict(target_weights="x" * 64), "heldout_version": dict(heldout_version="h2"),
    "prompt_id": dict(prompt_id="p1"), "prompt_tokens": dict(prompt_ids=[5, 6, 8]),
    "chat_template": dict(chat_template="t2"), "max_new_tokens": dict(max_new_tokens=17),
    "sampling": dict(sampling=SamplingConfig(temperature=0.7)), "stop_token_ids": dict(stop_token_ids=frozenset({3})),
    "dtype": dict(dtype=torch.bfloat16), "device": dict(device="cuda:0"), "engine": dict(engine="e" * 64),
}


def test_every_key_part_invalidates(tmp_path):
    assert set(CHANGES) == {f.name for f in dataclasses.fields(ContinuationKey)}  # a new key part needs a case here
    cache = ContinuationCache(tmp_path)
    cache.put(_key(), [9, 10, 11], "target-only")
    assert cache.get(_key()) == [9, 10, 11]
    for part, over in CHANGES.items():
        assert cache.get(_key(**over)) is None, part
    # the seed counts only when sampling
    assert cache.get(_key(seed=1)) == [9, 10, 11]
    hot = SamplingConfig(temperature=0.7)
    cache.put(_key(sampling=hot), [1], "target-only")
    assert cache.get(_key(sampling=hot, seed=1)) is None
    # a stored entry whose recorded key differs (e.g. a collision or a hand edit) is never served
    path = next(p for p in tmp_path.rglob("*.json") if json.loads(p.read_text())["tokens"] == [9, 10, 11])
    entry = json.loads(path.read_text())
    entry["key"]["max_new_tokens"] = 99
    path.write_text(json.dumps(entry))
    assert cache.get(_key()) is None


def _heldout(n=6, tag=""):
    prompts = [HeldoutPrompt(id=f"q{i}", category="abc"[i % 3], messages=[{"role": "user", "content": f"item {i} {tag}"}])
               for i in range(n)]
    return HeldoutSet("toy", content_version(prompts), prompts)


def test_cache_reused_when_only_the_draft_changed_and_never_otherwise(tmp_path):
    target, tok = tiny_llama(103, seed=0), tiny_tokenizer()
    cache = ContinuationCache(tmp_path)
    cfg = ValidationConfig(max_new_tokens=10, bootstrap_resamples=50)

    def run(tgt=target, draft_seed=3, heldout=None, config=cfg, tokenizer=tok):
        d = perturbed_copy(target, scale=0.05, seed=draft_seed)
        [r] = validate(ValidationRequest(tgt, [d], heldout or _heldout(), config, method="replay", tokenizer=tokenizer,
                                         cache=cache, kmax=4))
        return r.replay["continuations"]

    first = run()  # the model drafter and the n-gram drafter each produce 2, the faster the rest
    assert first["cache"] == 0 and first["target-only"] == 0
    assert first["speculative"] >= 2 and first["ngram"] >= 2 and first["speculative"] + first["ngram"] == 6
    assert run(draft_seed=4)["cache"] == 6  # another draft: same continuations
    assert run(tgt=perturbed_copy(target, scale=0.01, seed=5))["cache"] == 0  # target weights
    assert run(config=ValidationConfig(max_new_tokens=11, bootstrap_resamples=50))["cache"] == 0
    assert run(heldout=_heldout(tag="v2"))["cache"] == 0  # held-out version (and prompt tokens)
    other = tiny_tokenizer()
    other.chat_template = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    assert run(tokenizer=other)["cache"] == 0  # chat template
    sampled = ValidationConfig(max_new_tokens=10, sampling=SamplingConfig(temperature=1.0), bootstrap_resamples=50)
    assert run(config=sampled) == {"cache": 0, "speculative": 0, "ngram": 0, "target-only": 6}
    assert run(tgt=copy.deepcopy(target).to(torch.bfloat16))["cache"] == 0  # dtype
    assert model_weights_hash(target) == model_weights_hash(tiny_llama(103, seed=0))


def test_every_producer_emits_the_targets_greedy_continuation(tmp_path):
    # the cache holds what target-only greedy decoding emits, whichever producer made it
    target, tok = tiny_llama(103, seed=0), tiny_tokenizer()
    draft = perturbed_copy(target, scale=0.05, seed=3)
    cfg = ValidationConfig(max_new_tokens=12, bootstrap_resamples=50)
    out = replay_prompts(_heldout(8), target, tok, [draft], cfg, eos=None, ctx_limit=None, cache=ContinuationCache(tmp_path),
                         target_weights="w", kmax=4)
    assert {rp.produced_by for rp in out} == {"speculative", "ngram"}
    for rp in out:
        ref = autoregressive_generate(target, torch.tensor([rp.ids]), max_new_tokens=12, sampling=SamplingConfig())
        assert rp.continuation == ref.token_ids, rp.prompt.id


def test_producer_choice_takes_the_faster_after_its_trials():
    choice = ProducerChoice([("speculative", "m"), ("ngram", "n")], trials=2)
    order = []
    for _ in range(4):  # model drafter 2 s, n-gram 1 s per 10 tokens
        name, _ = choice.next()
        order.append(name)
        choice.record(name, 2.0 if name == "speculative" else 1.0, 10)
    assert sorted(order) == ["ngram", "ngram", "speculative", "speculative"]
    assert [choice.next()[0] for _ in range(3)] == ["ngram"] * 3
    assert choice.summary() == {"speculative": 0.2, "ngram": 0.1}
    with pytest.raises(ValueError):
        ProducerChoice([])


def test_expected_counters_equal_greedy_replay_in_the_one_hot_limit():
    # greedy p and q are one-hot: alpha_t is 1 where the draft's argmax is the target's, else 0,
    # so the expected counters must be the replayed counters exactly
    target, draft = tiny_llama(103, seed=0, init_std=0.3), perturbed_copy(tiny_llama(103, seed=0, init_std=0.3), scale=0.3, seed=2)
    ids = torch.randint(7, 103, (11,), generator=torch.Generator().manual_seed(1)).tolist()
    y = autoregressive_generate(target, torch.tensor([ids]), max_new_tokens=24, sampling=SamplingConfig()).token_ids
    z_p = teacher_forced_logits(target, ids + y[:-1], len(y))
    z_q = teacher_forced_logits(draft, ids + y[:-1], len(y))
    alphas = position_alphas(z_p, z_q, SamplingConfig())
    assert 0 < sum(alphas) < len(alphas)
    trace = draft_trace(draft, ids, y, 103, kmax=8)
    for k in range(1, 9):
        e = expected_counters(alphas, num_speculative_tokens=k, max_new_tokens=24)
        s = replay_counters(trace, y, num_speculative_tokens=k, max_new_tokens=24)
        assert (e.num_drafts, e.num_draft_tokens, e.num_accepted_tokens, e.num_rejected_steps) == (
            s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens, s.num_rejected_steps)
        assert e.accepted_per_position == s.accepted_per_position


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return save_tiny_checkpoint(root / "target", seed=0), save_tiny_checkpoint(root / "draft", seed=0, perturb=0.03)


def test_cli_method_both_end_to_end(ckpts, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    target, draft = ckpts
    heldout = tmp_path / "mine.jsonl"
    heldout.write_text("\n".join(json.dumps({"id": f"q{i}", "category": ["chat", "code", "math"][i % 3],
                                             "prompt": f"tell me about item {i}"}) for i in range(12)) + "\n")
    args = ["validate", "--target", target, "--draft", f"model:{draft}", "--draft", "ngram", "--heldout", heldout,
            "--max-new-tokens", 12, "-k", 3, "--device", "cpu", "--method", "both", "--bootstrap-resamples", 100]
    res = CliRunner().invoke(app, [*map(str, args), "--out", str(tmp_path / "out")], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "replay_decode_agreement: 1.000" in res.output and "recommended k from the replayed curve" in res.output
    model_report = ValidationReport.read(next((tmp_path / "out").glob("model*")))
    r = model_report.replay
    assert model_report.method == "both" and model_report.schema_version == 4
    assert r["num_prompts_replayed"] == 12 and r["num_prompts_decoded"] == 6  # 25% -> 3, raised to 2 per category
    assert r["replay_decode_agreement"] == 1.0 and r["disagreements"] == [] and r["gate_method"] == "replay"
    assert r["counters"]["replay_on_decoded"] == {**r["counters"]["decode"], "acceptance_rate_ci": r["counters"]["replay_on_decoded"]["acceptance_rate_ci"]}
    assert [row["k"] for row in r["acceptance_by_k"]] == list(range(1, 17))
    assert model_report.overall.num_prompts == 12 and model_report.overall.acceptance_rate == r["acceptance_by_k"][2]["acceptance_rate"]
    assert model_report.overall.num_draft_tokens == r["acceptance_by_k"][2]["num_draft_tokens"]
    assert r["recommended_num_speculative_tokens"] in range(1, 17) and r["cost_ratio"] > 0
    # the report's best k is the replayed curve's (one speed model, one set of costs)
    assert model_report.overall.recommended_num_speculative_tokens == r["recommended_num_speculative_tokens"]
    assert model_report.overall.verify_cost_by_n[0] == 1.0 and len(r["verify_cost_by_n"]) == 17
    # a second night with the same target: every continuation from the cache
    res = CliRunner().invoke(app, [*map(str, args), "--method", "replay", "--out", str(tmp_path / "again")])
    assert res.exit_code == 0, res.output
    again = ValidationReport.read(next((tmp_path / "again").glob("model*")))
    assert again.replay["continuations"]["cache"] == 12 and again.method == "replay"
    assert again.overall.num_accepted_tokens == model_report.overall.num_accepted_tokens
    bad = CliRunner().invoke(app, [*map(str, args), "--method", "nope", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 1 and "unknown --method" in bad.output


def test_reduced_precision_draft_reports_both_and_gates_on_decoding(tmp_path):
    target, tok = tiny_llama(103, seed=0), tiny_tokenizer()
    draft = perturbed_copy(target, scale=0.02, seed=3).to(torch.bfloat16)
    cfg = ValidationConfig(max_new_tokens=12, bootstrap_resamples=100)
    [r] = validate(ValidationRequest(target, [draft], _heldout(9), cfg, method="both", decode_fraction=0.1, tokenizer=tok,
                                     cache=ContinuationCache(tmp_path), kmax=6))
    sec = r.replay
    assert sec["precision"] == "bf16" and sec["gate_method"] == "decode"
    assert sec["num_prompts_replayed"] == 9 and sec["num_prompts_decoded"] == 6  # 10% of 9, raised to 2 per category
    # decoding gates: the overall acceptance is the decoded subsample's; the replay is kept next to it
    assert r.overall.num_prompts == 6 and r.overall.acceptance_rate == sec["counters"]["decode"]["acceptance_rate"]
    assert sec["counters"]["replay"]["num_prompts"] == 9 and isinstance(sec["replay_inside_decode_ci"], bool)
    for d in sec["disagreements"]:  # every difference is named and classified
        assert d["class"] in ("near-tie (numerics)", "beyond numerics", "draft stop after a rejection")
    assert r.overall.replay_beyond_numerics == sec["beyond_numerics"]
