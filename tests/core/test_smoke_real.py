"""Real smoke: SmolLM2-135M-Instruct target + NgramDrafter, greedy, on 3 Spec-Bench prompts.

Greedy speculative output must be token-identical to target-only decoding. The step counts are
printed (run with ``-s``) and written to ``$SPECDEC_HOME/results/core_smoke.json``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from specdec import NgramDrafter, SamplingConfig, autoregressive_generate, load_causal_lm, speculative_generate

from tests.support.store import model_store

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
QUESTIONS = REPO / "specdec" / "data" / "heldout" / "spec_bench" / "question.jsonl"
SMOKE_IDS = {161: "translation", 241: "summarization", 481: "rag"}
NEW_TOKENS = 64
K = 4


@pytest.fixture(scope="module")
def smollm2():
    mp = pytest.MonkeyPatch()
    mp.setenv("SPECDEC_HOME", os.environ.get("SPECDEC_HOME") or str(REPO / ".specdec"))
    threads = torch.get_num_threads()
    torch.set_num_threads(max(2, threads))  # a 135M model benefits from both cores
    yield load_causal_lm("smollm2", store=model_store())
    torch.set_num_threads(threads)
    mp.undo()


def _prompts():
    rows = [json.loads(line) for line in QUESTIONS.read_text().splitlines() if line.strip()]
    return [(r["question_id"], r["category"], r["turns"][0]) for r in rows if r["question_id"] in SMOKE_IDS]


def test_smollm2_ngram_greedy_is_token_identical(smollm2):
    tok, model = smollm2.tokenizer, smollm2.model
    results = []
    pooled = None
    for qid, category, text in _prompts():
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)["input_ids"]
        ref = autoregressive_generate(model, ids, max_new_tokens=NEW_TOKENS, sampling=SamplingConfig(),
                                      eos_token_id=tok.eos_token_id)
        spec = speculative_generate(model, NgramDrafter(), ids, num_speculative_tokens=K, max_new_tokens=NEW_TOKENS,
                                    sampling=SamplingConfig(), eos_token_id=tok.eos_token_id)
        assert spec.token_ids == ref.token_ids, f"prompt {qid}: speculative output diverged"
        s = spec.stats
        pooled = s if pooled is None else pooled.merge(s)
        results.append({"question_id": qid, "category": category, "prompt_tokens": ids.shape[1],
                        "new_tokens": len(spec.token_ids), "target_only_steps": ref.stats.target_forward_passes,
                        **{k: v for k, v in s.to_dict().items() if "seconds" not in k}})
    summary = {"k": K, "max_new_tokens": NEW_TOKENS, "prompts": results,
               "acceptance_rate": pooled.acceptance_rate, "mean_accepted_length": pooled.mean_accepted_length,
               "target_forward_passes": pooled.target_forward_passes,
               "target_only_forward_passes": sum(r["target_only_steps"] for r in results)}
    out = Path(os.environ.get("SPECDEC_HOME") or REPO / ".specdec") / "results" / "core_smoke.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2))
    print("\n[smoke]", json.dumps({k: v for k, v in summary.items() if k != "prompts"}))
    for r in results:
        print("[smoke]", r["question_id"], r["category"], "prompt", r["prompt_tokens"], "new", r["new_tokens"],
              "target passes", r["target_forward_passes"], "vs", r["target_only_steps"],
              "drafts", r["num_drafts"], "drafted", r["num_draft_tokens"], "accepted", r["num_accepted_tokens"])
    assert pooled.num_drafts > 0 and pooled.num_accepted_tokens > 0
    assert pooled.target_forward_passes < summary["target_only_forward_passes"]
