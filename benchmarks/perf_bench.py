"""The phases of ``benchmarks/perf.py``: load, warm up, interleaved main runs, k sweep, ĉ, P5, profile.

Raw measurements go into ``self.raw`` (plain JSON data); :mod:`perf_report` turns them into the
summary, the top-level P1/P2/P3/P5 and the markdown tables.
"""

from __future__ import annotations

import datetime as dt
import math
import time
from pathlib import Path
from typing import Any

import torch

import perf_document as out_doc
import perf_methods as pm
import perf_report as rep
from specdec import NgramDrafter


def _load() -> float:
    import os

    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else math.nan


def _first_divergence(a: list[int], b: list[int]) -> int | None:
    if a == b:
        return None
    return next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))


class Bench:
    def __init__(self, args) -> None:
        self.args = args
        self.t_start = time.perf_counter()
        self.started_at = dt.datetime.now(dt.timezone.utc)
        kind = "gpu" if args.device == "cuda" else "cpu"
        self.out_json = Path(args.out_dir) / f"{self.started_at.strftime('%Y-%m-%d')}-{kind}{args.tag}.json"
        self.raw: dict[str, Any] = {
            "main": [],
            "tf": [],
            "skipped": [],
            "k_sweep": [],
            "calibration": {},
            "hf_audit": {},
            "p5": {},
            "profile": None,
            "stats": {},
            "steps": {},
            "agree": {},
            "errors": [],
            "phase_seconds": {},
        }
        self.machine = rep.machine(args.device)

    # ------------------------------------------------------------------ helpers
    def log(self, msg: str) -> None:
        print(f"[{time.perf_counter() - self.t_start:7.1f}s] {msg}", flush=True)

    def phase(self, name: str) -> None:
        """Record the 1/5/15-min load average as a phase starts (other jobs on the machine skew timings)."""
        import os

        if hasattr(os, "getloadavg"):
            self.raw.setdefault("loadavg_by_phase", {})[name] = [round(x, 2) for x in os.getloadavg()]

    def write(self, complete: bool, note: str | None = None) -> None:
        self._passes_report()
        summary = rep.summarise(self.raw, self.args, self.drafter_kinds if hasattr(self, "drafter_kinds") else {})
        doc = out_doc.document(self.args, self.machine, self.raw, summary, self.started_at, complete,
                           time.perf_counter() - self.t_start, note)
        out_doc.write_outputs(self.out_json, doc)

    # ------------------------------------------------------------------ setup
    def load(self) -> None:
        from specdec.kinds import resolve_drafter
        from specdec.settings import model_store
        from specdec.validation.heldout import load_heldout, prompt_token_ids
        from specdec.models import load_causal_lm
        from specdec.validation.provenance import eos_token_ids

        a = self.args
        t0 = time.perf_counter()
        self.log(f"loading target {a.target} ({a.device}, {a.dtype}) ...")
        self.tgt = load_causal_lm(a.target, dtype=a.dtype, device=a.device, store=model_store())
        self.model, self.tok = self.tgt.model.eval(), self.tgt.tokenizer
        self.device = pm.device_of(self.model)
        self.drafters: dict[str, Any] = {}
        self.drafter_kinds: dict[str, str] = {}
        for spec in a.drafter_specs:
            self.log(f"preparing drafter {spec} ...")
            r = resolve_drafter(spec, self.tgt, store=model_store())
            obj = r.drafter
            if not isinstance(obj, NgramDrafter):
                obj = obj.eval()
            self.drafters[spec] = obj
            self.drafter_kinds[spec] = r.kind
        self._select_passes()
        self.eos = None if a.ignore_eos else eos_token_ids(self.tok, self.model)
        self.pad_id = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.tok.eos_token_id
        hs = load_heldout(a.heldout)
        self.subset = hs.subset(a.limit, seed=a.seed)
        ctx = getattr(self.model.config, "max_position_embeddings", None)
        self.prompts = []
        for p in self.subset.prompts:
            ids = [] if p.is_empty else prompt_token_ids(p, self.tok)
            reason = None
            if not ids:
                reason = "empty prompt"
            elif ctx is not None and len(ids) + a.max_new_tokens > ctx:
                reason = f"prompt {len(ids)} tokens + {a.max_new_tokens} > context {ctx}"
            if reason:
                self.raw["skipped"].append({"prompt_id": p.id, "category": p.category, "reason": reason})
                continue
            self.prompts.append({"id": p.id, "category": p.category, "ids": ids})
        sweep_ids = {p.id for p in hs.subset(min(a.k_sweep_limit, a.limit), seed=a.seed).prompts}
        self.sweep_prompts = [p for p in self.prompts if p["id"] in sweep_ids]
        self.raw["heldout"] = {"name": self.subset.name, "subset_version": self.subset.version,
                               "source_version": self.subset.source_version, "prompt_ids": [p["id"] for p in self.prompts]}
        self.raw["target_source"] = {k: v for k, v in (self.tgt.source or {}).items() if isinstance(v, (str, int, float, type(None)))}
        self.raw["drafters"] = {s: {"kind": self.drafter_kinds[s], **self._drafter_desc(s)} for s in self.drafters}
        self.raw["phase_seconds"]["load"] = time.perf_counter() - t0
        self.log(f"{len(self.prompts)} prompts ({len(self.raw['skipped'])} skipped), sweep on {len(self.sweep_prompts)}")

    def _select_passes(self) -> None:
        """``--passes``: the target's and every draft model's B = 1 passes (eager, static or CUDA graphs)."""
        from specdec.core.static import use_passes

        models = [self.model] + [d for d in self.drafters.values() if isinstance(d, torch.nn.Module)]
        for m in models:
            use_passes(m, self.args.passes)
        self.raw["passes"] = self.args.passes

    def _passes_report(self) -> None:
        """Per model with static passes: graph replays, uncaptured passes, captured shapes, capture failures."""
        from specdec.core.static import passes_of

        named = {"target": getattr(self, "model", None), **getattr(self, "drafters", {})}
        out = {}
        for name, m in named.items():
            p = passes_of(m) if isinstance(m, torch.nn.Module) else None
            if p is not None:
                out[name] = {"mode": p.mode, "max_len": p.max_len, "replays": p.replays, "uncaptured": p.uncaptured,
                             "graphs": [list(k) for k in p.graphs], "failures": {str(k): v for k, v in p.failures.items()}}
        self.raw["static_passes"] = out or None

    def _warm(self, name: str, run) -> None:
        """Run ``run`` until two runs in a row take within 10% of each other (at most ``--warmup-rounds``); the
        timings go to ``raw["warmup"][name]`` (the first GPU runs pay allocation, kernel selection, graph capture)."""
        times: list[float] = []
        for _ in range(max(1, self.args.warmup_rounds)):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
            if len(times) >= 2 and abs(times[-1] - times[-2]) <= 0.1 * max(times[-2], 1e-9):
                break
        self.raw.setdefault("warmup", {})[name] = [round(t, 4) for t in times]

    def _drafter_desc(self, spec: str) -> dict:
        d = self.drafters[spec]
        if isinstance(d, NgramDrafter):
            return {"max_ngram": d.max_ngram, "min_ngram": d.min_ngram,
                    "hf_equivalent": f"prompt_lookup_num_tokens=k, max_matching_ngram_size={d.max_ngram}"}
        return {"hf_equivalent": "assistant_model=<this draft>, num_assistant_tokens=k, schedule constant, "
                                 "assistant_confidence_threshold=0.0"}

    def ids_tensor(self, ids: list[int]) -> torch.Tensor:
        return torch.tensor([ids], dtype=torch.long, device=self.device)

    # ------------------------------------------------------------------ phases
    def warmup(self) -> None:
        a = self.args
        short = min(self.prompts, key=lambda p: len(p["ids"]))
        x = self.ids_tensor(short["ids"])
        n = a.max_new_tokens  # every verification width (and, with --passes graphs, every graph) is exercised
        self._warm("target_only", lambda: pm.run_target_only(self.model, x, n, self.eos))
        self.ours = {s: pm.Ours(d) for s, d in self.drafters.items()}
        for s, d in self.drafters.items():
            self._warm(f"ours {s}", lambda s=s: self.ours[s].run(self.model, x, a.k, n, self.eos))
            for k in sorted(set(a.k_values) - {a.k}):  # the k sweep's verification widths (graph captures) too
                self.ours[s].run(self.model, x, k, n, self.eos)
            if not a.no_hf:
                try:
                    self._warm(f"hf {s}", lambda d=d: pm.run_hf(self.model, d, x, a.k, n, self.eos, self.pad_id))
                except Exception as e:  # noqa: BLE001 - reported; HF is then left out for this drafter
                    self.raw["errors"].append(f"HF assisted generation with {s}: {type(e).__name__}: {e}")
                    self.raw["hf_audit"][s] = {"error": f"{type(e).__name__}: {e}"}
                    continue
                try:
                    self.raw["hf_audit"][s] = pm.hf_audit(self.model, d, x, a.k, a.max_new_tokens, self.eos, self.pad_id)
                except Exception as e:  # noqa: BLE001 - the audit is diagnostics only
                    self.raw["hf_audit"][s] = {"audit_error": f"{type(e).__name__}: {e}"}

    def _hf_ok(self, spec: str) -> bool:
        return not self.args.no_hf and "error" not in self.raw["hf_audit"].get(spec, {})

    def main_phase(self) -> None:
        """Per prompt and repeat: target-only, then ours and HF for each drafter; order alternates."""
        a = self.args
        t0 = time.perf_counter()
        for pi, p in enumerate(self.prompts):
            x = self.ids_tensor(p["ids"])
            for r in range(a.repeats):
                seq: list[tuple[str, str | None]] = [("target_only", None)]
                for s in self.drafters:
                    seq.append(("ours", s))
                    if self._hf_ok(s):
                        seq.append(("hf", s))
                if (pi + r) % 2:
                    seq.reverse()
                outs: dict[tuple[str, str | None], pm.RunOut] = {}
                for method, s in seq:
                    if method == "target_only":
                        run = lambda: pm.run_target_only(self.model, x, a.max_new_tokens, self.eos)  # noqa: E731
                    elif method == "ours":
                        run = lambda s=s: self.ours[s].run(self.model, x, a.k, a.max_new_tokens, self.eos)  # noqa: E731
                    else:
                        run = lambda s=s: pm.run_hf(self.model, self.drafters[s], x, a.k, a.max_new_tokens,  # noqa: E731
                                                    self.eos, self.pad_id)
                    outs[(method, s)] = pm.with_prefill(self.model, run)
                ref = outs[("target_only", None)]
                pos = {key: i for i, key in enumerate(seq)}
                for (method, s), o in outs.items():
                    row = {"phase": "main", "prompt_id": p["id"], "category": p["category"], "prompt_tokens": len(p["ids"]),
                           "repeat": r, "order": pos[(method, s)],
                           "method": method, "drafter": s, "k": a.k if s else None, "seconds": o.seconds,
                           "new_tokens": len(o.tokens), "tok_s": o.tok_s, "finish": o.finish,
                           "prefill_seconds": o.prefill_seconds, "load_avg_1m": _load(),
                           "identical_to_target_only": o.tokens == ref.tokens,
                           "first_divergence_vs_target_only": _first_divergence(o.tokens, ref.tokens)}
                    if method == "hf":
                        ours = outs[("ours", s)]
                        row["identical_to_ours"] = o.tokens == ours.tokens
                        row["first_divergence_vs_ours"] = _first_divergence(o.tokens, ours.tokens)
                    if method == "ours":
                        st = o.stats
                        row.update(num_drafts=st.num_drafts, num_draft_tokens=st.num_draft_tokens,
                                   num_accepted_tokens=st.num_accepted_tokens, target_forward_passes=st.target_forward_passes,
                                   draft_forward_passes=st.draft_forward_passes, draft_seconds=st.draft_seconds,
                                   target_seconds=st.target_seconds, steps=o.steps)
                        if r == 0:
                            self._pool(s, a.k, st, o.steps)
                    self.raw["main"].append(row)
                if not a.no_tf and ref.tokens:
                    for s, d in self.drafters.items():
                        tf = pm.teacher_forced_seconds(self.model, d, p["ids"], ref.tokens)
                        self.raw["tf"].append({"prompt_id": p["id"], "repeat": r, "drafter": s,
                                               "target_tf_s": tf["target_s"], "draft_tf_s": tf["draft_s"]})
                        if r == 0:
                            ag = self.raw["agree"].setdefault(s, {"positions": 0, "alpha": 0.0, "top1": 0.0})
                            ag["positions"] += tf["agree"].positions
                            ag["alpha"] += tf["agree"].alpha
                            ag["top1"] += tf["agree"].top1
                            ag.setdefault("continuation_tokens", 0)
                            ag["continuation_tokens"] += len(ref.tokens)
                line = " ".join(f"{m}{'/' + s if s else ''}={o.tok_s:.1f}" for (m, s), o in outs.items())
                self.log(f"main {pi + 1}/{len(self.prompts)} r{r} {p['category']}#{p['id']} ({len(p['ids'])} tok): {line} tok/s")
        self.raw["phase_seconds"]["main"] = time.perf_counter() - t0

    def _pool(self, spec: str, k: int, st, steps, key: str | None = None) -> None:
        key = key or spec
        pooled = self.raw["stats"].get(key)
        cur = {"k": k, "num_drafts": st.num_drafts, "num_draft_tokens": st.num_draft_tokens,
               "num_accepted_tokens": st.num_accepted_tokens, "accepted_per_position": list(st.accepted_per_position),
               "drafted_per_position": list(st.drafted_per_position), "num_emitted_tokens": st.num_emitted_tokens,
               "target_forward_passes": st.target_forward_passes, "draft_forward_passes": st.draft_forward_passes,
               "draft_seconds": st.draft_seconds, "target_seconds": st.target_seconds}
        if pooled is None:
            self.raw["stats"][key] = cur
        else:
            for f, v in cur.items():
                if f == "k":
                    continue
                if isinstance(v, list):
                    n = max(len(v), len(pooled[f]))
                    pooled[f] = [(pooled[f][i] if i < len(pooled[f]) else 0) + (v[i] if i < len(v) else 0) for i in range(n)]
                else:
                    pooled[f] += v
        st_steps = self.raw["steps"].setdefault(key, {"proposed": 0, "accepted": 0, "rejections": 0, "steps": 0, "recorded": True})
        if steps is None:
            st_steps["recorded"] = False
        else:
            st_steps["steps"] += len(steps)
            st_steps["proposed"] += sum(n for n, _ in steps)
            st_steps["accepted"] += sum(m for _, m in steps)
            st_steps["rejections"] += sum(1 for n, m in steps if m < n)

    def cost_phase(self) -> None:
        """The speed model's costs, calibrated as validation calibrates them
        (:func:`specdec.validation.timing.calibrate`: isolated warm passes, interleaved rounds, medians; v(n)
        fitted monotone) at one short and one long context: the median prompt of each
        :func:`perf_speed.context_bucket` plus half the new tokens of target continuation. c of the n-gram
        drafter = one lookup (``propose``) / the target's one-token pass at that context."""
        from perf_speed import context_bucket
        from specdec.validation.timing import calibrate

        a = self.args
        t0 = time.perf_counter()
        kmax = max([8, a.k, *a.k_values])
        buckets: dict[str, list] = {}
        for p in sorted(self.prompts, key=lambda q: len(q["ids"])):
            buckets.setdefault(context_bucket(len(p["ids"])), []).append(p)
        specs = list(self.drafters)
        models = [None if isinstance(self.drafters[s], NgramDrafter) else self.drafters[s] for s in specs]
        for name, ps in buckets.items():
            p = ps[len(ps) // 2]
            cont = pm.run_target_only(self.model, self.ids_tensor(p["ids"]), max(1, a.max_new_tokens // 2), None).tokens
            prefix = list(p["ids"]) + cont
            cal = calibrate(self.model, models, prefix, kmax, reps=a.cost_reps)
            c = {}
            for s, m, cm in zip(specs, models, cal.cost_ratios):
                c[s] = cm if m is not None else \
                    pm.ngram_lookup_seconds(self.drafters[s], prefix, a.k, a.cost_reps)["median_s"] / cal.target_step_s
            self.raw["calibration"][name] = {
                "prompt_id": p["id"], "context_tokens": len(prefix), "prompts": [q["id"] for q in ps],
                "target_one_token_pass_s": cal.target_step_s, "verify_cost": cal.verify_cost.as_list(),
                "verify_cost_measured": {str(n): v for n, v in cal.raw_verify.items()}, "c": c,
                "load_avg_1m": _load()}
            self.log(f"calibration {name} ({len(prefix)} tokens): target 1-token pass {cal.target_step_s * 1e3:.2f} ms, "
                     f"v(1..{kmax}) {[round(x, 2) for x in cal.verify_cost.as_list()[1:]]}, "
                     + ", ".join(f"c[{s}]={v:.3f}" for s, v in c.items()))
        self.raw["phase_seconds"]["costs"] = time.perf_counter() - t0

    def sweep_phase(self) -> None:
        """Ours at each k on the sweep prompts, each (prompt, repeat) with its own target-only run."""
        a = self.args
        if not a.k_values or not self.sweep_prompts:
            return
        t0 = time.perf_counter()
        for pi, p in enumerate(self.sweep_prompts):
            x = self.ids_tensor(p["ids"])
            for r in range(a.k_sweep_repeats):
                seq: list[tuple[str | None, int | None]] = [(None, None)] + [(s, k) for s in self.drafters for k in a.k_values]
                if (pi + r) % 2:
                    seq.reverse()
                ref = None
                res = []
                for s, k in seq:
                    if s is None:
                        ref = pm.with_prefill(self.model, lambda: pm.run_target_only(self.model, x, a.max_new_tokens, self.eos))
                        res.append((s, k, ref))
                    else:
                        o = pm.with_prefill(self.model, lambda s=s, k=k: self.ours[s].run(self.model, x, k, a.max_new_tokens, self.eos))
                        res.append((s, k, o))
                        if r == 0:
                            self._pool(s, k, o.stats, o.steps, key=f"{s}@k={k}")
                for s, k, o in res:
                    self.raw["k_sweep"].append({"prompt_id": p["id"], "repeat": r, "drafter": s, "k": k,
                                                "prompt_tokens": len(p["ids"]), "prefill_seconds": o.prefill_seconds,
                                                "steps": o.steps, "method": "target_only" if s is None else "ours", "seconds": o.seconds,
                                                "new_tokens": len(o.tokens), "tok_s": o.tok_s,
                                                "identical_to_target_only": o.tokens == ref.tokens})
                self.log(f"k-sweep {pi + 1}/{len(self.sweep_prompts)} r{r}: " + " ".join(
                    f"{'target' if s is None else s + '@' + str(k)}={o.tok_s:.1f}" for s, k, o in res))
        self.raw["phase_seconds"]["k_sweep"] = time.perf_counter() - t0

    def p5_phase(self, summary: dict) -> None:
        """Batch-B vs batch-1 tokens/s of our speculative decoding on the same prompts (A B A B)."""
        a = self.args
        big = [b for b in a.batch_list if b > 1]
        if not big:
            self.raw["p5"] = {"error": "no batch size > 1 requested"}
            return
        t0 = time.perf_counter()
        if a.p5_drafters == "best":
            specs = [summary.get("representative_drafter") or next(iter(self.drafters))]
        elif a.p5_drafters == "all":
            specs = list(self.drafters)
        else:
            specs = [s for s in a.p5_drafters.split(",") if s in self.drafters]
        for s in specs:
            d = self.drafters[s]
            per_b = {}
            for B in big:
                ps = [self.prompts[i % len(self.prompts)] for i in range(B)]
                ids = [p["ids"] for p in ps]
                reps = []
                for r in range(a.repeats):
                    single_tok, single_s, singles = 0, 0.0, []
                    order = ["batch", "single"] if r % 2 == 0 else ["single", "batch"]
                    bo = None
                    for what in order:
                        if what == "batch":
                            bo = pm.run_batch(self.model, d, self.tok, ids, a.k, a.max_new_tokens, self.eos)
                            if bo.error:
                                break
                        else:
                            for p in ps:
                                o = self.ours[s].run(self.model, self.ids_tensor(p["ids"]), a.k, a.max_new_tokens, self.eos)
                                singles.append(o.tokens)
                                single_tok += len(o.tokens)
                                single_s += o.seconds
                    if bo is None or bo.error:
                        per_b[str(B)] = {"error": bo.error if bo else "batch run missing", "prompt_ids": [p["id"] for p in ps]}
                        self.log(f"P5 {s} B={B}: batched decoding unavailable: {per_b[str(B)]['error']}")
                        break
                    batch_tok = sum(len(t) for t in bo.rows)
                    ident = sum(1 for x, y in zip(bo.rows, singles) if x == y) if singles else None
                    reps.append({"repeat": r, "order": order, "batch_seconds": bo.seconds, "batch_tokens": batch_tok,
                                 "batch_tok_s": batch_tok / bo.seconds, "single_seconds": single_s, "single_tokens": single_tok,
                                 "single_tok_s": single_tok / single_s if single_s else math.nan,
                                 "rows_identical_to_batch1": ident, "rows": len(bo.rows)})
                    self.log(f"P5 {s} B={B} r{r}: batch {batch_tok / bo.seconds:.1f} tok/s vs batch-1 "
                             f"{single_tok / single_s:.1f} tok/s, {ident}/{len(bo.rows)} rows identical")
                if reps:
                    per_b[str(B)] = {"prompt_ids": [p["id"] for p in ps], "repeats": reps}
            self.raw["p5"][s] = per_b
        self.raw["phase_seconds"]["p5"] = time.perf_counter() - t0

    def profile_phase(self, summary: dict) -> None:
        from perf_profile import profile_ours, wall_split_hf

        a = self.args
        t0 = time.perf_counter()
        s = summary.get("representative_drafter") or next(iter(self.drafters))
        p = min(self.prompts, key=lambda q: len(q["ids"]))
        prof = {}
        for spec in dict.fromkeys([s, *self.drafters]):
            self.log(f"profiling ours with {spec} on prompt {p['id']} ({len(p['ids'])} tokens), {a.profile_tokens} new tokens ...")
            prof[spec] = profile_ours(self.model, self.drafters[spec], self.ids_tensor(p["ids"]), a.k, a.profile_tokens, self.eos)
            if self._hf_ok(spec):
                prof[spec]["hf_wall_split"] = wall_split_hf(self.model, self.drafters[spec], self.ids_tensor(p["ids"]), a.k,
                                                            a.profile_tokens, self.eos, self.pad_id)
        self.raw["profile"] = {"prompt_id": p["id"], "prompt_tokens": len(p["ids"]), "new_tokens_requested": a.profile_tokens,
                               "k": a.k, "by_drafter": prof}
        self.raw["phase_seconds"]["profile"] = time.perf_counter() - t0

    # ------------------------------------------------------------------ all
    def run(self) -> None:
        a = self.args
        self.phase("load")
        self.load()
        self.log("warm-up + HF audit ...")
        self.phase("warmup")
        self.warmup()
        self.write(complete=False)
        self.phase("main")
        self.main_phase()
        self.write(complete=False)
        self.phase("costs")
        self.cost_phase()
        self.write(complete=False)
        self.phase("k_sweep")
        self.sweep_phase()
        self.write(complete=False)
        summary = rep.summarise(self.raw, a, self.drafter_kinds)
        if a.batch_list:
            self.phase("p5")
            self.p5_phase(summary)
            self.write(complete=False)
        if a.profile:
            self.phase("profile")
            self.profile_phase(summary)
        self.phase("end")
        self.write(complete=True)
        md = self.out_json.with_suffix(".md")
        self.log(f"wrote {self.out_json} and {md}")
        doc = rep.summarise(self.raw, a, self.drafter_kinds)
        for key in ("p1", "p2", "p3", "p5"):
            self.log(f"{key} = {doc['top'][key]}" + (f" ({doc['top'].get(key + '_reason')})" if doc["top"][key] is None else ""))
