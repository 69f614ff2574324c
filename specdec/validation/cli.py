"""``specdec validate``: measure a draft/target pair on a held-out set and write the report.

Registered through the ``specdec.cli`` entry point ``validate = "specdec.validation.cli:register"``.
Heavy imports (torch, transformers) happen inside the command so ``specdec --help`` stays fast.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from specdec.engines.profiles import checkable_names, engine_profile, engines_help, offline_names
from specdec.models.store import ModelStore
from specdec.validation.cli_options import (ConfidenceThresholdOption, DraftAdapterOption, DraftSamplingOption,
                                            TargetAdapterOption)

_out = Console()
_err = Console(stderr=True, emoji=False)


def register(app: typer.Typer) -> None:
    """Add the ``validate`` command to the ``specdec`` app (entry-point hook)."""
    app.command("validate")(validate)


def _quiet_libraries() -> None:
    """Keep the terminal to our own progress: no weight-loading / download bars, no torchao
    "Failed to load ... .so" / no-Triton lines and no torch pytree deprecation notes (both are
    internal to those libraries and say nothing about the run). Call before importing torch."""
    import logging
    import os

    for k, v in {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error", "TQDM_DISABLE": "1",
                 "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}.items():
        os.environ.setdefault(k, v)
    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _fail(msg: str) -> None:
    _err.print(f"[bold red]error:[/] {msg}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=1)


def validate(
    *,
    target: Annotated[str, typer.Option("--target", help="Target model: local dir, Hub id, .gguf file, or 'smollm2'.")],
    draft: Annotated[
        list[str],
        typer.Option(
            "--draft", metavar="SPEC",
            help="Drafter: a model ref (or model:REF), 'ngram', 'derived:int8', 'derived:int4', 'derived:bf16', 'derived:fp8' (CUDA), 'eagle3:DIR' (a speculators-format EAGLE-3 head), 'layerskip:N' (the target's first N layers and its LM head) or 'auto' (what `specdec draft recommend` picks). Repeat to "
            "validate several drafters against one shared target-only run (one report each, in --out/<drafter>/). "
            "Not with --canary.",
        ),
    ] = [],
    heldout: Annotated[
        str, typer.Option("--heldout", help="spec_bench | humaneval | spec_bench+humaneval | path to a JSONL file.")
    ] = "spec_bench",
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="Stratified subset of N prompts (spread over categories).")
    ] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=1, help="New tokens per prompt.")] = 64,
    num_speculative_tokens: Annotated[
        int, typer.Option("--num-speculative-tokens", "-k", min=1, help="k, draft tokens proposed per step.")
    ] = 4,
    temperature: Annotated[float, typer.Option("--temperature", min=0.0, help="0 = greedy.")] = 0.0,
    top_k: Annotated[int | None, typer.Option("--top-k", min=1, help="Top-k filter (sampling only).")] = None,
    top_p: Annotated[float | None, typer.Option("--top-p", help="Top-p (nucleus) filter in (0, 1].")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seeds the subset, the sampling and the bootstrap.")] = 0,
    draft_sampling: DraftSamplingOption = "sampled",
    assistant_confidence_threshold: ConfidenceThresholdOption = None,
    device: Annotated[str, typer.Option("--device", help="auto | cpu | cuda | cuda:N.")] = "auto",
    dtype: Annotated[
        str, typer.Option("--dtype", help="auto (bf16 on CUDA, fp32 on CPU) | float32 | bfloat16 | float16.")
    ] = "auto",
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Output directory for report.json + prompts.csv (default: $SPECDEC_HOME/validations/...)."),
    ] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing report in --out.")] = False,
    bootstrap_resamples: Annotated[int, typer.Option("--bootstrap-resamples", min=1, help="Bootstrap replicates.")] = 2000,
    batch_size: Annotated[
        int,
        typer.Option(
            "--batch-size",
            min=1,
            help="Prompts decoded together (left-padded; one batched target-only and one batched speculative call "
            "per drafter per group). Use it when it helps: larger batches raise throughput on GPUs; on a 2-core CPU "
            "batch > 1 mostly adds padding cost. Speedup and the cost ratio are then measured at this batch size.",
        ),
    ] = 1,
    method: Annotated[
        str,
        typer.Option(
            "--method",
            help="decode: speculative decoding on every prompt (speed, exactness). replay: acceptance for every k from "
            "one teacher-forced draft pass over the target's (cached) continuation. both: replay every prompt and "
            "decode a stratified subsample (--decode-fraction), reporting replay_decode_agreement. engine: the engine "
            "check alone (what --engine-url / --engine run).",
        ),
    ] = "decode",
    decode_fraction: Annotated[
        float, typer.Option("--decode-fraction", help="--method both: share of prompts decoded (at least 2 per category).")
    ] = 0.25,
    engine_url: Annotated[str | None, typer.Option(
        "--engine-url", help=f"Engine check: the URL of a running server of --engine ({engines_help(checkable_names())}) "
                             "serving this pair; the held-out prompts go "
                             "to it and its own counters are compared with the core's for the same prompts "
                             "(writes engine_check.json). API key: SPECDEC_ENGINE_API_KEY.")] = None,
    engine_baseline_url: Annotated[str | None, typer.Option(
        "--engine-baseline-url", help="Engine check: the same target served without speculation (for the speedup).")] = None,
    engine_concurrency: Annotated[int, typer.Option(
        "--engine-concurrency", min=1, help="Engine check: requests in flight at once.")] = 1,
    engine: Annotated[str | None, typer.Option(
        "--engine", help=f"Engine check through this engine: {engines_help(checkable_names())}. Without --engine-url, "
                         f"{' or '.join(offline_names())} runs offline here in the engine venv (`make engine`). "
                         "docs/engine-check.md")] = None,
    engine_python: Annotated[str | None, typer.Option(
        "--engine-python", help="--engine vllm offline: the python of your own vLLM venv (default: the one "
                                "`make engine` installed).")] = None,
    target_adapter: TargetAdapterOption = None,
    draft_adapter: DraftAdapterOption = None,
    canary: Annotated[bool, typer.Option(
        "--canary", help="The acceptance canary: the target drafts for itself (no --draft) at --temperature under "
                         "--draft-sampling. The exact rule (sampled) must accept every draft (1.0), the argmax rule "
                         "must give E[p(argmax p)] within its CI; otherwise the drafter or verifier counts with a q "
                         "it does not say. Writes canary.json; exit 1 when it fails. docs/metrics.md#the-canary")] = False,
) -> None:
    """Validate a draft/target pair: acceptance, agreement, speedup and exactness, per category.

    With --engine-url / --engine: the engine check of the pair where it is served (the core is the exact reference).
    With --canary: the target against itself, judged against what each acceptance rule must give."""
    opts = _Options(**locals())  # the options as one typed object (nothing else is defined yet)
    from specdec import stopping

    # Ctrl-C: the current prompt ends, then one line and exit 130 (twice, or SIGTERM: at once; 143)
    with stopping.stoppable(_stopped, kept="no report was written (the prompts decoded so far are above)"):
        _validate(opts)


def _stopped(line: str) -> None:
    _err.print(f"[bold yellow]{line}[/]", highlight=False, soft_wrap=True)


def _validate(opts: "_Options") -> None:
    """The ``validate`` command's body for ``opts`` (see :func:`validate`)."""
    t_start = time.perf_counter()
    draft, engine_url = opts.draft, opts.engine_url
    _quiet_libraries()
    speculative, hs = _check_run_arguments(opts)
    out_dir = opts.out or _default_out(hs.name, "+".join(draft) or "canary")
    out_dirs = _check_out_dirs(draft or ["canary"], out_dir, opts.overwrite)
    config = _check_drafters_and_config(opts, speculative)
    checks_engine = engine_url is not None or opts.engine is not None
    if checks_engine and len(draft) != 1:
        _fail("the engine check checks one pair: give one --draft (the draft the engine serves)")
    if checks_engine:
        _check_engine_option(opts.engine, engine_url)
    if checks_engine and (opts.target_adapter or opts.draft_adapter):
        _fail("the engine check of an adapter pair is not built yet (docs/adapters.md): validate it without --engine")
    if opts.draft_adapter and len(draft) != 1:
        _fail("--draft-adapter adapts one draft model: give one --draft")
    from specdec.core.finite import BrokenModel, NonFiniteLogits

    tgt = None
    try:
        tgt, drafters, out_dirs = _load_pair(opts, out_dir, out_dirs)
        if checks_engine:
            _engine_check(tgt, drafters[0], hs, config, target_ref=opts.target, out_dir=out_dirs[0], opts=opts)
            return
        reports = _run(opts, tgt, drafters, hs, config)
    except NonFiniteLogits as e:  # raised outside a prompt (a timing pass of `--draft auto`): name the side
        _fail(str(BrokenModel.naming(e, getattr(tgt, "model", None), ["(timing pass)"])) + "; nothing was recorded")
    except BrokenModel as e:  # greedy or sampled, decode or replay: one line naming the side, never a figure
        _fail(f"{e}; nothing was recorded")
    verdict = _judge_canary(reports[0]) if opts.canary else None
    _write_and_print(reports, out_dirs, t_start, serving=not opts.canary)
    if verdict is not None:
        _report_canary(verdict, out_dirs[0])


def _check_engine_option(engine: str | None, engine_url: str | None) -> None:
    """One error line (exit 1) for an ``--engine`` the check cannot ask, or that needs ``--engine-url`` (the profile's
    ``checkable`` / ``offline``); ``engine`` None: the default engine."""
    try:
        profile = engine_profile(engine)
    except ValueError as e:
        _fail(f"--engine: {e}")
    if not profile.checkable:
        _fail(f"--engine {profile.name!r} is not an engine the check can ask: use {' or '.join(checkable_names())}")
    if engine_url is None and not profile.offline:
        _fail(f"--engine {profile.name} needs --engine-url (the URL of a running {profile.title} server serving the pair; "
              "`specdec engine serve` starts a llama-server)")


@dataclass(frozen=True)
class _Options:
    """The ``validate`` command's options (their help is on the command)."""

    target: str
    draft: list[str]
    heldout: str
    limit: int | None
    max_new_tokens: int
    num_speculative_tokens: int
    temperature: float
    top_k: int | None
    top_p: float | None
    seed: int
    draft_sampling: str
    assistant_confidence_threshold: float | None
    device: str
    dtype: str
    out: Path | None
    overwrite: bool
    bootstrap_resamples: int
    batch_size: int
    method: str
    decode_fraction: float
    engine_url: str | None
    engine_baseline_url: str | None
    engine_concurrency: int
    engine: str | None
    engine_python: str | None
    target_adapter: str | None
    draft_adapter: str | None
    canary: bool


def _engine_check(tgt: Any, drafter: Any, hs: Any, config: Any, *, target_ref: str, out_dir: Path,
                  opts: _Options) -> None:
    """``--engine-url`` / ``--engine``: run the engine check, write and print it; one error line when the engine fails."""
    from specdec.engines.errors import EngineRequestError
    from specdec.engines.profile import EngineLimits
    from specdec.settings import get_settings
    from specdec.validation.continuation_cache import ContinuationCache
    from specdec.validation.engine_check import EngineEndpoint
    from specdec.validation.engine_cli import offline_endpoint, run_engine_check, write_and_print

    concurrency = opts.engine_concurrency
    settings = get_settings()
    if opts.engine_url is None:
        try:
            endpoint = offline_endpoint(opts.engine, target_ref, drafter, config, engines_dir=settings.engines_dir,
                                        store=ModelStore(settings.models_dir), python=opts.engine_python)
        except ValueError as e:
            _fail(f"engine check: {e}")
        _err.print(f"engine check: starting {engine_profile(opts.engine).title} offline in the engine venv (a first "
                   "start compiles: minutes)", highlight=False)
    else:
        endpoint = EngineEndpoint(url=opts.engine_url, engine=opts.engine,
                                  baseline_url=opts.engine_baseline_url, api_key=settings.engine_api_key)
    limits = EngineLimits.of(settings)
    _err.print(f"engine check: {limits.describe()} (SPECDEC_ENGINE_REQUEST_TIMEOUT_S, "
               "SPECDEC_ENGINE_CHECK_TIMEOUT_S)", highlight=False)
    try:
        report = run_engine_check(tgt, drafter, hs, config, endpoint=endpoint, concurrency=concurrency,
                                  target_ref=target_ref, err=_err, limits=limits,
                                  cache=ContinuationCache.in_home(settings.home))
    except (EngineRequestError, ValueError) as e:
        _fail(f"engine check: {e}")
    write_and_print(report, out_dir, _out)


def _check_run_arguments(opts: _Options) -> tuple[Any, Any]:
    """The speculative config and the held-out set, or one error line (``typer.Exit(1)``) before any model loads."""
    from specdec.core.config import SamplingConfig, SpeculativeConfig
    from specdec.validation.api import METHODS
    from specdec.validation.heldout import HeldoutFormatError, load_heldout

    try:
        speculative = SpeculativeConfig(
            opts.num_speculative_tokens, SamplingConfig(temperature=opts.temperature, top_k=opts.top_k, top_p=opts.top_p),
            opts.max_new_tokens, opts.draft_sampling, opts.assistant_confidence_threshold,
        )
    except (TypeError, ValueError) as e:
        _fail(str(e))
    _check_draft_or_canary(opts)
    for flag, url in (("--engine-url", opts.engine_url), ("--engine-baseline-url", opts.engine_baseline_url)):
        if url is not None:
            _check_engine_url(flag, url)
    if opts.method not in METHODS:
        _fail(f"unknown --method {opts.method!r}: use decode, replay or both")
    if opts.method == "engine" and opts.engine_url is None and opts.engine is None:
        _fail(f"--method engine is the engine check: give --engine-url (or --engine {' or '.join(offline_names())})")
    if not 0 < opts.decode_fraction <= 1:
        _fail(f"--decode-fraction must be in (0, 1], got {opts.decode_fraction}")
    try:
        hs = load_heldout(opts.heldout)
    except (FileNotFoundError, HeldoutFormatError) as e:
        _fail(str(e))
    device = opts.device
    if device not in ("auto", "cpu") and not device.startswith("cuda"):
        _fail(f"unknown device {device!r}: use auto, cpu or cuda[:N]")
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        _fail("--device cuda requested but CUDA is not available")
    return speculative, hs


def _check_draft_or_canary(opts: _Options) -> None:
    """One error line unless exactly one of ``--draft`` and ``--canary`` is given (the canary: decoded, on the core)."""
    if not opts.canary:
        if not opts.draft:
            _fail("give --draft (the drafter to validate), or --canary (the target against itself)")
        return
    if opts.draft:
        _fail("--canary drafts with the target itself: give no --draft")
    if opts.engine_url is not None or opts.engine is not None:
        _fail("--canary checks the core here; it does not run with --engine-url / --engine")
    if opts.method != "decode":
        _fail("--canary judges the decoded counters: use --method decode (the default)")


def _judge_canary(report: Any) -> Any:
    """The canary's :class:`~specdec.validation.canary.CanaryVerdict` of ``report``; its finding joins the notes."""
    from specdec.validation.canary import canary_verdict

    verdict = canary_verdict(report)
    if verdict.finding():
        report.notes.append(verdict.finding())
    return verdict


def _report_canary(verdict: Any, out_dir: Path) -> None:
    """Writes ``canary.json``, prints each check; exit 1 when the canary failed."""
    import json

    (out_dir / "canary.json").write_text(json.dumps(verdict.to_dict(), indent=2) + "\n")
    _out.print(f"canary (draft = target, {verdict.acceptance_rule} rule, T {verdict.temperature:g}):", highlight=False)
    for check in verdict.checks:
        _out.print(f"  {check.line()}", highlight=False)
    _out.print(f"canary: {out_dir / 'canary.json'}", highlight=False)
    if not verdict.passed:
        _fail("canary failed: the acceptance counted is not the served rule's with draft = target (see above)")


def _check_engine_url(flag: str, url: str) -> None:
    """One error line for an engine URL that is empty, does not parse (an unclosed IPv6 host, a port that
    is not a number) or is not ``http(s)://HOST``; the URL itself is shown without its user info."""
    from urllib.parse import urlsplit

    from specdec.redact import shown_url, strip_userinfo

    try:
        parts = urlsplit(strip_userinfo(url)[0])
    except ValueError as e:
        _fail(f"{flag} {shown_url(url)!r} does not parse ({e})")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        _fail(f"{flag} must be the engine's http(s)://HOST[:PORT] base URL, got {shown_url(url)!r}")


def _check_out_dirs(draft: list[str], out_dir: Path, overwrite: bool) -> list[Path]:
    """One output directory per drafter (``out_dir`` itself for one, ``out_dir/<drafter>`` for several); refuses
    a repeated drafter, a non-directory, or an existing report without ``overwrite``."""
    out_dirs = [out_dir] if len(draft) == 1 else [out_dir / _safe(d) for d in draft]
    if len(set(out_dirs)) != len(out_dirs):
        _fail("the same --draft was given twice")
    for od in out_dirs:
        if od.exists() and not od.is_dir():
            _fail(f"--out {od} exists and is not a directory")
        _refuse_existing_report(od, overwrite)
    return out_dirs


def _refuse_existing_report(od: Path, overwrite: bool) -> None:
    if (od / "report.json").exists() and not overwrite:
        _fail(f"{od / 'report.json'} already exists; pass --overwrite or choose another --out")


def _check_drafters_and_config(opts: _Options, speculative: Any) -> Any:
    """Refuses a malformed ``--draft`` before the target loads; returns the ``ValidationConfig``."""
    from specdec.kinds import DrafterSpecError, check_drafter_spec
    from specdec.validation import ValidationConfig

    for spec in opts.draft:
        try:
            check_drafter_spec(spec)
        except DrafterSpecError as e:
            _fail(f"--draft {spec}: {e}")
    try:
        return ValidationConfig(speculative, seed=opts.seed, limit=opts.limit,
                                bootstrap_resamples=opts.bootstrap_resamples, batch_size=opts.batch_size)
    except (TypeError, ValueError) as e:
        _fail(str(e))


def _load_pair(opts: _Options, out_dir: Path, out_dirs: list[Path]) -> tuple[Any, list[Any], list[Path]]:
    """Loads the target, resolves ``--draft auto`` (which may change the output directories) and prepares every
    drafter; returns ``(target model, drafters, output directories)``."""
    from specdec.models import load_causal_lm
    from specdec.kinds import resolve_drafter
    from specdec.settings import model_store

    target, draft, store = opts.target, opts.draft, model_store()
    what = target + (f" + adapter {opts.target_adapter}" if opts.target_adapter else "")
    _step(f"loading target {what} ...")
    with _err.status(f"loading target {what} ..."):
        try:
            tgt = load_causal_lm(target, store=store, dtype=opts.dtype, device=opts.device, adapter=opts.target_adapter)
        except (FileNotFoundError, ValueError) as e:
            _fail(f"target: {e}")
    if opts.canary:  # the target drafts for itself (validate decodes with a copy of it)
        from specdec.kinds import ResolvedDrafter

        return tgt, [ResolvedDrafter(tgt.model, "model", ref=f"canary: {target}")], out_dirs
    if "auto" in draft:
        draft, out_dirs = _resolve_auto(tgt, opts, out_dir, out_dirs, store)
    drafters = []
    for spec in draft:
        _step(f"preparing drafter {spec} ...")
        with _err.status(f"preparing drafter {spec} ..."):
            try:
                drafters.append(resolve_drafter(spec, tgt, store=store, adapter=opts.draft_adapter))
            except (FileNotFoundError, ValueError) as e:  # ModelNotFoundError, IncompatiblePairError, DrafterSpecError,
                # AdapterError
                _fail(f"drafter {spec}: {e}")
        for note in (drafters[-1].compatibility or {}).get("notes", []):
            _err.print(f"[bold yellow]note:[/] drafter {spec}: {note}", highlight=False)
    return tgt, drafters, out_dirs


def _resolve_auto(tgt: Any, opts: _Options, out_dir: Path, out_dirs: list[Path], store: ModelStore
                  ) -> tuple[list[str], list[Path]]:
    """``--draft auto``: measures the candidates here (drafts fetched into ``store``, a
    :class:`~specdec.models.ModelStore`) and validates the one that pays (or the fastest)."""
    from specdec.validation.recommend_cli import print_recommendation, run_recommend

    rec = run_recommend(tgt, seed=opts.seed, target_ref=opts.target, store=store)
    print_recommendation(rec)
    choice = rec.best or rec.fallback
    if choice is None:
        _fail("--draft auto: no candidate drafter could run here")
    if rec.best is None:
        _err.print(f"[yellow]--draft auto:[/] nothing pays here; validating the fastest candidate, {choice}")
    draft = [choice if d == "auto" else d for d in opts.draft]
    if len(set(draft)) != len(draft):
        _fail(f"--draft auto chose {choice}, which is also given explicitly")
    if len(draft) > 1:
        out_dirs = [out_dir / _safe(d) for d in draft]
        for od in out_dirs:
            _refuse_existing_report(od, opts.overwrite)
    return draft, out_dirs


def _run(opts: _Options, tgt: Any, drafters: list[Any], hs: Any, config: Any) -> list[Any]:
    """One report per drafter from :func:`specdec.validation.validate`, with a progress bar per phase (and one
    plain line per prompt when stderr is not a terminal)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from specdec import stopping
    from specdec.settings import get_settings
    from specdec.validation import ValidationRequest, validate
    from specdec.validation.continuation_cache import ContinuationCache

    n = min(config.limit or len(hs), len(hs))
    replaying = "replay every prompt (cached continuations), " if opts.method != "decode" else ""
    decoding = f"{n} prompts: " if opts.method == "decode" else "then a decoded subsample: " if opts.method == "both" else ""
    if opts.method != "replay":
        decoding += "target-only and speculative decoding of each, interleaved"
    _step(f"warming up and timing one pass of each model (c, v(n)); {replaying}{decoding}")
    cols = (TextColumn("[bold]{task.fields[phase]}[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TimeRemainingColumn(), TextColumn("{task.description}"))
    with Progress(*cols, console=_err, transient=False) as prog:
        tasks: dict[str, Any] = {}

        def tick(p: Any) -> None:
            stopping.check()  # after a first Ctrl-C: stop here, the prompt just finished
            if p.phase not in tasks:
                tasks[p.phase] = prog.add_task("", total=p.total, phase=p.phase)
            desc = _prompt_line(p.rows) if p.rows else ""
            prog.update(tasks[p.phase], completed=p.done, total=p.total, description=desc)
            if not _err.is_terminal:  # logs (CI, Prefect workers): one plain line per prompt
                count = f"{p.done}/{p.total}" if p.phase == "decode" else f"{p.phase} {p.done}/{p.total}"
                _err.print(f"[{count}] {desc}".rstrip(), highlight=False)

        return validate(ValidationRequest(tgt, drafters, hs, config, method=opts.method,
                                          decode_fraction=opts.decode_fraction, target_ref=opts.target, progress=tick,
                                          cache=ContinuationCache.in_home(get_settings().home)))


def _prompt_line(rows: Any) -> str:
    """One decoded prompt's line: its category, id and each drafter's acceptance (or why it was skipped)."""
    row = rows[0]
    if row.status != "ok":
        return f"{row.category} #{row.prompt_id}: skipped ({row.skip_reason})"
    return f"{row.category} #{row.prompt_id}: acceptance {', '.join(_f(r.acceptance_rate) for r in rows)}"


def _write_and_print(reports: list[Any], out_dirs: list[Path], t_start: float, *, serving: bool = True) -> None:
    """Writes each report to its directory and prints its summary (``serving``: and its serving config); exits 1
    when no prompt could be validated."""
    for report, od in zip(reports, out_dirs):
        path = report.write(od)
        _print_summary(report)
        _print_rules(report)
        if report.replay is not None:
            _print_replay(report, _out)
        _out.print(f"report: {path}\nper-prompt rows: {od / 'prompts.csv'}")
        if serving:
            _write_serving_config(report, od)
    _out.print(f"wall time {time.perf_counter() - t_start:.1f} s (validation {reports[0].wall_seconds:.1f} s)")
    if reports[0].overall.num_prompts == 0:
        _fail("no prompt could be validated (all skipped: empty or longer than the context); see prompts.csv")


def _write_serving_config(report: Any, od: Path) -> None:
    """Writes ``serving_config.json`` (the engine flags for the validated k) next to the report and
    prints its command-line arguments."""
    import json
    import shlex

    from specdec.validation.serving import report_serving_config

    serving = report_serving_config(report)
    if serving is None or serving.get("none"):
        why = serving["none"] if serving else "no draft checkpoint an engine could load"
        _out.print(f"serving config: none for {report.drafter_kind} ({why})\n", highlight=False, soft_wrap=True)
        return
    (od / "serving_config.json").write_text(json.dumps(serving, indent=2) + "\n")
    args = shlex.join(serving.get("args") or [f"{k}={v}" for k, v in (serving.get("generate_kwargs") or {}).items()])
    _out.print(f"serving ({serving['engine']}): {args}\nserving config: {od / 'serving_config.json'}\n",
               highlight=False, soft_wrap=True)
    if serving.get("derived"):
        _out.print(f"  derived draft: {serving['derived']}\n", highlight=False, soft_wrap=True)


def _safe(name: str) -> str:
    """A file-name-safe form of a drafter spec (``derived:int8`` -> ``derived_int8``)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:60]


def _default_out(heldout_name: str, draft: str) -> Path:
    from specdec.settings import get_settings

    stamp = time.strftime("%Y%m%dT%H%M%S")
    return get_settings().home / "validations" / f"{heldout_name}-{_safe(draft)}-{stamp}"


def _step(msg: str) -> None:
    """A plain progress line where there is no terminal (logs, CI, Prefect workers: rich's spinners print
    nothing there, and the first prompt can take minutes on a busy machine)."""
    if not _err.is_terminal:
        _err.print(msg, highlight=False, soft_wrap=True)


def _f(x: float | None, digits: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _x(v: float | None) -> str:
    return "-" if v is None or math.isnan(v) else f"{v:.2f}x"


def _ci(v: float, ci: list[float]) -> str:
    if math.isnan(v):
        return "-"
    if any(x is None or math.isnan(x) for x in ci):  # e.g. one prompt: no interval to show
        return f"{v:.3f} [CI not estimable]"
    return f"{v:.3f} [{_f(ci[0], 2)}, {_f(ci[1], 2)}]"


def _batch_label(config: dict) -> str:
    b = config.get("batch_size") or 1
    return f", batch size {b}" if b != 1 else ""


def _print_summary(report: Any) -> None:
    from rich import box

    k = report.config.get("num_speculative_tokens")
    rows = [("overall", report.overall)] + list(report.categories.items())
    adapter = f" + adapter {report.target_adapter['name']}" if report.target_adapter else ""
    title = (
        f"{report.drafter_kind} drafter for {report.target_ref}{adapter} on {report.heldout_name} "
        f"(k={k}, {report.config.get('max_new_tokens')} new tokens, temperature {report.config.get('temperature')}"
        f"{_batch_label(report.config)})"
    )
    acc = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    for name in ("category", "prompts", "per-token [95% CI]", f"acc. rate at k={k} [95% CI]", "mean acc. len",
                 "α̂ MLE [95% CI]", "α_tf [95% CI]"):
        acc.add_column(name, justify="left" if name == "category" else "right")
    spd = Table(box=box.SIMPLE_HEAD)
    for name in ("category", "top-1", "TV", "KL", "speedup", f"pred. (k={k})", "best k (pred.)", "exact"):
        spd.add_column(name, justify="left" if name == "category" else "right")
    for name, g in rows:
        label = f"[bold]{name}[/]" if name == "overall" else name
        skipped = f" +{g.num_skipped} skipped" if g.num_skipped else ""
        acc.add_row(
            label,
            f"{g.num_prompts}{skipped}",
            _ci(g.per_token_acceptance, g.per_token_acceptance_ci),
            _ci(g.acceptance_rate, g.acceptance_rate_ci),
            _f(g.mean_accepted_length, 2),
            _ci(g.alpha_hat, g.alpha_hat_ci),
            _ci(g.alpha_tf, g.alpha_tf_ci),
        )
        best = (
            "-"
            if g.recommended_num_speculative_tokens is None
            else f"{g.recommended_num_speculative_tokens} ({_f(g.predicted_speedup_at_recommended, 2)}x)"
        )
        exact = f"{g.exactness_checked - g.exactness_mismatches}/{g.exactness_checked}" if g.exactness_checked else "-"
        spd.add_row(
            label,
            _f(g.top1_agreement),
            _f(g.total_variation),
            _f(g.kl_divergence),
            _x(g.speedup),
            _x(g.predicted_speedup),
            best,
            exact,
        )
    _out.print(acc)
    _out.print(spd)
    g = report.overall
    _out.print(
        f"cost ratio ĉ = {_f(g.cost_ratio)} (draft pass {_f(g.draft_pass_seconds * 1e3, 2)} ms / one-token target pass "
        f"{_f(g.target_step_seconds * 1e3, 2)} ms); verification pass {_f(g.target_pass_seconds * 1e3, 2)} ms "
        f"= {_f(g.verify_cost_ratio, 2)} target passes. Prediction (one speed model: Σ(accepted+1) / Σ(c·proposed + "
        f"v(proposed)) over the run's steps) with c = {_f(g.predicted_cost_ratio)}, v(n) = "
        f"{', '.join(_f(x, 2) for x in g.verify_cost_by_n[:9])}: {_x(g.predicted_speedup)}; best k from "
        f"{g.recommended_k_basis or '-'}. α̂ = {report.alpha_hat_estimator}.",
        highlight=False,
    )
    for note in report.notes:
        _out.print(f"[bold yellow]note:[/] {note}", highlight=False)


def _print_rules(report: Any) -> None:
    """Both acceptance rules from the teacher-forced pass (docs/metrics.md "Two acceptance rules"), overall and per
    category: the rate with its CI and the expected rate per draft position; the served rule marked."""
    from rich import box

    served = report.acceptance_rule
    t = Table(title=f"acceptance rules (teacher-forced; served: {served or 'not named'})", title_justify="left",
              box=box.SIMPLE_HEAD)
    for name in ("category", "exact Σmin(p,q) [95% CI]", "per position", "argmax p(argmax q) [95% CI]", "per position"):
        t.add_column(name, justify="left" if name == "category" else "right")
    for name, g in [("overall", report.overall), *report.categories.items()]:
        cells = []
        for rule in ("exact", "argmax"):
            mark = " *" if rule == served and getattr(g, f"{rule}_rule_per_position") else ""
            cells += [_ci(getattr(g, f"{rule}_rule_acceptance"), getattr(g, f"{rule}_rule_acceptance_ci")) + mark,
                      " ".join(_f(x, 2) for x in getattr(g, f"{rule}_rule_per_position")) or "-"]
        t.add_row(f"[bold]{name}[/]" if name == "overall" else name, *cells)
    _out.print(t)


def _print_replay(report: Any, out: Console) -> None:
    """The replay section: the acceptance-by-k table, the per-method counters, agreement and the recommended k."""
    from rich import box

    r = report.replay
    k0 = report.config.get("num_speculative_tokens")
    t = Table(title=f"replay ({r['kind']}; precision {r['precision']}; gate: {r['gate_method']})", title_justify="left",
              box=box.SIMPLE_HEAD)
    for name in ("k", "acceptance [95% CI]", "mean acc. len", "pred. speedup (c, v measured)"):
        t.add_column(name, justify="right")
    for row in r["acceptance_by_k"]:
        acc = row.get("acceptance_rate", row.get("expected_acceptance_rate"))
        ci = row.get("acceptance_rate_ci", row.get("expected_acceptance_rate_ci")) or [None, None]
        mal = row.get("mean_accepted_length", row.get("expected_mean_accepted_length"))
        mark = " *" if row["k"] == k0 else ""
        t.add_row(f"{row['k']}{mark}", f"{_f(acc)} [{_f(ci[0], 2)}, {_f(ci[1], 2)}]", _f(mal, 2),
                  _f(row.get("predicted_speedup"), 2))
    out.print(t)
    cont = r["continuations"]
    out.print(f"replayed {r['num_prompts_replayed']} prompts (continuations: {cont['cache']} cached, "
              f"{sum(v for w, v in cont.items() if w != 'cache')} produced); seconds: continuation "
              f"{_f(r['seconds']['continuation'], 1)}, replay {_f(r['seconds']['replay'], 1)}", highlight=False)
    if r.get("recommended_num_speculative_tokens") is not None:
        out.print(f"recommended k from the replayed curve: {r['recommended_num_speculative_tokens']} "
                  f"(predicted {_f(r['predicted_speedup_at_recommended'], 2)}x with c = {_f(r['cost_ratio'])}, "
                  f"v(n) = {', '.join(_f(x, 2) for x in (r.get('verify_cost_by_n') or [])[:9])}, ...)", highlight=False)
    kt = r.get("best_k_tau") or {}
    if kt.get("num_speculative_tokens") is not None:
        fixed = r["best_fixed_k"]
        tau = kt["assistant_confidence_threshold"]
        out.print(f"best (k, tau): k = {kt['num_speculative_tokens']}, assistant_confidence_threshold = "
                  f"{'none' if tau is None else _f(tau, 1)} (predicted {_f(kt['predicted_speedup'], 2)}x) next to the best "
                  f"fixed k = {fixed['num_speculative_tokens']} ({_f(fixed['predicted_speedup'], 2)}x)", highlight=False)
    if "counters" in r:
        for name, c in r["counters"].items():
            ci = c.get("acceptance_rate_ci") or [None, None]
            out.print(f"{name:>17}: {c['num_prompts']} prompts, acceptance {_f(c['acceptance_rate'])} "
                      f"[{_f(ci[0], 2)}, {_f(ci[1], 2)}], drafts {c['num_drafts']}, proposed {c['num_draft_tokens']}, "
                      f"accepted {c['num_accepted_tokens']}", highlight=False)
    if "replay_decode_agreement" in r:
        out.print(f"replay_decode_agreement: {_f(r['replay_decode_agreement'])} of {r['num_compared']} decoded prompts; "
                  f"{r['beyond_numerics']} disagreement(s) beyond numerics", highlight=False)
        for d in r["disagreements"][:10]:
            out.print(f"  {d['category']} #{d['prompt_id']}: position {d['position']}, logit margin "
                      f"{_f(d['logit_margin'])}: {d['class']}", highlight=False)
