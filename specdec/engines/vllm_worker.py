"""The offline vLLM worker: run by the vLLM venv's python (``<venv>/bin/python vllm_worker.py``), never imported
by the product (it imports only the standard library and ``vllm``, which lives in that venv).

Protocol, one JSON object per line (vLLM's own logs go to stderr; the replies use the original stdout):

1. stdin, first line: the engine arguments ``{"model", "tokenizer", "speculative_config", "dtype", "seed",
   "max_model_len", "enforce_eager", "compilation_config", "max_num_seqs", "kv_cache_memory_bytes"}`` (``speculative_config`` null:
   no speculation). The worker builds ``vllm.LLM(..., disable_log_stats=False)`` and answers
   ``{"ready": true, "start_seconds", "fingerprint": {"vllm_version", "model_runner", "speculative_config",
   "compilation_config", "dtype", "max_model_len"}}`` (or ``{"error": "<one line>"}`` and exits 1).
2. ``{"op": "generate", "prompts": [[ids], ...], "sampling": {"temperature", "top_k", "top_p", "seed"},
   "max_tokens": n}``: each prompt alone (so each request's counters are its own), greedy or seeded
   sampling exactly as given. Answer ``{"outputs": [{"token_ids", "finish_reason", "seconds", "counters":
   {"drafts", "draft_tokens", "accepted", "per_position": [..]}, "per_request"}]}``: ``counters`` are the
   integer deltas of ``LLM.get_metrics()`` (``vllm:spec_decode_*``) around that prompt; ``per_request`` is
   vLLM's own per-request record (``per_request_spec_decode_metrics="detailed"``: ``per_step_accepted``,
   ``per_step_drafted``, ``acceptance_histogram``), None where the build has none.
3. ``{"op": "quit"}`` or end of input: the worker exits 0.
"""

from __future__ import annotations

import json
import os
import sys
import time

_NAMES = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
          "vllm:spec_decode_num_accepted_tokens": "accepted"}
_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def counters(llm) -> dict:
    """The spec-decode counters of ``llm.get_metrics()`` (summed over engines), integers."""
    out: dict = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_position": []}
    for m in llm.get_metrics():
        name = m.name.removesuffix("_total")
        if name in _NAMES:
            out[_NAMES[name]] += int(m.value)
        elif name == _PER_POS:
            vals = [int(v) for v in m.values]
            pp = out["per_position"] + [0] * (len(vals) - len(out["per_position"]))
            out["per_position"] = [a + b for a, b in zip(pp, vals + [0] * (len(pp) - len(vals)))]
    return out


def delta(after: dict, before: dict) -> dict:
    pp = [a - (before["per_position"][i] if i < len(before["per_position"]) else 0)
          for i, a in enumerate(after["per_position"])]
    return {**{k: after[k] - before[k] for k in ("drafts", "draft_tokens", "accepted")}, "per_position": pp}


def _plain(obj) -> object:
    """A JSON-able view of a vLLM config object (its fields; ``str`` for the rest)."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (list, tuple)):
        return [_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    return str(obj)


def fingerprint(llm, args: dict) -> dict:
    """What identifies this serving stack: vLLM version, model runner, speculative and compilation config, dtype."""
    import vllm

    cfg = llm.llm_engine.vllm_config
    spec = cfg.speculative_config
    spec_out = None
    if spec is not None:
        keys = ("method", "model", "num_speculative_tokens", "draft_sample_method", "rejection_sample_method",
                "prompt_lookup_max", "prompt_lookup_min", "quantization")
        spec_out = {k: _plain(getattr(spec, k, None)) for k in keys}
        dm = getattr(spec, "draft_model_config", None)
        if dm is not None:
            spec_out["draft_dtype"] = str(dm.dtype).removeprefix("torch.")
    comp = cfg.compilation_config
    return {"vllm_version": vllm.__version__, "model_runner": "v2" if getattr(cfg, "use_v2_model_runner", False) else "v1",
            "speculative_config": spec_out,
            "compilation_config": {"mode": _plain(getattr(comp, "mode", None)), "backend": _plain(comp.backend),
                                   "enforce_eager": bool(cfg.model_config.enforce_eager)},
            "dtype": str(cfg.model_config.dtype).removeprefix("torch."),
            "max_model_len": int(cfg.model_config.max_model_len), "requested": args}


def build(args: dict):
    from vllm import LLM

    kw = {k: args[k] for k in ("tokenizer", "dtype", "seed", "max_model_len", "enforce_eager", "max_num_seqs",
                               "compilation_config", "kv_cache_memory_bytes") if args.get(k) is not None}
    if args.get("speculative_config") is not None:
        kw["per_request_spec_decode_metrics"] = "detailed"  # vLLM >= 0.2x: each output's own per-step counts
    return LLM(model=args["model"], speculative_config=args.get("speculative_config"), disable_log_stats=False,
               **kw)


def generate(llm, msg: dict) -> dict:
    from vllm import SamplingParams

    s = msg["sampling"]
    params = SamplingParams(temperature=float(s["temperature"]), top_k=int(s.get("top_k") or 0) or -1,
                            top_p=float(s.get("top_p") or 1.0), seed=s.get("seed"), max_tokens=int(msg["max_tokens"]),
                            min_p=0.0, repetition_penalty=1.0, detokenize=False)
    outs = []
    for ids in msg["prompts"]:
        before, t0 = counters(llm), time.perf_counter()
        (res,) = llm.generate([{"prompt_token_ids": list(ids)}], params, use_tqdm=False)
        wall = time.perf_counter() - t0
        c = res.outputs[0]
        per_request = getattr(c, "spec_decode_metrics", None)
        outs.append({"token_ids": list(c.token_ids), "finish_reason": c.finish_reason, "seconds": wall,
                     "counters": delta(counters(llm), before),
                     "per_request": per_request.to_dict() if per_request is not None else None})
    return {"outputs": outs}


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))  # specdec/engines holds vllm.py (the profile): not vLLM
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # vLLM and its libraries print to stdout: keep the protocol channel clean

    def send(obj: dict) -> None:
        reply.write(json.dumps(obj) + "\n")

    args = json.loads(sys.stdin.readline())
    t0 = time.perf_counter()
    try:
        llm = build(args)
    except Exception as e:  # noqa: BLE001 - one line to the product, the traceback is in the log (stderr)
        import traceback

        traceback.print_exc()
        send({"error": f"vLLM did not start: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"})
        return 1
    send({"ready": True, "start_seconds": round(time.perf_counter() - t0, 1), "fingerprint": fingerprint(llm, args)})
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("op") == "quit":
            break
        try:
            send(generate(llm, msg))
        except Exception as e:  # noqa: BLE001
            import traceback

            traceback.print_exc()
            send({"error": f"{type(e).__name__}: {str(e)[:300]}"})
    return 0


if __name__ == "__main__":  # vLLM spawns its engine process: this guard is required
    raise SystemExit(main())
