"""The engine check: the held-out prompts through the running serving engine, the core as the exact
reference (definitions: :mod:`specdec.validation.engine_report`, docs/metrics.md "Engine check").

1. Each prompt's token ids (the target's chat template, applied by the core) go to the engine one
   request at a time, or ``concurrency`` at a time, with the pair's sampling settings; the engine's
   own counters come back per request (llama.cpp ``timings.draft_n`` / ``draft_n_accepted``).
   ``/metrics`` is read before and after the run: its delta gives the engine's per-position counters
   and must equal the per-request sums when nothing else used the server (checked, said in the notes).
2. The core replays its draft exactly along the engine's own output tokens (greedy, or the argmax
   rule at T > 0; the engine's first token comes from the prefill alone, as in llama.cpp).
3. Greedy: the engine's output against the core's target-only continuation (continuation cache).
4. With ``baseline_url`` (the same target served without speculation), the engine's paired speedup.

Usage: :func:`check_engine` with an :class:`EngineCheckRequest`; ``specdec validate --engine-url``.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from specdec.core.drafters import fit_vocab
from specdec.core.inputs import stop_token_ids
from specdec.engines.client import EngineClient, EngineCompletion, safe_url
from specdec.engines.metrics import ACCEPTED, DRAFT_TOKENS, DRAFTS, PER_POSITION, engine_metrics
from specdec.models.hashes import file_sha256
from specdec.validation.config import ValidationConfig
from specdec.validation.engine_continuations import engine_tokens
from specdec.validation.engine_report import (NEAR_TIE_LOGITS, EngineCheckReport, EnginePromptResult, summarize,
                                              verdict_of)
from specdec.validation.heldout import HeldoutSet, prompt_token_ids
from specdec.validation.prompt_run import context_limit, skip_reason
from specdec.validation.provenance import eos_token_ids
from specdec.validation.replay import draft_trace, replay_counters
from specdec.validation.speed import bootstrap_speedup_ci, paired_speedup
from specdec.validation.teacher_forcing import teacher_forced_logits

__all__ = ["EngineEndpoint", "EngineCheckRequest", "check_engine", "engine_fingerprint", "metrics_counters"]


@dataclass(frozen=True)
class EngineEndpoint:
    """A running engine that serves the pair.

    Attributes:
        url: base URL (``http://host:port``); credentials in it are never shown.
        engine: the engine profile (``llamacpp``).
        api_key: ``Authorization: Bearer`` token, if the server needs one.
        baseline_url: the same target served without speculation (for the speedup), optional.
        flags: the command line the engine runs with, when the deployment declares it (recorded in
            the fingerprint; a change between nights is named as the likely cause).
    """

    url: str
    engine: str = "llamacpp"
    api_key: str | None = None
    baseline_url: str | None = None
    flags: tuple[str, ...] | None = None


@dataclass
class EngineCheckRequest:
    """One engine check.

    Attributes:
        target: the pair's target as the core loads it (a LoadedModel: ``.model``, ``.tokenizer``).
        draft: the pair's draft causal LM as the core loads it (the draft GGUF dequantized).
        heldout: the prompts (``config.limit`` takes a stratified subset, as in validation).
        config: k, max_new_tokens, sampling, seed (:class:`ValidationConfig`).
        endpoint: :class:`EngineEndpoint`.
        concurrency: requests in flight at once (1: one at a time).
        target_ref / drafter_ref: names recorded in the report.
        progress: ``progress(done, total)`` after each prompt.
    """

    target: Any
    draft: torch.nn.Module
    heldout: HeldoutSet
    config: ValidationConfig
    endpoint: EngineEndpoint
    concurrency: int = 1
    target_ref: str = ""
    drafter_ref: str | None = None
    progress: Callable[[int, int], None] | None = None
    cache: Any = None


@dataclass
class _Prompt:
    row: EnginePromptResult
    ids: list[int] = field(default_factory=list)
    engine: EngineCompletion | None = None
    baseline: EngineCompletion | None = None


def _draft_path(flags: tuple[str, ...] | None) -> str | None:
    if not flags:
        return None
    for name in ("--spec-draft-model", "-md", "--model-draft"):
        if name in flags and flags.index(name) + 1 < len(flags):
            return flags[flags.index(name) + 1]
    return None


def engine_fingerprint(client: EngineClient, endpoint: EngineEndpoint, *, hash_files: bool = True) -> dict[str, Any]:
    """What identifies the serving stack: the engine's build, target file and type, context and slots
    (llama.cpp ``/props``), the declared flags, and (``hash_files``) the sha256 of the target file and, when
    the flags are declared (``specdec pair engine --flags``), of the draft file, where they are readable here.
    llama-server does not expose its draft file or speculative flags over HTTP. Keys with unknown
    values are left out."""
    props = client.props()  # its `speculative.types` is the per-request default ("none"), not the server's: not kept
    out: dict[str, Any] = {"engine": endpoint.engine, "build_info": props.get("build_info"),
                           "model_path": props.get("model_path"), "model_ftype": props.get("model_ftype"),
                           "n_ctx": (props.get("default_generation_settings") or {}).get("n_ctx"),
                           "total_slots": props.get("total_slots")}
    if endpoint.flags:
        out["flags"] = list(endpoint.flags)
    files = (("model_sha256", props.get("model_path")), ("draft_sha256", _draft_path(endpoint.flags)))
    for key, path in files if hash_files else ():
        digest = file_sha256(path) if path and Path(path).is_file() else None
        if digest:
            out[key] = digest
    return {k: v for k, v in out.items() if v is not None}


def metrics_counters(text: str, engine: str) -> dict[str, Any]:
    """The engine's speculative counters in one ``/metrics`` body: ``{"drafts", "draft_tokens",
    "accepted", "per_position": [..]}`` (summed over label sets; missing counters are 0)."""
    from prometheus_client.parser import text_string_to_metric_families

    em = engine_metrics(engine)
    out: dict[str, Any] = {DRAFTS: 0.0, DRAFT_TOKENS: 0.0, ACCEPTED: 0.0, PER_POSITION: {}}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            kind = em.role_of(s.name)
            if kind is None or kind[0] != "counter":
                continue
            if kind[1] == PER_POSITION:
                pos = int(s.labels.get(em.position_label, -1))
                out[PER_POSITION][pos] = out[PER_POSITION].get(pos, 0.0) + float(s.value)
            else:
                out[kind[1]] += float(s.value)
    pp = out[PER_POSITION]
    out[PER_POSITION] = [pp.get(i, 0.0) for i in range(max(pp) + 1)] if pp else []
    return out


def _send(client: EngineClient, prompts: list[_Prompt], config: ValidationConfig, concurrency: int,
          attr: str, progress: Callable[[int, int], None] | None) -> None:
    """Every ``ok`` prompt through ``client``; the completion goes to ``prompt.<attr>``."""
    todo = [p for p in prompts if p.row.status == "ok"]

    def one(p: _Prompt) -> None:
        setattr(p, attr, client.complete(p.ids, max_tokens=config.max_new_tokens, sampling=config.sampling,
                                         seed=config.seed))

    if concurrency <= 1:
        for i, p in enumerate(todo, 1):
            one(p)
            if progress is not None:
                progress(i, len(todo))
        return
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for i, _ in enumerate(pool.map(one, todo), 1):
            if progress is not None:
                progress(i, len(todo))


def _core_counters(req: EngineCheckRequest, p: _Prompt, y: list[int], stop: frozenset[int], vocab: int) -> None:
    """The core's exact counters along the engine's tokens ``y`` into ``p.row``."""
    k = req.config.num_speculative_tokens
    complete = len(y) == req.config.max_new_tokens or (y and y[-1] in stop)
    if not y or not complete:
        p.row.status, p.row.skip_reason = "skipped", "the engine's output ended early without a stop token"
        return
    # llama.cpp drafts n_max tokens whatever the draft proposes after a rejection: the fast trace counts the same
    trace = draft_trace(req.draft, p.ids, y, vocab, kmax=k, stop_token_ids=stop, exact=False, adopts_prefix=True)
    st = replay_counters(trace, y, num_speculative_tokens=k, max_new_tokens=req.config.max_new_tokens,
                         stop_token_ids=stop, drafts_past_stop=True)
    p.row.core_drafts, p.row.core_draft_tokens = st.num_drafts, st.num_draft_tokens
    p.row.core_accepted_tokens = st.num_accepted_tokens
    p.row.core_accepted_per_position = list(st.accepted_per_position)


def _audit(model: torch.nn.Module, p: _Prompt, y_engine: list[int], y_core: list[int], vocab: int) -> None:
    """First divergence of the engine's greedy output from the core's, and the target's margin there."""
    row = p.row
    n = min(len(y_engine), len(y_core))
    d = next((i for i in range(n) if y_engine[i] != y_core[i]), None)
    if d is None and len(y_engine) == len(y_core):
        row.exact_match = True
        return
    row.exact_match = False
    if d is None:  # one is a prefix of the other: the shorter one stopped
        row.first_divergence, row.divergence = n, "divergence"
        return
    z = fit_vocab(teacher_forced_logits(model, p.ids + y_core[:d], 1), vocab)[-1].float()  # predicts y[d]
    row.first_divergence = d
    row.divergence_margin = float(z[y_core[d]] - z[y_engine[d]])
    row.divergence = "near-tie" if row.divergence_margin <= NEAR_TIE_LOGITS else "divergence"


def _core_continuations(req: EngineCheckRequest, subset: HeldoutSet, model, tok, eos) -> dict[str, list[int]]:
    """The core's target-only greedy continuation of each prompt (cached; :func:`replay_prompts`)."""
    from specdec.validation.continuation_cache import ContinuationCache, model_weights_hash
    from specdec.validation.replay_run import replay_prompts

    cache = req.cache or ContinuationCache()
    replayed = replay_prompts(subset, model, tok, [req.draft], req.config, eos=eos,
                              ctx_limit=context_limit(model, req.draft), cache=cache, target_weights=model_weights_hash(model), kmax=1, replay=False)
    return {rp.prompt.id: rp.continuation for rp in replayed if rp.status == "ok"}


def check_engine(req: EngineCheckRequest) -> EngineCheckReport:
    """Run the engine check (module docstring).

    Returns:
        :class:`EngineCheckReport`.
    Raises:
        specdec.engines.client.EngineRequestError: the engine is unreachable or answers without tokens.
        ValueError: ``concurrency`` < 1.
    """
    if req.concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {req.concurrency}")
    t0 = time.perf_counter()
    model, tok = req.target.model, req.target.tokenizer
    model.eval()
    req.draft.eval()
    config, ep = req.config, req.endpoint
    subset = req.heldout.subset(config.limit, seed=config.seed)
    eos = eos_token_ids(tok, model)
    stop = stop_token_ids(eos)
    vocab = model.get_output_embeddings().weight.shape[0]
    prompts = _prompts(subset, tok, config, context_limit(model, req.draft))
    client = EngineClient(ep.url, api_key=ep.api_key)
    try:
        fingerprint = engine_fingerprint(client, ep)
        before = metrics_counters(client.metrics_text(), ep.engine)
        _send(client, prompts, config, req.concurrency, "engine", req.progress)
        after = metrics_counters(client.metrics_text(), ep.engine)
    finally:
        client.close()
    if ep.baseline_url:
        base = EngineClient(ep.baseline_url, api_key=ep.api_key)
        try:
            _send(base, prompts, config, req.concurrency, "baseline", None)
        finally:
            base.close()
    greedy = config.sampling.is_greedy
    core = _core_continuations(req, subset, model, tok, eos) if greedy else {}
    with torch.inference_mode():
        for p in prompts:
            _fill(req, p, stop, vocab, core.get(p.row.prompt_id), model)
    return _report(req, subset, prompts, fingerprint, (before, after), time.perf_counter() - t0)


def _prompts(subset: HeldoutSet, tok, config: ValidationConfig, ctx_limit: int | None) -> list[_Prompt]:
    out = []
    for prompt in subset.prompts:
        ids = [] if prompt.is_empty else prompt_token_ids(prompt, tok)
        row = EnginePromptResult(prompt_id=prompt.id, category=prompt.category, prompt_tokens=len(ids))
        reason = skip_reason(prompt, ids, config, ctx_limit)
        if reason is not None:
            row.status, row.skip_reason = "skipped", reason
        out.append(_Prompt(row, ids))
    return out


def _fill(req: EngineCheckRequest, p: _Prompt, stop: frozenset[int], vocab: int, y_core: list[int] | None,
          model: torch.nn.Module) -> None:
    """One prompt's row: the engine's counters and rates, the core's replay, the audit."""
    row, c = p.row, p.engine
    if row.status != "ok" or c is None:
        return
    y = engine_tokens(c.token_ids, stop, req.config.max_new_tokens)
    row.new_tokens = len(y)
    row.engine_draft_tokens, row.engine_accepted_tokens = c.num_draft_tokens, c.num_accepted_tokens
    row.engine_tokens_per_second, row.engine_seconds = c.tokens_per_second, c.predicted_ms / 1e3
    if p.baseline is not None:
        row.baseline_tokens_per_second, row.baseline_seconds = p.baseline.tokens_per_second, p.baseline.predicted_ms / 1e3
    _core_counters(req, p, y, stop, vocab)
    if y_core is not None and row.status == "ok":
        _audit(model, p, y, y_core, vocab)


def _speed(rows: list[EnginePromptResult]) -> dict[str, Any]:
    ok = [r for r in rows if r.status == "ok" and r.engine_seconds > 0]
    out: dict[str, Any] = {"speculative_tokens_per_second": math.nan, "baseline_tokens_per_second": math.nan,
                           "speedup": math.nan, "speedup_ci": [math.nan, math.nan]}
    if not ok:
        return out
    out["speculative_tokens_per_second"] = sum(r.new_tokens for r in ok) / sum(r.engine_seconds for r in ok)
    paired = [r for r in ok if r.baseline_seconds > 0]
    if paired:
        toks = [r.new_tokens for r in paired]
        base_s, spec_s = [r.baseline_seconds for r in paired], [r.engine_seconds for r in paired]
        out["baseline_tokens_per_second"] = sum(toks) / sum(base_s)
        out["speedup"] = paired_speedup(toks, base_s, toks, spec_s)
        out["speedup_ci"] = bootstrap_speedup_ci(toks, base_s, toks, spec_s)
    return out


def _report(req: EngineCheckRequest, subset: HeldoutSet, prompts: list[_Prompt], fingerprint: dict[str, Any],
            scrapes: tuple[dict, dict], wall: float) -> EngineCheckReport:
    rows = [p.row for p in prompts]
    ok = [r for r in rows if r.status == "ok"]
    cats = sorted({r.category for r in ok})
    before, after = scrapes
    delta = {key: after[key] - before[key] for key in (DRAFTS, DRAFT_TOKENS, ACCEPTED)}
    per_pos = [int(a - (before[PER_POSITION][i] if i < len(before[PER_POSITION]) else 0))
               for i, a in enumerate(after[PER_POSITION])]
    k = req.config.num_speculative_tokens
    core_pp = [sum(r.core_accepted_per_position[i] for r in ok if i < len(r.core_accepted_per_position))
               for i in range(k)]
    overall = summarize(rows, seed=req.config.seed)
    notes = []
    sums = (sum(r.engine_draft_tokens for r in ok), sum(r.engine_accepted_tokens for r in ok))
    if (int(delta[DRAFT_TOKENS]), int(delta[ACCEPTED])) != sums:
        notes.append(f"/metrics moved by {int(delta[DRAFT_TOKENS])} drafted / {int(delta[ACCEPTED])} accepted during the "
                     f"run, the requests' own timings sum to {sums[0]} / {sums[1]}: other traffic shared the server, "
                     "so the per-position counters are not this run's alone")
        per_pos = []
    drafts = int(delta[DRAFTS]) if per_pos else None
    audit = {"checked": sum(r.exact_match is not None for r in ok), "identical": sum(bool(r.exact_match) for r in ok),
             "near_tie": sum(r.divergence == "near-tie" for r in ok),
             "divergent": sum(r.divergence == "divergence" for r in ok)}
    return EngineCheckReport(
        engine=req.endpoint.engine, url=safe_url(req.endpoint.url), heldout_name=subset.name,
        heldout_version=subset.version, target_ref=req.target_ref, drafter_ref=req.drafter_ref,
        config=req.config.to_dict(), concurrency=req.concurrency, fingerprint=fingerprint,
        counters_source="per-request timings", overall=overall,
        categories={c: summarize([r for r in ok if r.category == c], seed=req.config.seed) for c in cats},
        engine_per_position=per_pos, core_per_position=core_pp, engine_num_drafts=drafts, audit=audit, speed=_speed(rows),
        verdict=verdict_of(overall), prompts=rows, notes=notes, wall_seconds=wall)
