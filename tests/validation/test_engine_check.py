"""The engine check against a real ``llama-server`` on 127.0.0.1 (built from the pinned llama.cpp sdist;
skipped with one line where it is not built): the real pair (SmolLM2 Q4_1 target, the same file
requantized to Q8_0 as the draft), greedy, k = 4. (A Q4_0 draft accepts a few points less in
llama.cpp than the core predicts: its quantized-activation kernels flip near ties the fp32 core does
not; benchmarks/results/*-engine-check-cpu.md.)

(a) the engine and the core agree on the real pair: the paired difference CI contains 0, and the
    per-request counters equal the server's ``/metrics`` delta;
(b) a serving-side fault (the engine restarted with another draft file, Q4_0, while the registered
    pair, Q8_0, is unchanged) gives the engine finding: one alert naming the engine and what changed, no "re-train
    the draft" hint; the next healthy night resolves it;
(c) a drafting threshold the pair was not validated with (``--spec-draft-p-min 0.8``, undeclared) drafts far
    less: a ``delivery`` finding, although the engine's acceptance rate goes up;
(d) another target file behind the engine is a ``fingerprint`` finding before any number; a server started with
    a synthetic-acceptance mode is refused (docs/engine-check.md);
(e) the engine check is a measurement of ``validate()``: next to the replay, the drafter's report carries exactly
    what the check measured, and it round-trips with the report.

The check runs through the one validation entry, ``validate(ValidationRequest(..., engine_check=...))``.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest
import torch

from monitoring import engine_checks
from monitoring.db import Incident, connect
from monitoring.receiver import WebhookReceiver
from monitoring.settings import MonitoringSettings
from specdec.engines.llama_server import LlamaServerFlags
from specdec.settings import CoreSettings
from specdec.validation.config import ValidationConfig
from specdec.kinds import ResolvedDrafter
from specdec.validation.api import ValidationRequest, validate
from specdec.validation.engine_check import EngineCheck, EngineEndpoint
from specdec.validation.heldout import load_heldout
from tests.support.engine import draft_gguf, engine_or_skip, start_server, target_gguf
from tests.support.nightly import webhook_settings
from tests.support.gate import policy_gate
from tests.support.continuations import home_continuations
from tests.support.store import model_store
from tests.support.registry import open_registry_at

pytestmark = pytest.mark.slow
K, NEW_TOKENS, PROMPTS = 4, 32, 12


@pytest.fixture(scope="module")
def engine():
    return engine_or_skip()


@pytest.fixture(scope="module")
def pair(engine):
    """(target LoadedModel, draft LoadedModel, target GGUF, Q8_0 draft GGUF, Q4_0 draft GGUF: the wrong file)."""
    from specdec.models import load_causal_lm

    torch.set_num_threads(1)
    t_gguf, d_gguf, bad_gguf = target_gguf(), draft_gguf(engine, "Q8_0"), draft_gguf(engine, "Q4_0")
    store = model_store()
    return load_causal_lm(str(t_gguf), store=store), load_causal_lm(str(d_gguf), store=store), t_gguf, d_gguf, bad_gguf


@pytest.fixture(scope="module")
def heldout(tmp_path_factory):
    """The shortest Spec-Bench prompt of each category, twice over (12 prompts): the engine test stays cheap."""
    full = load_heldout("spec_bench")
    by_cat: dict[str, list] = {}
    for p in sorted(full.prompts, key=lambda p: len(json.dumps(p.canonical()))):
        by_cat.setdefault(p.category, []).append(p)
    chosen = [p for ps in by_cat.values() for p in ps[:2]]
    path = tmp_path_factory.mktemp("heldout") / "short.jsonl"
    path.write_text("".join(json.dumps(p.canonical()) + "\n" for p in chosen))
    return load_heldout(path)


def _flags(t_gguf, d_gguf, **over) -> LlamaServerFlags:
    return LlamaServerFlags(model=str(t_gguf), draft=str(d_gguf), n_max=K, ctx_size=2048, threads=1, **over)


def _request(pair, heldout, server, *, declare: bool = True, method: str = "engine") -> ValidationRequest:
    """The engine check of the pair (target and draft named by their GGUF files) at ``server``."""
    target, draft = pair[0], pair[1]
    cfg = ValidationConfig(num_speculative_tokens=K, max_new_tokens=NEW_TOKENS, limit=PROMPTS)
    ep = EngineEndpoint(url=server.url, flags=tuple(server.command) if declare else None)
    return ValidationRequest(target, [ResolvedDrafter(draft.model, "model", str(pair[3]))], heldout, cfg, method=method,
                             target_ref=str(pair[2]), engine_check=EngineCheck(ep), cache=home_continuations())


def _check(pair, heldout, server, flags, *, declare: bool = True) -> object:
    return validate(_request(pair, heldout, server, declare=declare))[0].engine_check


def test_engine_and_core_agree_on_the_real_pair(engine, pair, heldout, tmp_path):
    with start_server(engine, _flags(pair[2], pair[3]), tmp_path) as server:
        rep = _check(pair, heldout, server, None)
    o = rep.overall
    assert o.num_prompts == PROMPTS and o.engine_draft_tokens > 100 and o.core_draft_tokens > 100
    lo, hi = o.difference_ci
    assert lo <= 0.0 <= hi, f"engine {o.engine_acceptance_rate:.3f} vs core {o.core_acceptance_rate:.3f}: {o.difference_ci}"
    assert rep.verdict == "agrees"
    assert not rep.notes, rep.notes  # per-request sums == /metrics delta (nothing else used the server)
    assert sum(rep.engine_per_position) == o.engine_accepted_tokens and len(rep.engine_per_position) == K
    assert rep.audit["checked"] == PROMPTS and rep.audit["divergent"] == 0  # only near-tie flips, if any
    assert rep.fingerprint["model_ftype"] == "Q4_1" and rep.fingerprint["draft_sha256"]
    assert rep.findings == [], rep.findings  # the fingerprint matches the pair (file hashes, vocabulary, BOS/EOS)
    d = rep.delivery  # per step, the engine delivers what the core's replay of the validated rule does
    assert 0.9 <= d.draft_tokens_ratio <= 1.1 and d.engine.drafts and d.engine.per_position == rep.engine_per_position


def test_another_draft_file_in_the_engine_is_attributed_to_the_serving_stack(engine, pair, heldout, tmp_path):
    """Night 1 healthy, night 2 the engine serves the Q4_0 file (the registered draft is still Q8_0), night 3
    healthy again: one fire naming the engine and the changed draft file, no re-train hint, one resolve."""
    with WebhookReceiver() as receiver:
        settings = webhook_settings(tmp_path / "history.db", receiver.url("/hook"))
        db = connect(settings)
        nights = [("healthy", pair[3]), ("wrong draft file", pair[4]), ("healthy again", pair[3])]
        seen = []
        for i, (label, served_draft) in enumerate(nights):
            with start_server(engine, _flags(pair[2], served_draft), tmp_path / label.replace(" ", "-")) as server:
                rep = _check(pair, heldout, server, None)
            run_id = engine_checks.record_engine_check(db, rep, pair="smol-gguf", version="1", alias="champion",
                                                       scheduled_date=dt.date(2026, 12, 1) + dt.timedelta(days=i))
            ev = engine_checks.evaluate_engine_check(db, run_id, settings=settings)
            seen.append((label, rep, ev, engine_checks.alert_engine_check(db, ev, settings=settings)))
        (_, r1, e1, t1), (_, r2, e2, t2), (_, r3, e3, t3) = seen
        assert (e1.verdict, t1) == ("passed", None), e1.root_cause_hint
        assert r2.verdict == "engine accepts less" and r2.overall.difference_ci[1] < 0
        assert [f.kind for f in r2.findings] == ["fingerprint"] and "the engine serves draft draft-Q4_0.gguf" in \
            r2.findings[0].message
        assert e2.verdict == "failed" and t2 == "fire"
        assert "serving stack" in e2.root_cause_hint and "draft file: sha256" in e2.root_cause_hint
        assert "re-train" not in e2.root_cause_hint and "retrain" not in e2.root_cause_hint
        assert (e3.verdict, t3) == ("passed", "resolve")
        bodies = [r.body for r in receiver.accepted]
        assert [b["event"] for b in bodies] == ["fire", "resolve"]
        text = json.dumps(bodies[0])
        assert "engine:llamacpp" in text and "draft file" in text and "re-train" not in text
        with db.session() as s:
            assert s.query(Incident).count() == 1


def test_a_drafting_threshold_in_the_engine_is_a_delivery_finding_though_its_rate_rises(engine, pair, heldout, tmp_path):
    """The issue's real case: llama-server started with ``--spec-draft-p-min 0.8`` (the pair validated at 0) and the
    flags not declared: the engine drafts a fraction of the validated rule's tokens and accepts more of them."""
    with start_server(engine, _flags(pair[2], pair[3], p_min=0.8), tmp_path) as server:
        rep = _check(pair, heldout, server, None, declare=False)
    d, o = rep.delivery, rep.overall
    assert d.draft_tokens_ratio_ci[1] < 0.9, (d.engine, d.core)
    assert o.engine_acceptance_rate >= o.core_acceptance_rate  # the rate alone reads as better
    assert [f.kind for f in rep.findings] == ["delivery"], rep.findings
    assert "drafts less than the validated rule (k=4)" in rep.findings[0].message


def test_another_target_file_is_a_finding_before_any_number_and_synthetic_acceptance_is_refused(
        engine, pair, heldout, tmp_path):
    from specdec.engines.errors import EngineRefusedError

    with start_server(engine, _flags(pair[3], pair[3]), tmp_path / "other-target") as server:  # the Q8_0 file as target
        rep = _check(pair, heldout, server, None)
    assert rep.verdict == "not compared" and rep.overall.num_prompts == 0
    assert [f.kind for f in rep.findings] == ["fingerprint"]
    assert "the engine serves target draft-Q8_0.gguf" in rep.findings[0].message and pair[2].name in rep.findings[0].message
    synth = _flags(pair[2], pair[3], extra=("--spec-synth-len", "3"))
    with start_server(engine, synth, tmp_path / "synthetic") as server:
        with pytest.raises(EngineRefusedError, match="--spec-synth-len"):
            _check(pair, heldout, server, None)


def test_validate_carries_what_the_engine_check_measured_next_to_the_replay(engine, pair, heldout, tmp_path, monkeypatch):
    """``validate()`` with ``engine_check`` and method replay: the drafter's report is the replay's, its engine section
    is the very :class:`EngineCheckReport` the engine measurement returned, and it round-trips with the report."""
    import specdec.validation.api as api
    from specdec.validation.report import ValidationReport

    measured, measure = [], api.measure_engine
    monkeypatch.setattr(api, "measure_engine", lambda run: measured.append(measure(run)) or measured[-1])
    with start_server(engine, _flags(pair[2], pair[3]), tmp_path) as server:
        [rep] = validate(_request(pair, heldout, server, method="replay"))
    assert len(measured) == 1 and rep.engine_check is measured[0]
    assert rep.method == "replay" and rep.replay is not None and rep.overall.num_prompts == PROMPTS
    e = rep.engine_check
    assert e.overall.num_prompts == PROMPTS and e.findings == [] and e.verdict == "agrees", (e.verdict, e.findings)
    assert (e.engine, e.target_ref, e.drafter_ref) == ("llamacpp", str(pair[2]), str(pair[3]))
    back = ValidationReport.read(rep.write(tmp_path / "report"))
    assert back.engine_check is not None and back.engine_check.to_dict() == e.to_dict()
    assert back.to_dict() == rep.to_dict()


def test_gguf_pair_for_llamacpp_registers_shows_its_command_and_the_nightly_checks_its_engine(
        engine, pair, heldout, tmp_path, monkeypatch):
    """Register the GGUF pair for llama.cpp (file hashes as lineage), `pair show` prints the llama-server command,
    `pair engine` names the endpoint, and the nightly's engine step records an `engine:llamacpp` row that passes."""
    from typer.testing import CliRunner

    import registry as R
    from specdec.cli import app
    from specdec.models.hashes import file_sha256
    from specdec.settings import get_settings
    from tests.support.mlflow_server import sqlite_store
    from tests.support.reports import tiny_report

    t_gguf, d_gguf = pair[2], pair[3]
    monkeypatch.setenv("SPECDEC_MODELS_DIR", str(get_settings().models_dir))  # reuse the GGUF conversions
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SPECDEC_TRACKING_URI", sqlite_store(tmp_path / "store"))
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.setenv("SPECDEC_ENGINE_REQUEST_TIMEOUT_S", "1800")  # 64-token requests on a shared, loaded 2-core runner
    runner = CliRunner()
    r = runner.invoke(app, ["pair", "register", "--target", str(t_gguf), "--draft", str(d_gguf), "--engine", "llamacpp",
                            "-k", str(K), "--name", "smol-gguf"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    registry = open_registry_at()
    pv = R.get_pair_version("smol-gguf", "1", download=False, registry=registry)
    assert pv.tags["engine"] == "llamacpp"
    assert pv.tags["target.gguf_sha256"] == file_sha256(t_gguf) and pv.tags["draft.gguf_sha256"] == file_sha256(d_gguf)
    R.log_validation("smol-gguf", "1", tiny_report(0.6, (0.55, 0.65), num_speculative_tokens=K), tmp_path / "rep", gate=policy_gate(), registry=registry)
    r = runner.invoke(app, ["pair", "show", "smol-gguf", "1"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "llama-server -m" in r.output and "--spec-draft-model" in r.output  # the table's serving config row
    sc = __import__("json").loads(runner.invoke(app, ["pair", "show", "smol-gguf", "1", "--json"]).stdout)["serving_config"]
    assert sc["command"].startswith(f"llama-server -m {t_gguf} ") and f"--spec-draft-model {d_gguf}" in sc["command"]
    assert f"--spec-draft-n-max {K}" in sc["command"] and "--spec-draft-p-min 0" in sc["command"]

    # the nightly's engine step on this pair version, against the engine serving it
    from flows.engine_check import run_engine_check
    from flows.nightly import Target, ValidationParams
    from monitoring.db import ValidationRun

    with start_server(engine, _flags(t_gguf, d_gguf), tmp_path) as server:
        r = runner.invoke(app, ["pair", "engine", "smol-gguf", "1", "--url", server.url, "--flags",
                                " ".join(server.command)], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        settings = MonitoringSettings(db_url=f"sqlite:///{tmp_path / 'history.db'}")
        night = type("Night", (), dict(held=heldout, db=connect(settings), settings=settings, date=dt.date(2026, 12, 2),
                                       core=CoreSettings()))()
        pv = R.get_pair_version("smol-gguf", "1", download=False, registry=registry)
        params = ValidationParams("short", PROMPTS, "cpu", "float32", 0, 1, "replay", 0.25)
        res = run_engine_check(night, Target("smol-gguf", "champion", pv, None), params)
    assert res is not None and res.status == "passed", res
    with night.db.session() as s:
        row = s.query(ValidationRun).filter_by(source="engine", engine="llamacpp").one()
        assert row.num_draft_tokens > 100 and row.config["engine_check"]["fingerprint"]["draft_sha256"] == file_sha256(d_gguf)
