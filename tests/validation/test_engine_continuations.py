"""Continuations from the engine serving the target (a real ``llama-server`` on 127.0.0.1 serving SmolLM2
Q4_1; skipped with one line where it is not built): the replay night along the engine's continuations gives
the acceptance of the core-continuation night on the same prompts, within its CI, for an n-gram drafter and a
draft model (the target requantized to Q8_0); and the process of that night opens none of the target's weight
files (watched with strace where it exists, and with Python's ``open`` audit events)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specdec import NgramDrafter
from specdec.engines.llama_server import LlamaServerFlags
from specdec.validation.api import ValidationRequest, validate
from specdec.validation.config import ValidationConfig
from specdec.validation.continuation_cache import ContinuationCache
from tests.support.engine import draft_gguf, engine_or_skip, start_server, target_gguf
from tests.support.store import model_store
from tests.support.weight_watch import target_weights, watched, weight_opens

pytestmark = pytest.mark.slow
K, NEW_TOKENS, PROMPTS, KMAX = 4, 32, 12, 6
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def engine():
    return engine_or_skip()


@pytest.fixture(scope="module")
def pair(engine):
    from specdec.models import load_causal_lm

    torch.set_num_threads(1)
    store = model_store()
    return load_causal_lm(str(target_gguf()), store=store), load_causal_lm(str(draft_gguf(engine, "Q8_0")), store=store)


@pytest.fixture(scope="module")
def heldout(tmp_path_factory):
    """The shortest Spec-Bench prompts, two per category (12): the engine test stays cheap."""
    from specdec.validation.heldout import load_heldout

    by_cat: dict[str, list] = {}
    for p in sorted(load_heldout("spec_bench").prompts, key=lambda p: len(json.dumps(p.canonical()))):
        by_cat.setdefault(p.category, []).append(p)
    path = tmp_path_factory.mktemp("heldout") / "short.jsonl"
    path.write_text("".join(json.dumps(p.canonical()) + "\n" for ps in by_cat.values() for p in ps[:2]))
    return path


def test_the_watch_sees_a_weight_file_opened(pair, tmp_path):
    """The watch itself: a process that does read the target's weights is caught (the test can fail)."""
    target_dir = Path(pair[0].path)
    weights = target_weights(target_dir, target_gguf())
    trace = tmp_path / "trace"
    code = f"import safetensors.torch as s; s.load_file({str(weights[0])!r})"
    subprocess.run(watched([sys.executable, "-c", code], trace), check=True, cwd=ROOT)
    assert weight_opens(trace, [], weights) or not shutil.which("strace")
    assert weight_opens(tmp_path / "none", [str(weights[0])], weights)


def test_engine_night_matches_core_night_without_reading_target_weights(engine, pair, heldout, tmp_path):
    target, draft = pair
    cfg = ValidationConfig(num_speculative_tokens=K, max_new_tokens=NEW_TOKENS, limit=PROMPTS, warmup=False)
    from specdec.validation.heldout import load_heldout

    core = validate(ValidationRequest(target, [NgramDrafter(), draft.model], load_heldout(heldout), cfg,
                                      method="replay", cache=ContinuationCache(tmp_path / "core"), kmax=KMAX))
    flags = LlamaServerFlags(model=str(target_gguf()), spec_type="none", ctx_size=2048, threads=1)
    spec = {"target_dir": str(target.path), "draft_dir": str(draft.path), "heldout": str(heldout),
            "cache": str(tmp_path / "engine"), "out": str(tmp_path / "reports.json"), "k": K,
            "max_new_tokens": NEW_TOKENS, "limit": PROMPTS, "kmax": KMAX, "opens": str(tmp_path / "opens.json")}
    trace = tmp_path / "trace"
    with start_server(engine, flags, tmp_path) as server:
        spec["engine_url"] = server.url
        (tmp_path / "spec.json").write_text(json.dumps(spec))
        proc = subprocess.run(watched([sys.executable, "-m", "tests.support.engine_night", str(tmp_path / "spec.json")],
                                       trace), cwd=ROOT, capture_output=True, text=True,
                              env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert weight_opens(trace, json.loads((tmp_path / "opens.json").read_text()), target_weights(Path(target.path), target_gguf())) == []
    served = json.loads((tmp_path / "reports.json").read_text())
    for c, e in zip(core, served):
        lo, hi = c.overall.acceptance_rate_ci
        assert c.overall.num_prompts == e["overall"]["num_prompts"] == PROMPTS
        assert c.overall.num_draft_tokens > 50 and e["overall"]["num_draft_tokens"] > 50
        assert lo <= e["overall"]["acceptance_rate"] <= hi, (c.drafter_kind, c.overall.acceptance_rate, (lo, hi), e["overall"])
        assert e["replay"]["continuations"]["engine"] == PROMPTS and e["replay"]["target"]["loaded"] is False
        assert [r["k"] for r in e["replay"]["acceptance_by_k"]] == list(range(1, KMAX + 1))
        assert set(e["categories"]) == set(c.categories)
        assert e["device"].startswith("engine:")
