"""A model whose logits are NaN, on either side, through a real ``specdec nightly run`` (issue 32, item 2).

Before: a NaN target validated under greedy as a normal report with acceptance 0.000 (the nightly would
have told the team to re-train the draft), and a NaN draft at temperature 0.8 ended in a ``RuntimeError``
traceback from ``torch.multinomial``. Now the run names the broken side, the prompt and the first
position, records the row as ``error`` (no acceptance figure) and sends one alert.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from monitoring.receiver import WebhookReceiver
from tests.flows.test_nightly_crash_recovery import _env
from tests.support.models import save_tiny_checkpoint

pytestmark = pytest.mark.server
PAIR = "nan-pair"


def _nan_checkpoint(path, seed: int = 0):
    """A tiny checkpoint whose LM head is NaN (every logit NaN)."""
    from transformers import AutoModelForCausalLM

    src = save_tiny_checkpoint(path.with_name(path.name + "-src"), seed=seed)
    model = AutoModelForCausalLM.from_pretrained(src)
    with torch.no_grad():
        model.lm_head.weight.fill_(float("nan"))
    model.config.tie_word_embeddings = False
    model.save_pretrained(path, safe_serialization=True)
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(src).save_pretrained(path)
    return path


def _register(home, target: str, draft: str, temperature: float) -> None:
    code = (
        "from registry.register import register_pair_from_refs\n"
        "from specdec.models import ModelStore\n"
        "from specdec.settings import get_settings\n"
        "from specdec import SamplingConfig, SpeculativeConfig\n"
        "from registry import promote\n"
        "from registry.service import Registry\n"
        "from registry.settings import get_settings as registry_settings\n"
        "registry = Registry(registry_settings())\n"
        f"reg = register_pair_from_refs({target!r}, {draft!r}, name={PAIR!r}, target_name='nan-target',"
        f" draft_name='nan-draft', config=SpeculativeConfig(max_new_tokens=8,"
        f" sampling=SamplingConfig(temperature={temperature})), store=ModelStore(get_settings().models_dir),"
        " registry=registry)\n"
        "from registry.gate import GateConfig\n"
        "from specdec.settings.policy import get_policy\n"
        "promote(reg.pair.name, reg.pair.version, 'challenger', gate=GateConfig.from_policy(get_policy()), registry=registry)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_TRACKING", "SPECDEC_TRACKING"))}
    p = subprocess.run([sys.executable, "-c", code], env={**env, "SPECDEC_HOME": str(home)}, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]


@pytest.mark.parametrize("side", ["target", "draft"])
def test_nan_logits_are_an_error_of_that_model_with_one_alert(tmp_path, side):
    good = str(save_tiny_checkpoint(tmp_path / "good"))
    bad = str(_nan_checkpoint(tmp_path / "nan"))
    target, draft, temperature = (bad, "ngram", 0.0) if side == "target" else (good, bad, 0.8)
    rows = [{"id": f"p{i}", "category": "a", "prompt": f"abc abc abc {i} abc abc"} for i in range(6)]
    (tmp_path / "h.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    home = tmp_path / "home"
    home.mkdir()
    _register(home, target, draft, temperature)
    with WebhookReceiver() as rx:
        p = subprocess.run([sys.executable, "-m", "specdec.cli", "nightly", "run", "--pair", PAIR, "--alias",
                            "challenger", "--heldout", str(tmp_path / "h.jsonl"), "--limit", "6", "--device", "cpu"],
                           env=_env(home, rx), capture_output=True, text=True, timeout=900)
        fires = [r for r in rx.requests if ":fire:" in r.headers.get("Idempotency-Key", "")]
    out = p.stdout + p.stderr
    assert p.returncode == 1 and "Traceback" not in out and "multinomial" not in out, out[-3000:]
    assert f"the {side} model is broken" in out and "'p0'" in out and "token position" in out, out[-3000:]
    assert "0.000 [" not in out  # no acceptance figure
    assert len(fires) == 1 and f"the {side} model is broken" in json.dumps(fires[0].body), [r.body for r in rx.requests]

    import monitoring
    from monitoring import history

    os.environ["SPECDEC_HOME"] = str(home)
    try:
        db = monitoring.connect(monitoring.get_settings(home=home))
        (run,) = history.list_runs(db)
    finally:
        os.environ.pop("SPECDEC_HOME", None)
    assert run.status == "error" and f"the {side} model is broken" in run.error
    assert run.num_draft_tokens in (None, 0) and run.acceptance_rate is None
