"""The engine check, the third measurement of :func:`specdec.validation.validate`: the held-out prompts through
the running serving engine, the core as the exact reference (definitions: :mod:`specdec.validation.engine_report`,
docs/engine-check.md).

The engine is an :class:`~specdec.engines.profile.EngineProfile` (:func:`specdec.engines.profiles.engine_profile`);
the check only talks to it:

1. ``profile.connect`` gives a session; ``profile.fingerprint`` says what the engine serves. A
   synthetic-acceptance mode is refused (:class:`~specdec.engines.errors.EngineRefusedError`). The
   fingerprint is compared with the registered pair (:class:`~specdec.engines.profile.PairIdentity`)
   *before* any number: another target, vocabulary or BOS/EOS is a ``fingerprint`` finding and no
   number is compared; another draft file is a finding and the numbers say what it costs. A declared
   rule that drafts less than the validated one (``profile.served_rule``) is a ``served rule`` finding.
2. Each prompt's token ids (the target's chat template, applied by the core) go to the engine one
   request at a time, or ``concurrency`` at a time, with the pair's sampling settings; each request and
   the whole check run within overall deadlines (:class:`~specdec.engines.profile.EngineLimits`). Every
   answer is checked (token ids in ``[0, vocab)``, possible counters) before it is used.
   The server-wide counters (``/metrics``) are read before and after: their delta gives the engine's
   drafts and per-position counters when nothing else used the server (checked, said in the notes).
3. The core replays the *validated* rule exactly along the engine's own output tokens (greedy, or the
   argmax rule at T > 0; the rule's bookkeeping: first token from the prefill, drafts past a stop).
4. Per step (:mod:`specdec.validation.engine_delivery`): drafts per request, tokens per draft, mean
   accepted length, per-position counts, engine vs core; drafting credibly less is a ``delivery`` finding.
5. Greedy: the engine's output against the core's target-only continuation (continuation cache).
6. With ``baseline_url`` (the same target served without speculation), the engine's paired speedup.

Usage: ``validate(ValidationRequest(..., engine_check=EngineCheck(endpoint), method="engine"))`` (the engine
check alone; with ``decode`` / ``replay`` / ``both`` it runs after them) returns the drafter's report with its
``engine_check`` section; :func:`measure_engine` is the measurement itself (on the :class:`ValidationRun`: its
target, drafter, held-out subset, config and continuation cache); ``specdec validate --engine-url``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, asdict
from pathlib import Path
from typing import Any, Callable

import torch

from specdec.core.drafters import fit_vocab
from specdec.core.inputs import stop_token_ids
from specdec.engines.answers import EngineCompletion, EngineCounters, check_completion
from specdec.engines.client import safe_url
from specdec.engines.errors import EngineRefusedError
from specdec.engines.http import Deadline
from specdec.engines.profile import (CompletionParams, EngineEndpoint, EngineLimits, EngineProfile, EngineSession,
                                     PairFiles, PairIdentity, ProposalRule)
from specdec.engines.profiles import engine_profile
from specdec.validation.config import ValidationConfig
from specdec.validation.engine_continuations import engine_tokens
from specdec.validation.engine_delivery import EngineFinding, audit_finding, delivery_finding, delivery_of
from specdec.validation.engine_report import (NEAR_TIE_LOGITS, EngineCheckReport, EnginePromptResult, summarize,
                                              verdict_of)
from specdec.validation.heldout import HeldoutSet, prompt_token_ids
from specdec.validation.prompt_run import DrafterUnderTest, context_limit, skip_reason
from specdec.validation.replay import draft_trace, replay_counters
from specdec.validation.request import ValidationRun
from specdec.validation.speed import bootstrap_speedup_ci, paired_speedup
from specdec.validation.served_target import is_served
from specdec.validation.teacher_forcing import teacher_forced_logits

__all__ = ["EngineEndpoint", "EngineLimits", "PairIdentity", "EngineCheck", "measure_engine", "pair_identity"]

CHECK_DEADLINE = "the engine check (SPECDEC_ENGINE_CHECK_TIMEOUT_S)"


@dataclass(frozen=True)
class EngineCheck:
    """The engine measurement of one validation (``ValidationRequest.engine_check``): what the run does not
    already hold. The target, the drafter (the request's one drafter: its model, or on an engine that
    :attr:`~specdec.engines.profile.EngineProfile.serves_lookup` its n-gram lookup), the held-out subset, the config
    (k, max_new_tokens, sampling, seed), the names recorded (``target_ref``, the drafter's ref: a file path is
    hashed for the identity), the continuation cache and progress (phase ``"engine"``) come from the request.

    Attributes:
        endpoint: :class:`~specdec.engines.profile.EngineEndpoint` (its ``engine`` names the profile).
        concurrency: requests in flight at once (1: one at a time).
        limits: the overall deadlines (:class:`~specdec.engines.profile.EngineLimits`).
        pair: what the registered pair says the engine must serve; None: :func:`pair_identity` of the run.
    """

    endpoint: EngineEndpoint
    concurrency: int = 1
    limits: EngineLimits = field(default_factory=EngineLimits)
    pair: PairIdentity | None = None


@dataclass
class _Prompt:
    row: EnginePromptResult
    ids: list[int] = field(default_factory=list)
    engine: EngineCompletion | None = None
    baseline: EngineCompletion | None = None


@dataclass
class _Run:
    """What every step of one check shares: the validation run, its engine check, the draft the core replays
    and the drafter's ref."""

    vr: ValidationRun
    check: EngineCheck
    draft: Any
    drafter_ref: str | None
    profile: EngineProfile
    rule: ProposalRule
    deadline: Deadline
    vocab: int
    stop: frozenset[int]
    fingerprint: dict[str, Any] = field(default_factory=dict)
    findings: list[EngineFinding] = field(default_factory=list)
    served: ProposalRule | None = None
    scrapes: tuple[EngineCounters | None, EngineCounters | None] = (None, None)
    source: str = "per-request timings"


def _file_identity(ref: str | None) -> tuple[str | None, str | None]:
    """``(file name, sha256)`` of a reference that is a readable file, else ``(None, None)``."""
    from specdec.models.hashes import file_sha256

    if not ref or not Path(ref).is_file():
        return None, None
    return Path(ref).name, file_sha256(ref)


def pair_identity(run: ValidationRun, drafter_ref: str | None, rule: ProposalRule | None = None) -> PairIdentity:
    """What the run's pair says the engine must serve: the target/draft files named by ``run.target_ref`` /
    ``drafter_ref`` (when they are files here; a GGUF target loaded by name: its ``source``), the target
    tokenizer's vocabulary and BOS/EOS strings."""
    (t_name, t_sha), (d_name, d_sha) = _file_identity(run.target_ref), _file_identity(drafter_ref)
    source = getattr(run.request.target, "source", None) or {}
    if t_sha is None and source.get("gguf_sha256"):  # a GGUF target loaded by name (e.g. "smollm2")
        t_name, t_sha = Path(str(source.get("gguf_file") or "")).name or None, str(source["gguf_sha256"])
    files = PairFiles(target_file=t_name, target_sha256=t_sha, draft_file=d_name, draft_sha256=d_sha)
    return PairIdentity.of_loaded(run.tokenizer, run.model, files, rule)


def _identify(run: _Run, session: EngineSession) -> bool:
    """Fingerprint, refusal, identity and declared rule (step 1); True when the numbers can be compared."""
    check, profile = run.check, run.profile
    run.fingerprint = profile.fingerprint(session, check.endpoint, run.deadline)
    run.served = profile.served_rule(run.fingerprint, run.rule)
    refusal = profile.refusal(run.fingerprint)
    if refusal is None and run.served is not None and run.served.synthetic:
        refusal = f"the engine runs with {run.served.synthetic} (synthetic acceptance): restart it without it"
    if refusal:
        raise EngineRefusedError(f"refused: {refusal}")
    pair = check.pair or pair_identity(run.vr, run.drafter_ref, run.rule)
    mismatches = profile.identity_mismatches(run.fingerprint, pair)
    run.findings += [EngineFinding("fingerprint", m) for m in mismatches.values()]
    if run.served is not None:
        why = run.served.drafts_less_than(run.rule)
        if why:
            run.findings.append(EngineFinding("served rule", "the engine's declared flags draft less than the validated "
                                                             f"rule: {'; '.join(why)}"))
    return not set(mismatches) - {"draft"}


def _ask(run: _Run, session: EngineSession, prompts: list[_Prompt]) -> None:
    """Every ``ok`` prompt through the engine, checked, with the server-wide counters around it (step 2)."""
    config = run.vr.config
    todo = [p for p in prompts if p.row.status == "ok"]
    params = CompletionParams(max_tokens=config.max_new_tokens, sampling=config.sampling, seed=config.seed,
                              draft_sampling=run.rule.draft_sampling)
    before = session.counters(run.deadline)
    def progress(done: int, total: int) -> None:
        run.vr.progress("engine", done, total)

    answers = session.complete_all([p.ids for p in todo], params, concurrency=run.check.concurrency,
                                   deadline=run.deadline, progress=progress, accept=_checker(run, todo, "engine"))
    after = session.counters(run.deadline)
    for p, c in zip(todo, answers):
        p.engine = c
    run.scrapes = (before, after)


def _checker(run: _Run, todo: list[_Prompt], who: str) -> Callable[[int, EngineCompletion], EngineCompletion]:
    """Each answer checked as it arrives (:func:`~specdec.engines.answers.check_completion`)."""
    def accept(i: int, c: EngineCompletion) -> EngineCompletion:
        return check_completion(c, vocab_size=run.vocab, what=f"the {who}'s answer to prompt {todo[i].row.prompt_id}")
    return accept


def _baseline(run: _Run, prompts: list[_Prompt]) -> None:
    """The same prompts through the baseline server (no speculation), for the speedup."""
    ep = run.check.endpoint
    base = EngineEndpoint(url=ep.baseline_url, engine=ep.engine, api_key=ep.api_key, served_model=ep.served_model,
                          options=ep.options)
    todo = [p for p in prompts if p.row.status == "ok"]
    config = run.vr.config
    params = CompletionParams(max_tokens=config.max_new_tokens, sampling=config.sampling, seed=config.seed)
    with run.profile.connect(base, run.check.limits) as session:
        answers = session.complete_all([p.ids for p in todo], params, concurrency=run.check.concurrency,
                                       deadline=run.deadline, accept=_checker(run, todo, "baseline"))
    for p, c in zip(todo, answers):
        p.baseline = c


def _core_counters(run: _Run, p: _Prompt, y: list[int]) -> None:
    """The core's exact counters under the validated rule along the engine's tokens ``y`` into ``p.row``."""
    config, stop, rule = run.vr.config, run.stop, run.rule
    k = rule.num_speculative_tokens
    complete = len(y) == config.max_new_tokens or (y and y[-1] in stop)
    if not y or not complete:
        p.row.status, p.row.skip_reason = "skipped", "the engine's output ended early without a stop token"
        return
    # llama.cpp drafts n_max tokens whatever the draft proposes after a rejection: the fast trace counts the same
    trace = draft_trace(run.profile.replay_drafter(run.draft), p.ids, y, run.vocab, kmax=k, stop_token_ids=stop, exact=False,
                        adopts_prefix=rule.first_token_from_prefill)
    st = replay_counters(trace, y, num_speculative_tokens=k, max_new_tokens=config.max_new_tokens,
                         stop_token_ids=stop, drafts_past_stop=rule.drafts_past_stop)
    p.row.core_drafts, p.row.core_draft_tokens = st.num_drafts, st.num_draft_tokens
    p.row.core_accepted_tokens = st.num_accepted_tokens
    p.row.core_accepted_per_position = list(st.accepted_per_position)


def _audit(model: torch.nn.Module, p: _Prompt, y_engine: list[int], y_core: list[int], vocab: int) -> None:
    """First divergence of the engine's greedy output from the core's, and the target's margin there (none for a
    served target: its weights are not here, so every divergence counts as one)."""
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
    if is_served(model):
        row.first_divergence, row.divergence = d, "divergence"
        return
    z = fit_vocab(teacher_forced_logits(model, p.ids + y_core[:d], 1), vocab)[-1].float()  # predicts y[d]
    row.first_divergence = d
    row.divergence_margin = float(z[y_core[d]] - z[y_engine[d]])
    row.divergence = "near-tie" if row.divergence_margin <= NEAR_TIE_LOGITS else "divergence"


def _core_continuations(run: _Run) -> dict[str, list[int]]:
    """The target-only greedy continuation of each prompt (cached; :func:`replay_prompts`): the core's, or with
    engine continuations (``request.engine``, a served target) the serving engine's own, under the replay's
    cache key (a night's replay already made them)."""
    from specdec.validation.replay_report import continuation_target_weights
    from specdec.validation.replay_run import replay_prompts

    vr, model = run.vr, run.vr.model
    cache = vr.continuation_cache()
    replayed = replay_prompts(vr.subset, model, vr.tokenizer, [run.draft], vr.config, eos=vr.eos,
                              ctx_limit=context_limit(model, run.draft), cache=cache,
                              target_weights=continuation_target_weights(vr, cache), kmax=1, replay=False,
                              engine=vr.request.engine)
    return {rp.prompt.id: rp.continuation for rp in replayed if rp.status == "ok"}


def measure_engine(vr: ValidationRun) -> EngineCheckReport:
    """The engine check of the run's one drafter against the engine of ``vr.request.engine_check`` (module
    docstring); :func:`specdec.validation.validate` runs it and attaches the result to the drafter's report.

    Returns:
        :class:`EngineCheckReport` (``findings`` lists what the serving stack does differently).
    Raises:
        specdec.engines.errors.EngineRequestError: the engine is unreachable; its subclasses: an answer is
            malformed or impossible (``EngineAnswerError``), a request or the check ran past its deadline
            (``EngineDeadlineError``), a synthetic-acceptance mode is on (``EngineRefusedError``). One line each.
        ValueError: ``concurrency`` < 1; an engine the check cannot ask; a drafter it cannot compare (a head; an
            n-gram lookup on an engine that does not serve one).
    """
    check: EngineCheck = vr.request.engine_check
    if check.concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {check.concurrency}")
    t0 = time.perf_counter()
    model, config, profile = vr.model, vr.config, engine_profile(check.endpoint.engine)
    d = vr.drafters[0]
    run = _Run(vr, check, _replayed_draft(d, profile), d.ref, profile,
               profile.validated_rule(config.num_speculative_tokens),
               Deadline.after(check.limits.check_timeout_s, CHECK_DEADLINE),
               vocab=int(model.get_output_embeddings().weight.shape[0]), stop=stop_token_ids(vr.eos))
    model.eval()
    if hasattr(run.draft, "eval"):
        run.draft.eval()
    prompts = _prompts(vr.subset, vr.tokenizer, config, context_limit(model, run.draft))
    with profile.connect(check.endpoint, check.limits) as session:
        run.source = session.counters_source
        compared = _identify(run, session)
        if compared:
            _ask(run, session, prompts)
    if not compared:
        return _report(run, prompts, time.perf_counter() - t0, compared=False)
    if check.endpoint.baseline_url:
        _baseline(run, prompts)
    core = _core_continuations(run) if config.sampling.is_greedy else {}
    with torch.inference_mode():
        for p in prompts:
            _fill(run, p, core.get(p.row.prompt_id), model)
    return _report(run, prompts, time.perf_counter() - t0)


def _replayed_draft(d: DrafterUnderTest, profile: EngineProfile) -> Any:
    """The draft the core replays for ``profile``: the drafter's model, or its n-gram lookup where the engine
    serves one (:attr:`~specdec.engines.profile.EngineProfile.serves_lookup`).

    Raises:
        ValueError: any other drafter (a head; an n-gram lookup on an engine without one)."""
    from specdec.kinds import kind_of

    if d.model is not None:
        return d.model
    if kind_of(d.kind).model_free and profile.serves_lookup:
        return d.obj
    raise ValueError(f"the engine check of {profile.name} needs a draft model (got a {d.kind} drafter)")


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


def _fill(run: _Run, p: _Prompt, y_core: list[int] | None, model: torch.nn.Module) -> None:
    """One prompt's row: the engine's counters and rates, the core's replay, the audit."""
    row, c = p.row, p.engine
    if row.status != "ok" or c is None:
        return
    y = engine_tokens(c.token_ids, run.stop, run.vr.config.max_new_tokens)
    row.new_tokens = len(y)
    row.engine_draft_tokens, row.engine_accepted_tokens = c.num_draft_tokens, c.num_accepted_tokens
    row.engine_tokens_per_second, row.engine_seconds = c.tokens_per_second, c.predicted_ms / 1e3
    if p.baseline is not None:
        row.baseline_tokens_per_second, row.baseline_seconds = p.baseline.tokens_per_second, p.baseline.predicted_ms / 1e3
    _core_counters(run, p, y)
    if y_core is not None and row.status == "ok":
        _audit(model, p, y, y_core, run.vocab)


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


def _engine_steps(prompts: list[_Prompt], scrapes: tuple[EngineCounters | None, EngineCounters | None],
                  notes: list[str]) -> tuple[int | None, list[int]]:
    """The engine's drafts and per-position counts over the run: per-request sums when every answer has them,
    else the ``/metrics`` delta when it equals the per-request token sums (nothing else used the server)."""
    answers = [p.engine for p in prompts if p.row.status == "ok" and p.engine is not None]
    if answers and all(c.num_drafts is not None and c.accepted_per_position is not None for c in answers):
        k = max(len(c.accepted_per_position or []) for c in answers)
        return (sum(c.num_drafts or 0 for c in answers),
                [sum((c.accepted_per_position or [])[i] if i < len(c.accepted_per_position or []) else 0
                     for c in answers) for i in range(k)])
    before, after = scrapes
    if before is None or after is None:
        return None, []
    delta = after.minus(before).check("the engine's /metrics delta over the run")
    rows = [p.row for p in prompts if p.row.status == "ok"]
    sums = (sum(r.engine_draft_tokens for r in rows), sum(r.engine_accepted_tokens for r in rows))
    if (delta.draft_tokens, delta.accepted) != sums:
        notes.append(f"/metrics moved by {delta.draft_tokens} drafted / {delta.accepted} accepted during the run, the "
                     f"requests' own timings sum to {sums[0]} / {sums[1]}: other traffic shared the server, so the "
                     "per-position counters are not this run's alone")
        return None, []
    return delta.drafts, list(delta.per_position or [])


def _report(run: _Run, prompts: list[_Prompt], wall: float, *, compared: bool = True) -> EngineCheckReport:
    vr, ep, config, subset = run.vr, run.check.endpoint, run.vr.config, run.vr.subset
    rows = [p.row for p in prompts]
    ok = [r for r in rows if r.status == "ok"] if compared else []
    notes: list[str] = []
    drafts, per_pos = _engine_steps(prompts, run.scrapes, notes) if compared else (None, [])
    overall = summarize(ok, seed=config.seed)
    delivery = delivery_of(ok, drafts, per_pos, seed=config.seed) if compared else None
    audit = {"checked": sum(r.exact_match is not None for r in ok), "identical": sum(bool(r.exact_match) for r in ok),
             "near_tie": sum(r.divergence == "near-tie" for r in ok),
             "divergent": sum(r.divergence == "divergence" for r in ok)}
    findings = list(run.findings)
    if compared:
        k = run.rule.num_speculative_tokens
        findings += [f for f in (delivery_finding(delivery, k, overall.engine_acceptance_rate, overall.core_acceptance_rate),
                                 audit_finding(audit)) if f is not None]
    else:
        notes.append("no number was compared: the engine does not serve the pair's target (findings)")
    if is_served(vr.model):
        notes.append("the target was not loaded here: the audit compares with the engine's own target-only "
                     "continuations (the night's replay), and a divergence has no margin (that needs its weights)")
    return EngineCheckReport(
        engine=run.profile.name, url=safe_url(ep.url or f"offline:{run.profile.name}"),
        heldout_name=subset.name, heldout_version=subset.version, target_ref=vr.target_ref,
        drafter_ref=run.drafter_ref, config=config.to_dict(), concurrency=run.check.concurrency,
        fingerprint=run.fingerprint, counters_source=run.source, overall=overall,
        categories={c: summarize([r for r in ok if r.category == c], seed=config.seed)
                    for c in sorted({r.category for r in ok})},
        engine_per_position=per_pos, core_per_position=delivery.core.per_position if delivery else [],
        engine_num_drafts=drafts, audit=audit, speed=_speed(ok), verdict=verdict_of(overall) if compared else "not compared",
        prompts=rows, notes=notes, wall_seconds=wall, findings=findings, delivery=delivery,
        rule={"validated": asdict(run.rule), "served": asdict(run.served) if run.served else None})
