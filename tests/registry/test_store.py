"""Registry round trip through real MLflow back ends: an SQLite store and a real ``mlflow server``.

The same flow runs on both: register target/draft/derived draft, register pairs, download them back,
log a validation run with artifacts, tag the pair version, promote through the gate, resolve the alias.
"""

from __future__ import annotations

import json

import pytest

from tests.support.mlflow_server import MlflowServer, sqlite_store
from tests.support.reports import tiny_report
from tests.support.models import save_tiny_checkpoint
from tests.support.gate import policy_gate
from tests.support.registry import open_registry_at


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    with MlflowServer(tmp_path_factory.mktemp("mlflow-server")) as server:
        yield server


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    return {"target": save_tiny_checkpoint(root / "target", seed=0),
            "draft": save_tiny_checkpoint(root / "draft", seed=0, perturb=0.2)}


@pytest.fixture(params=["sqlite", pytest.param("server", marks=pytest.mark.server)])
def store(request, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("SPECDEC_TRACKING_URI", raising=False)
    if request.param == "sqlite":
        return sqlite_store(tmp_path / "store")
    return request.getfixturevalue("mlflow_server").uri


def test_round_trip(store, ckpts, tmp_path):
    from mlflow import MlflowClient

    import registry as R
    from specdec.models.derived import DerivedDraftRecipe
    from specdec.models import tokenizer_sha256, weights_sha256
    from specdec.validation.report import ValidationReport

    # unique names: the server is shared by the whole session
    tag = tmp_path.name[-12:].replace("_", "-").strip("-")
    tname, dname, pair = f"tgt-{tag}", f"drf-{tag}", f"pair-{tag}"

    registry = open_registry_at(store)
    t = R.register_model_version(tname, ckpts["target"], source={"kind": "hub", "repo_id": "org/tiny", "revision": "abc123"},
                                 model_card="# tiny target\nrandom weights", registry=registry)
    assert (t.version, t.reused, t.weights_sha256) == ("1", False, weights_sha256(ckpts["target"]))
    assert t.tokenizer_sha256 == tokenizer_sha256(ckpts["target"])
    d = R.register_model_version(dname, ckpts["draft"], registry=registry)
    dd = R.register_derived_draft(t, DerivedDraftRecipe(kind="int8").to_dict(), registry=registry)
    assert dd.derived_from == t.uri and dd.tokenizer_sha256 == t.tokenizer_sha256

    cfg = R.SpeculativeConfig(3, max_new_tokens=16)
    pv = R.register_pair(t, d.uri, drafter_kind="model", config=cfg, compatibility={"compatible": True}, name=pair,
                         registry=registry)
    pv2 = R.register_pair(t, dd, drafter_kind="derived:int8", config=cfg, name=pair, registry=registry)
    assert (pv.version, pv.changed, pv2.version, pv2.changed) == ("1", "initial", "2", "draft")

    # read back: pair.json + artifacts downloaded, hashes intact
    back = R.get_pair_version(pair, "1", registry=registry)
    assert back.target_uri == f"models:/{tname}/1" and back.draft_uri == f"models:/{dname}/1"
    assert back.config == cfg and back.compatibility == {"compatible": True}
    assert back.target_source == {"kind": "hub", "repo_id": "org/tiny", "revision": "abc123"}
    assert weights_sha256(back.target_path) == t.weights_sha256
    assert tokenizer_sha256(back.target_path) == t.tokenizer_sha256
    assert weights_sha256(back.draft_path) == d.weights_sha256
    assert (back.target_path / "MODEL_CARD.md").read_text().startswith("# tiny target")
    derived = R.get_pair_version(pair, "2", registry=registry)
    assert derived.draft_path is not None and json.loads((derived.draft_path / "recipe.json").read_text())["derived_from"] == t.uri
    assert DerivedDraftRecipe.from_dict(derived.recipe) == DerivedDraftRecipe(kind="int8")

    # validation run
    report = tiny_report(0.72, (0.65, 0.79), num_speculative_tokens=3)
    evidently = tmp_path / "evidently.html"
    evidently.write_text("<html>drift</html>")
    run_id = R.log_validation(pair, "1", report, tmp_path / "report", extra_artifacts=[evidently], registry=registry, gate=policy_gate())
    client = MlflowClient(tracking_uri=store, registry_uri=store)
    run = client.get_run(run_id)
    m, p = run.data.metrics, run.data.params
    assert m["acceptance_rate"] == pytest.approx(0.72) and m["acceptance_rate_ci_low"] == pytest.approx(0.65)
    assert m["acceptance_rate.pos_0"] == pytest.approx(report.overall.per_position_acceptance[0])
    assert m["acceptance_rate.summarization"] == pytest.approx(0.72)
    assert m["acceptance_rate.coding"] == pytest.approx(0.82)
    assert {"mean_accepted_length", "alpha_tf", "alpha_hat", "top1_agreement", "total_variation", "kl_divergence",
            "speedup", "predicted_speedup", "cost_ratio", "acceptance_rate_ci_high"} <= set(m)
    assert p["heldout_name"] == "tiny-heldout" and p["heldout_version"] == "sha256:0000"
    assert (p["num_speculative_tokens"], p["temperature"], p["device"], p["dtype"], p["code_version"]) == ("3", "0.0", "cpu", "float32", "test")
    assert run.data.tags["specdec.pair"] == pair and run.data.tags["specdec.pair_version"] == "1"
    assert run.data.tags["validation_status"] == "passed"
    files = {f.path for f in client.list_artifacts(run_id)} | {f.path for f in client.list_artifacts(run_id, "plots")}
    assert {"report.json", "prompts.csv", "evidently.html", "plots/per_position_acceptance.png",
            "plots/per_category_acceptance.png", "plots/acceptance_trend.png"} <= files
    local = client.download_artifacts(run_id, "", str(tmp_path / "dl"))
    again = ValidationReport.read(local)
    assert again.overall.acceptance_rate == pytest.approx(0.72) and len(again.prompts) == len(report.prompts)
    assert (tmp_path / "dl" / "plots" / "acceptance_trend.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # what the user copies into serving: the engine profile's config at the validated k (default engine vllm)
    # model references are what vLLM loads: the draft's local checkpoint directory, never an MLflow URI
    serving = json.loads((tmp_path / "dl" / "serving_config.json").read_text())
    assert serving["speculative_config"] == {"method": "draft_model", "model": str(ckpts["draft"].resolve()),
                                             "num_speculative_tokens": 3, "draft_sample_method": "greedy"}
    tags = client.get_model_version(pair, "1").tags
    assert tags["validation_status"] == "passed" and tags["acceptance_rate"] == "0.720"
    assert client.get_model_version(pair, "1").description.startswith("passed: acc 0.72 [0.65-0.79] at k=3")

    # promotion through the gate, alias read back
    res = R.promote(pair, "1", registry=registry, gate=policy_gate())
    assert res.gate.passed and res.gate.run_id == run_id and not res.forced
    assert R.resolve_alias(pair, "champion", registry=registry) == "1"
    champ = R.get_pair_version(pair, "@champion", download=False, registry=registry)
    assert champ.version == "1" and champ.aliases == ["champion"]
    with pytest.raises(R.PromotionRefused, match="never validated"):
        R.promote(pair, "2", registry=registry, gate=policy_gate())
    listed = R.list_pair_versions(pair, registry=registry)
    assert [(x.version, x.aliases, x.validation_status) for x in listed] == [("2", [], None), ("1", ["champion"], "passed")]
