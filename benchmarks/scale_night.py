"""Benchmark: one pair's replay night, with the target's continuations from the core, from the engine serving
the target, and from the engine with the prompts sharded over 2 Dask workers; the night model's prediction
(:func:`specdec.validation.speed.night_seconds`) beside each (issue 40, docs/scale.md).

The pair: SmolLM2-135M-Instruct (the Q4_1 GGUF; the core runs it dequantized, fp32) and its Q8_0 requantization as
the draft model; ``llama-server`` (no speculation, ``-np 2``) serves the target. Greedy, ``--prompts`` stratified
Spec-Bench prompts, ``--new-tokens`` each, every k up to 8 replayed, one torch thread per process. The model's
rates come from a pilot night on ``--pilot`` other prompts per mode (seconds per continuation token, replay
seconds per prompt, a worker's model loading), then predict the full nights. Every night starts from an empty
continuation cache. Output: ``benchmarks/results/<date>-scale-night-cpu.{json,md}`` with the CPU and the load.

    .venv/bin/python benchmarks/scale_night.py --prompts 48 --new-tokens 64 --pilot 6
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import tempfile
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
K, KMAX = 4, 8


@dataclasses.dataclass(frozen=True)
class Spec:
    """What every process of a night needs (plain data: it travels to the Dask workers)."""

    target_dir: str
    draft_dir: str
    url: str
    prompts: int
    new_tokens: int
    seed: int
    cache: str


def _config(spec: Spec):
    from specdec.validation.config import ValidationConfig

    return ValidationConfig(num_speculative_tokens=K, max_new_tokens=spec.new_tokens, limit=spec.prompts,
                            seed=spec.seed, warmup=False, bootstrap_resamples=1000)


def _engine_request(spec: Spec):
    """A request whose continuations come from the engine (served target, no weights); its load seconds."""
    from specdec import load_causal_lm
    from specdec.engines.profile import EngineEndpoint, EngineLimits
    from specdec.settings import model_store
    from specdec.validation.api import ValidationRequest
    from specdec.validation.continuation_cache import ContinuationCache
    from specdec.validation.engine_continuations import connect_engine
    from specdec.validation.heldout import load_heldout
    from specdec.validation.served_target import served_target

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    target, draft = served_target(spec.target_dir), load_causal_lm(spec.draft_dir, store=model_store())
    engine = connect_engine(EngineEndpoint(url=spec.url), EngineLimits())
    req = ValidationRequest(target, [draft.model], load_heldout("spec_bench"), _config(spec), method="replay",
                            kmax=KMAX, cache=ContinuationCache(spec.cache), engine=engine)
    return req, time.perf_counter() - t0


def shard_task(spec: Spec, shard: int):
    """One Dask worker's shard (loads its models, as a nightly worker does)."""
    from specdec.validation.shard import measure_shard

    t0 = time.perf_counter()
    req, load_s = _engine_request(spec)
    try:
        res = measure_shard(req, shard, 2)
    finally:
        req.engine.close()
    return res, load_s, time.perf_counter() - t0


def _rates(reports, engine_streams=None, setup=0.0, pool=0.0):
    from specdec.validation.speed import NightRates

    sec = reports[0].replay["seconds"]
    rows = reports[0].replay["prompts"]
    tokens = sum(r["num_emitted_tokens"] for r in rows)
    return NightRates(sec["continuation"] / max(tokens, 1), sec["replay"] / max(len(rows), 1), engine_streams, setup, pool)


def _summary(name: str, wall: float, predicted: float, report) -> dict:
    o = report.overall
    return {"mode": name, "wall_s": round(wall, 1), "predicted_s": round(predicted, 1),
            "measured_over_predicted": round(wall / predicted, 2), "acceptance_rate": round(o.acceptance_rate, 4),
            "acceptance_rate_ci": [round(x, 4) for x in o.acceptance_rate_ci], "num_prompts": o.num_prompts,
            "num_draft_tokens": o.num_draft_tokens, "continuations": report.replay["continuations"]}


def _core_night(target, draft, spec: Spec):
    from specdec.validation.api import ValidationRequest, validate
    from specdec.validation.continuation_cache import ContinuationCache
    from specdec.validation.heldout import load_heldout

    t0 = time.perf_counter()
    [r] = validate(ValidationRequest(target, [draft.model], load_heldout("spec_bench"), _config(spec), method="replay",
                                     kmax=KMAX, cache=ContinuationCache(spec.cache)))
    return r, time.perf_counter() - t0


def _engine_night(spec: Spec):
    from specdec.validation.api import validate

    t0 = time.perf_counter()
    req, _ = _engine_request(spec)
    try:
        [r] = validate(req)
    finally:
        req.engine.close()
    return r, time.perf_counter() - t0


def _sharded_night(client, spec: Spec):
    from specdec.validation.api import validate
    from specdec.validation.shard import pool

    t0 = time.perf_counter()
    futures = [client.submit(shard_task, spec, s, pure=False) for s in (0, 1)]
    got = client.gather(futures)
    t1 = time.perf_counter()
    req, _ = _engine_request(spec)
    try:
        [r] = validate(dataclasses.replace(req, replayed=pool([g[0] for g in got])))
    finally:
        req.engine.close()
    t2 = time.perf_counter()
    return r, t2 - t0, {"load_s": [round(g[1], 1) for g in got], "shard_s": [round(g[2], 1) for g in got],
                        "pool_s": round(t2 - t1, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=48)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--pilot", type=int, default=6)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from distributed import Client, LocalCluster

    from specdec import load_causal_lm
    from specdec.engines.llama_server import LlamaServer, LlamaServerFlags, quantize_gguf
    from specdec.engines.llamacpp_build import installed_llama_cpp
    from specdec.settings import get_settings
    from specdec.models.resolve import smollm2_gguf
    from specdec.settings import model_store
    from specdec.validation.machine import cpu_model
    from specdec.validation.speed import NightPlan, night_seconds

    torch.set_num_threads(1)
    install, gguf = installed_llama_cpp(get_settings().engines_dir), smollm2_gguf(model_store())
    if install is None:
        raise SystemExit("llama-server is not built: `make engine` first")
    draft_gguf = quantize_gguf(install.quantize, gguf, gguf.parent / "draft-Q8_0.gguf", "Q8_0")
    target, draft = load_causal_lm(str(gguf), store=model_store()), load_causal_lm(str(draft_gguf), store=model_store())
    load0, tmp = os.getloadavg(), Path(tempfile.mkdtemp(prefix="scale-night-"))
    flags = LlamaServerFlags(model=str(gguf), spec_type="none", ctx_size=8192, parallel=2, threads=1)
    out: dict = {"date": dt.date.today().isoformat(), "cpu": cpu_model(), "nproc": os.cpu_count(), "prompts": args.prompts,
                 "new_tokens": args.new_tokens, "pilot_prompts": args.pilot, "k": K, "kmax": KMAX,
                 "engine": f"llama-server {install.version} -np 2 -t 1 (no speculation), SmolLM2-135M Q4_1",
                 "loadavg_start": [round(x, 2) for x in load0], "runs": []}
    with LlamaServer(install.server, flags, tmp / "llama-server.log").start() as server:
        spec = lambda n, seed, name: Spec(str(target.path), str(draft.path), server.url, n, args.new_tokens, seed,  # noqa: E731
                                          str(tmp / name))
        pilot_core, _ = _core_night(target, draft, spec(args.pilot, 7, "pilot-core"))
        pilot_engine, _ = _engine_night(spec(args.pilot, 7, "pilot-engine"))
        _, load_s = _engine_request(spec(args.pilot, 7, "pilot-engine"))
        core_rates, engine_rates = _rates([pilot_core]), _rates([pilot_engine], engine_streams=1)  # -np 2 slots but -t 1: one stream of compute
        out["rates"] = {"core": dataclasses.asdict(core_rates), "engine": dataclasses.asdict(engine_rates),
                        "worker_load_s": round(load_s, 1)}
        plan = NightPlan(args.prompts, args.new_tokens)
        r, wall = _core_night(target, draft, spec(args.prompts, 0, "core"))
        out["runs"].append(_summary("core continuations, 1 process", wall, night_seconds(plan, core_rates), r))
        r, wall = _engine_night(spec(args.prompts, 0, "engine"))
        out["runs"].append(_summary("engine continuations, 1 process", wall, night_seconds(plan, engine_rates), r))
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
                Client(cluster) as client:
            r, wall, parts = _sharded_night(client, spec(args.prompts, 0, "sharded"))
        sharded_rates = dataclasses.replace(engine_rates, setup_seconds=load_s, pool_seconds=load_s)
        row = _summary("engine continuations, 2 Dask workers", wall,
                       night_seconds(dataclasses.replace(plan, workers=2), sharded_rates), r)
        out["runs"].append({**row, **parts})
    out["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    dest = Path(args.out) if args.out else RESULTS / f"{out['date']}-scale-night-cpu"
    dest.with_suffix(".json").write_text(json.dumps(out, indent=1) + "\n")
    dest.with_suffix(".md").write_text(_md(out))
    print(_md(out))


def _md(out: dict) -> str:
    lines = [f"# One pair's replay night: core vs engine continuations, 1 vs 2 workers ({out['date']})", "",
             f"SmolLM2-135M-Instruct target (core: dequantized fp32; engine: {out['engine']}), its Q8_0 copy as the "
             f"draft model; {out['prompts']} Spec-Bench prompts, {out['new_tokens']} new tokens, greedy, k = {out['k']}, "
             f"every k to {out['kmax']} replayed; empty continuation cache. CPU: {out['cpu']} ({out['nproc']} cores, "
             f"shared), load average {out['loadavg_start']} at start, {out['loadavg_end']} at the end. Predictions: "
             f"`night_seconds` with the rates of a {out['pilot_prompts']}-prompt pilot night per mode.", "",
             "| night | wall s | predicted s | measured / predicted | acceptance [95% CI] |", "|---|---|---|---|---|"]
    for r in out["runs"]:
        lo, hi = r["acceptance_rate_ci"]
        lines.append(f"| {r['mode']} | {r['wall_s']} | {r['predicted_s']} | {r['measured_over_predicted']} | "
                     f"{r['acceptance_rate']:.3f} [{lo:.3f}, {hi:.3f}] |")
    lines += ["", "Command: `.venv/bin/python benchmarks/scale_night.py --prompts "
              f"{out['prompts']} --new-tokens {out['new_tokens']} --pilot {out['pilot_prompts']}`", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
