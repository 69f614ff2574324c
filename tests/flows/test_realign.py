"""The re-alignment flow on a tiny stale eagle3 pair: warm-start re-training from the old head on the new
target, registered with lineage as @challenger, run by remediate_drift for a fired drift alert only."""

from __future__ import annotations

import pytest

from tests.training.eagle3_support import TINY_LAYER_IDS, quick_config, tiny_target_dir
from tests.support.gate import policy_gate
from tests.support.store import model_store
from tests.support.registry import open_registry_at

PAIR = "pair-realign"


@pytest.fixture(scope="module")
def stale(tmp_path_factory, prefect_harness):
    """Target t1 with its head h1 (pair v1), then t2 = t1 fine-tuned with the old head (pair v2, @challenger)."""
    from specdec.models import load_causal_lm
    from specdec.training import train_eagle3_head

    tmp = tmp_path_factory.mktemp("realign")
    mp = pytest.MonkeyPatch()
    mp.setenv("SPECDEC_HOME", str(tmp / "home"))
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    mp.delenv("SPECDEC_TRACKING_URI", raising=False)
    t1, t2 = tiny_target_dir(tmp / "t1"), tiny_target_dir(tmp / "t2", perturb=0.05)
    h1 = train_eagle3_head(load_causal_lm(str(t1), store=model_store()), out_dir=tmp / "h1", layer_ids=TINY_LAYER_IDS, progress=False,
                           config=quick_config(epochs=1, num_sequences=8))
    from registry.register import register_trained_head

    registry = open_registry_at()
    v1 = register_trained_head(h1.out_dir, PAIR, str(t1), alias=None, head_name="tiny-head", gate=policy_gate(),
                               store=model_store(), registry=registry)
    from specdec.core.config import SamplingConfig, SpeculativeConfig

    served = SpeculativeConfig(3, SamplingConfig(temperature=0.7, top_p=0.9), 48, draft_sampling="argmax")
    v2 = register_trained_head(v1.draft_uri, PAIR, str(t2), alias="challenger", config=served, engine="vllm", gate=policy_gate(),
                               store=model_store(), registry=registry)
    yield {"t2": t2, "v1": v1, "v2": v2}
    mp.undo()


def test_remediation_retrains_the_head_from_its_last_version_and_registers_a_challenger(stale):
    import registry as R
    from flows.realign import remediate_drift
    from flows.tasks import NightlyResult

    v1, v2 = stale["v1"], stale["v2"]
    assert (v2.changed, v2.draft_uri) == ("target", v1.draft_uri)  # the stale pair: new target, old head
    quiet = NightlyResult(pair=PAIR, alias="challenger", version=v2.version, status="passed")
    fired = NightlyResult(pair=PAIR, alias="challenger", version=v2.version, status="failed", alert_transition="fire")
    config = {"num_sequences": 8, "response_tokens": 40, "epochs": 1, "batch_size": 4}
    registry = open_registry_at()
    assert remediate_drift([quiet], config=config, registry=registry) == []
    (out,) = remediate_drift([quiet, fired], config=config, registry=registry)
    assert out["parent_head"] == v1.draft_uri == "models:/tiny-head/1"
    # the re-trained head is the next version of its parent's registered model
    assert out["head_uri"] == "models:/tiny-head/2" and out["target"] == v2.target_uri
    assert out["steps"] == out["total_steps"] == 2
    pv = R.get_pair_version(PAIR, "challenger", download=False, registry=registry)
    assert pv.version == out["version"] == "3" and pv.changed == "draft" and pv.drafter_kind == "eagle3"
    assert pv.config == v2.config and pv.config.num_speculative_tokens == 3  # the drifted version's decoding config
    assert pv.tags.get("engine") == "vllm"
    head = R.get_model_version(out["head_uri"], registry=registry)
    assert head.tags["eagle3.parent"] == v1.draft_uri and head.tags["eagle3.target"] == v2.target_uri


def test_a_non_eagle3_pair_is_not_retrained(stale):
    from flows.realign import realign_eagle3_flow
    from registry.register import register_pair_from_refs

    register_pair_from_refs(str(stale["t2"]), "ngram", name="pair-ngram", store=model_store(), registry=open_registry_at())
    with pytest.raises(ValueError, match="only EAGLE-3 heads are re-trained"):
        realign_eagle3_flow(pair="pair-ngram", alias="1")
