"""``specdec pair ...``: register, list, show and promote draft/target pairs in MLflow.

Registered through the ``specdec.cli`` entry point ``pair = "registry.cli:register"``. Every command
takes ``--tracking-uri`` (default ``SPECDEC_TRACKING_URI`` / ``MLFLOW_TRACKING_URI`` /
``sqlite:///<SPECDEC_HOME>/mlflow.db``). Bad input and registry errors print one clear line to stderr
and exit 1.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, NoReturn, Optional

import typer
from rich.console import Console
from rich.table import Table

from specdec.engines.profiles import (DEFAULT_ENGINE, ENGINE_PROFILES, checkable_names, engine_for_rule,
                                      engines_help)
from specdec.settings import model_store
from specdec.validation.cli_options import ConfidenceThresholdOption, DraftAdapterOption, TargetAdapterOption

pair_app = typer.Typer(help="Draft/target pairs in the MLflow registry: register, list, show, promote.",
                       no_args_is_help=True)

TrackingOpt = Annotated[str | None, typer.Option("--tracking-uri", help="MLflow tracking/registry URI "
                                                 "(default: SPECDEC_TRACKING_URI, MLFLOW_TRACKING_URI, or SQLite under SPECDEC_HOME).")]


def register(app: typer.Typer) -> None:
    """Entry point for the ``specdec.cli`` group: adds the ``pair`` sub-command, and gives
    ``specdec draft train eagle3`` its ``--register`` and ``models:/`` references (:mod:`registry.heads`)."""
    app.add_typer(pair_app, name="pair")
    from registry.register import head_registry_hooks
    from specdec.training.cli import set_head_registry

    set_head_registry(head_registry_hooks(_policy_gate, model_store, lambda: _command_registry(None)))


def _command_registry(tracking_uri: str | None):
    """This command's one MLflow service (:class:`registry.service.Registry`): the registry section read here,
    at the edge, with ``--tracking-uri`` over its URI. Raises RegistryUnavailable / RegistryError (a bad or
    unreachable URI) and ``ValueError`` (pydantic's) on a malformed setting."""
    from registry.service import Registry
    from registry.settings import get_settings

    return Registry(get_settings(), tracking_uri=tracking_uri)


def _policy_gate(**overrides):
    """The promotion gate of the acceptance policy (``SPECDEC_POLICY__*``, read here, at the edge), with
    ``overrides`` (:meth:`registry.gate.GateConfig.from_policy`). Raises ``ValueError`` on a malformed policy."""
    from registry.gate import GateConfig
    from specdec.settings.policy import get_policy

    return GateConfig.from_policy(get_policy(), **overrides)


def _out() -> Console:
    return Console(soft_wrap=False)


def _quiet_mlflow() -> None:
    """No artifact progress bars for commands that only fetch a small pair.json (unless the user set it)."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def _fail(msg: str) -> NoReturn:
    Console(stderr=True, emoji=False).print(f"[bold red]error:[/] {msg}", highlight=False, markup=True, soft_wrap=True)
    raise typer.Exit(code=1)


def _user_errors() -> tuple[type[BaseException], ...]:
    from registry.errors import RegistryError

    errs: list[type[BaseException]] = [RegistryError, ValueError, FileNotFoundError]
    try:
        from specdec.models import IncompatiblePairError, ModelNotFoundError

        errs += [IncompatiblePairError, ModelNotFoundError]
    except ImportError:  # pragma: no cover
        pass
    return tuple(errs)


@pair_app.command("register")
def register_cmd(
    *,
    target: Annotated[str, typer.Option("--target", help="Target: Hub id, local dir, .gguf, smollm2, or models:/<name>/<v>.")],
    draft: Annotated[str, typer.Option("--draft", help="Draft: a model ref (as --target, optionally 'model:<ref>'), ngram, derived:int8, derived:int4, derived:bf16, derived:fp8 (CUDA), or eagle3:<head dir or models:/...> (an EAGLE-3 head).")],
    name: Annotated[str | None, typer.Option("--name", help="Pair registered model (default specdec-pair).")] = None,
    target_name: Annotated[str | None, typer.Option(help="Registered model name for the target (default: from the ref).")] = None,
    draft_name: Annotated[str | None, typer.Option(help="Registered model name for the draft (default: from the ref).")] = None,
    num_speculative_tokens: Annotated[
        int, typer.Option("--num-speculative-tokens", "-k", min=1, help="k: draft tokens proposed per step.")
    ] = 4,
    temperature: Annotated[float, typer.Option(min=0.0, help="Sampling temperature (0 = greedy).")] = 0.0,
    top_k: Annotated[int | None, typer.Option(min=1, help="Top-k filter.")] = None,
    top_p: Annotated[float | None, typer.Option(min=0.0, max=1.0, help="Top-p (nucleus) filter.")] = None,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Generation budget per prompt (tokens).")] = 128,
    draft_sampling: Annotated[Optional[str], typer.Option(
        "--draft-sampling", show_default=False,
        help="Proposal rule of model drafts: argmax (the draft's argmax verified with one-hot q; what vLLM and "
             "SGLang serve) or sampled (x ~ q; transformers). Same output; acceptance differs at T > 0. Default: the "
             f"--engine's rule; without --engine: argmax ({engine_for_rule('argmax')}), at T > 0 sampled "
             f"({engine_for_rule('sampled')}).")] = None,
    assistant_confidence_threshold: ConfidenceThresholdOption = None,
    engine: Annotated[str | None, typer.Option(
        "--engine", help="Serving engine profile: " + " | ".join(f"{n} ({p.draft_sampling})" for n, p in ENGINE_PROFILES.items())
        + ". Sets the proposal rule the nightly measures under and the serving config logged. Default: the first "
        "engine with the --draft-sampling rule.")] = None,
    revision: Annotated[str | None, typer.Option(help="Hub revision of the target (Hub ids only).")] = None,
    model_card: Annotated[Path | None, typer.Option(exists=True, dir_okay=False, help="Model card (Markdown) for the target.")] = None,
    alias: Annotated[str | None, typer.Option("--alias", help="Alias to point at the new version (ungated; '' for none).")] = "challenger",
    acceptance_floor: Annotated[float | None, typer.Option(
        "--acceptance-floor", min=0.0, max=1.0,
        help="This pair version's own acceptance floor (tag acceptance_floor), e.g. 0.20 for an EAGLE-3 head whose "
             "healthy rate at k 5 is 0.23; default: the policy's (SPECDEC_POLICY__THRESHOLD, 0.40).")] = None,
    tracking_uri: TrackingOpt = None,
    target_adapter: TargetAdapterOption = None,
    draft_adapter: DraftAdapterOption = None,
) -> None:
    """Check draft/target compatibility, then register target, draft and the pair version (made the @challenger,
    so the nightly flow validates it). Says so at once when the pair's validated acceptance rate at this k is
    already below its floor, with the rate at smaller k.

    ``--draft`` also accepts ``models:/<draft>/<v>`` of a registered draft, e.g. an old derived
    draft kept after a target-only fine-tune."""
    from specdec.terminal import quiet_command

    with quiet_command("register") as term:  # torch, transformers, MLflow: their noise goes to the log file
        import mlflow  # noqa: F401 (its log handler exists before the terminal filter is applied)

        from registry.register import register_pair_from_refs
        from specdec.core.config import SamplingConfig, SpeculativeConfig

        if term is not None:
            term.refresh()
        try:
            if alias:
                from registry.promotion import check_alias_name
                from registry.settings import get_settings

                check_alias_name(alias, get_settings().aliases)  # a typo is refused before any model is loaded
            sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
            config = SpeculativeConfig(num_speculative_tokens, sampling, max_new_tokens, draft_sampling or "sampled",
                                       assistant_confidence_threshold)  # "sampled" = no explicit rule: the engine's
            from specdec.validation.serving import engine_config

            engine, config = engine_config(engine, config)  # a bad engine is refused before any model loads
            card = model_card.read_text() if model_card else None
            registry = _command_registry(tracking_uri)
            reg = register_pair_from_refs(target, draft, name=name, target_name=target_name, draft_name=draft_name,
                                          config=config, revision=revision, model_card=card, registry=registry,
                                          engine=engine, store=model_store(), target_adapter=target_adapter,
                                          draft_adapter=draft_adapter)
        except _user_errors() as e:
            _fail(str(e))
        pv, tref, dref, kind = reg.pair, reg.target, reg.draft, reg.drafter_kind
        floor_line = _apply_floor(pv, acceptance_floor, registry)
        if alias:
            from registry.promotion import promote

            try:
                moved = promote(pv.name, pv.version, alias, gate=_policy_gate(), registry=registry)
            except _user_errors() as e:
                _fail(f"registered {pv.uri} but could not set @{alias}: {e}")
            _say_who_the_nightly_drops(pv, alias, moved.previous_version, registry)
        out = _out()
        verb = "already registered as" if pv.reused else "registered"
        out.print(f"[green]{verb}[/] {pv.uri}  (changed: {pv.changed}){f'  @{alias}' if alias else ''}", highlight=False)
        out.print(f"  target  {tref.uri}{'  (reused)' if tref.reused else ''}  weights {tref.weights_sha256[:12]}", highlight=False)
        if dref is not None:
            out.print(f"  draft   {dref.uri}{'  (reused)' if dref.reused else ''}  weights {dref.weights_sha256[:12]}", highlight=False)
        _print_adapters(reg, out)
        out.print(f"  drafter {kind}  {config.describe()}", highlight=False)
        out.print(f"  engine  {engine}", highlight=False)
        for note in (pv.compatibility or {}).get("notes", []):
            out.print(f"  [yellow]note:[/] {note}", highlight=False)
        out.print(f"  floor   {floor_line[0]}", highlight=False)
        if floor_line[1]:
            out.print(f"  [yellow]warning:[/] {floor_line[1]}", highlight=False)


def _print_adapters(reg, out: Console) -> None:
    """One line per LoRA adapter of a registration: its version, name, rank and the base it is lineage to."""
    for side, ref in (("target", reg.target_adapter), ("draft", reg.draft_adapter)):
        if ref is not None:
            t = ref.tags
            out.print(f"  {side} adapter {ref.uri}{'  (reused)' if ref.reused else ''}  {t.get('adapter.name')} "
                      f"r={t.get('adapter.rank')}  on {t.get('adapter.base')}  weights {ref.weights_sha256[:12]}",
                      highlight=False)


def _apply_floor(pv, floor: float | None, registry) -> tuple[str, str | None]:
    """Set the version's own floor when given; (its floor label, the below-floor warning or None)."""
    from registry.floor import registration_floor_note, set_acceptance_floor
    from specdec.policy import FLOOR_TAG, floor_for
    from specdec.settings.policy import get_policy

    tags = dict(pv.tags)
    try:
        if floor is not None:
            tags[FLOOR_TAG] = str(set_acceptance_floor(pv.name, pv.version, floor, registry=registry))
        policy = get_policy()
        return floor_for(policy, tags).label(), registration_floor_note(pv, policy=policy, registry=registry,
                                                                         tags=tags)
    except _user_errors() as e:
        _fail(f"registered {pv.uri} but could not set its floor: {e}")


def _say_who_the_nightly_drops(pv, alias: str, previous: str | None, registry) -> None:
    """One loud line when moving ``alias`` to the new version leaves the previous one without any alias:
    the nightly validates aliases, so that version is no longer validated each night."""
    if not previous or str(previous) == str(pv.version):
        return
    from registry.pairs import get_pair_version

    try:
        still = get_pair_version(pv.name, previous, download=False, registry=registry).aliases
    except _user_errors():
        return
    if not still:
        Console(stderr=True, emoji=False).print(
            f"[bold yellow]note:[/] @{alias} moved from v{previous} to v{pv.version}: v{previous} has no alias left, so the "
            f"nightly (which validates aliases) no longer validates it; `specdec pair promote {pv.name} {previous} "
            "--alias champion` keeps it in", highlight=False, soft_wrap=True)


@pair_app.command("list")
def list_cmd(
    name: Annotated[str | None, typer.Argument(help="Pair registered model (default: every registered pair).")] = None,
    tracking_uri: TrackingOpt = None,
) -> None:
    """List pair versions with aliases, lineage, last validation and the one-line description."""
    _quiet_mlflow()
    from registry.pairs import list_pair_versions, pair_names

    try:
        registry = _command_registry(tracking_uri)
        names = [name] if name else pair_names(registry=registry)
        if not names:
            _out().print("no pairs registered yet (specdec pair register --target ... --draft ...)", highlight=False)
            return
        for n in names:
            _print_versions(n, list_pair_versions(n, registry=registry))
    except _user_errors() as e:
        _fail(str(e))


def _print_versions(name: str, versions) -> None:
    pair = versions[0].name if versions else name
    table = Table(title=f"{pair} versions", show_lines=False)
    for col in ("version", "aliases", "drafter", "target", "draft", "config", "changed", "validation", "description"):
        table.add_column(col, overflow="fold")
    for pv in versions:
        tg = pv.tags
        status = tg.get("validation_status", "never")
        color = {"passed": "green", "failed": "red"}.get(status, "yellow")
        acc = tg.get("acceptance_rate", tg.get("validation.acceptance_rate"))
        shown = f"[{color}]{status}[/]" + (f" acceptance {float(acc):.3f}" if acc else "")
        cfg = pv.config
        table.add_row(pv.version, " ".join("@" + a for a in pv.aliases), pv.drafter_kind,
                      pv.target_uri.removeprefix("models:/"), (pv.draft_uri or "-").removeprefix("models:/"),
                      f"k={cfg.num_speculative_tokens} T={cfg.sampling.temperature:g}", pv.changed, shown,
                      pv.description or "-")
    _out().print(table)


@pair_app.command("show")
def show_cmd(
    name: Annotated[str, typer.Argument(help="Pair registered model.")],
    version: Annotated[Optional[str], typer.Argument(
        help="Version number or alias (champion, challenger); default: the newest version.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    tracking_uri: TrackingOpt = None,
) -> None:
    """Show one pair version: exact target/draft, config, compatibility, lineage, validation, promotion."""
    _quiet_mlflow()
    from registry.pairs import get_pair_version, newest_pair_version
    from registry.runs import latest_validation_run

    try:
        registry = _command_registry(tracking_uri)
        version = version or newest_pair_version(name, registry=registry)
        pv = get_pair_version(name, version, download=False, registry=registry)
        run = latest_validation_run(name, pv.version, registry=registry)
    except _user_errors() as e:
        _fail(str(e))
    d = pv.to_dict()
    d["latest_validation"] = None if run is None else {
        "run_id": run.info.run_id, "status": run.data.tags.get("validation_status"),
        "acceptance_rule": run.data.tags.get("specdec.acceptance_rule"),
        "metrics": {k: v for k, v in sorted(run.data.metrics.items()) if "." not in k}}
    serving = _serving_config(run)
    d["serving_config"] = serving
    if as_json:
        typer.echo(json.dumps(d, indent=2, default=str))
        return
    table = Table(title=f"{pv.uri}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    rows = [("aliases", ", ".join("@" + a for a in pv.aliases) or "-"), ("drafter kind", pv.drafter_kind),
            ("target", f"{pv.target_uri}  weights {pv.target_weights_sha256[:16]}"),
            ("draft", f"{pv.draft_uri}  weights {(pv.draft_weights_sha256 or '')[:16]}" if pv.draft_uri else "- (n-gram)"),
            *[(f"{side} adapter", f"{a['uri']}  {a.get('name')}  weights {(a.get('weights_sha256') or '')[:16]}")
              for side, a in (("target", pv.target_adapter), ("draft", pv.draft_adapter)) if a],
            ("config", json.dumps(pv.config.to_dict())), ("changed", f"{pv.changed} (vs v{pv.previous_version})" if pv.previous_version else pv.changed),
            ("compatibility", json.dumps(pv.compatibility)), ("created", pv.created_at or "-")]
    if pv.recipe:
        rows.append(("recipe", json.dumps(pv.recipe)))
    if run is None:
        rows.append(("validation", "never validated"))
    else:
        m = run.data.metrics
        from registry.describe import speed_note

        note = speed_note(run.data.metrics)
        rows.append(("validation", _verdict_line(run.data.tags) + (f"; {note}" if note else "") + f"  run {run.info.run_id}"))
        for k in ("acceptance_rate", "acceptance_rate_ci_low", "per_token_acceptance", "mean_accepted_length",
                  "alpha_tf", "speedup", "predicted_speedup"):
            if k in m:
                rows.append((f"  {k}", f"{m[k]:.4f}"))
        rows += _rule_rows(run.data.tags.get("specdec.acceptance_rule"), m)
    rows.append(("floor", _floor_label(pv.tags)))
    rows += _serving_rows(pv.tags, serving)
    for k, v in sorted(pv.tags.items()):
        if k == "promotion" or k.startswith("promotion."):
            rows.append((k, v))
    rows.append(("description", pv.description or "-"))
    for k, v in rows:
        table.add_row(k, v)
    _out().print(table)


def _rule_rows(served: str | None, metrics) -> list[tuple[str, str]]:
    """``pair show``'s rows of both acceptance rules (docs/metrics.md "Two acceptance rules") from the run's
    metrics: the served rule (tag ``specdec.acceptance_rule``), each rule's rate with its CI and per draft position."""
    rows = [("  acceptance rule", f"{served} (served; the floor judges it)" if served and served != "none"
             else "not recorded")]
    for rule in ("exact", "argmax"):
        name = f"{rule}_rule_acceptance"
        if name not in metrics:
            continue
        ci = (f" [{metrics[name + '_ci_low']:.3f}, {metrics[name + '_ci_high']:.3f}]"
              if name + "_ci_low" in metrics and name + "_ci_high" in metrics else "")
        per = [metrics[f"{name}.pos_{i}"] for i in range(64) if f"{name}.pos_{i}" in metrics]
        positions = f"; per position {' '.join(f'{x:.2f}' for x in per)}" if per else ""
        rows.append((f"  {name}", f"{metrics[name]:.4f}{ci}{positions}"))
    return rows


def _verdict_line(tags) -> str:
    """``failed (the run's verdict; gate failed: <reasons>)``: the run's one verdict word (the same as the
    nightly table, the description, the alert and the history), then the gate's part of it."""
    word, gate = tags.get("validation_status"), tags.get("specdec.gate_status")
    reasons = tags.get("specdec.gate_reasons") or "none"
    return f"{word} (the run's verdict; gate {gate or word}" + ("" if reasons == "none" else f": {reasons}") + ")"


def _floor_label(tags) -> str:
    """The pair version's floor and where it came from (its tag ``acceptance_floor``, else the policy)."""
    from specdec.policy import floor_for
    from specdec.settings.policy import get_policy

    try:
        return floor_for(get_policy(), tags).label()
    except ValueError as e:  # a malformed tag set by hand: shown, the nightly reports it too
        return f"invalid: {e}"


def _serving_config(run) -> dict | None:
    """The ``serving_config.json`` the validation ``run`` logged, or None (no run, or an older run without it)."""
    import mlflow
    from mlflow.exceptions import MlflowException

    from registry.runs import SERVING_FILE

    if run is None:
        return None
    try:
        return mlflow.artifacts.load_dict(f"{run.info.artifact_uri.rstrip('/')}/{SERVING_FILE}")
    except (MlflowException, OSError, ValueError):
        return None


def _serving_rows(tags: dict, sc: dict | None) -> list[tuple[str, str]]:
    """``engine`` and the serving configuration of the latest validation, for the ``pair show`` table."""
    import shlex

    rows = [("engine", tags.get("engine", f"{DEFAULT_ENGINE} (default)"))]
    if sc is None:
        return rows + [("serving config", "- (logged by a validation)")]
    if sc.get("none"):
        return rows + [("serving config", f"none: {sc['none']}")]
    shown = sc.get("command") or (shlex.join(sc["args"]) if "args" in sc else json.dumps(sc.get("generate_kwargs")))
    rows.append(("serving config", f"{shown}  (k={sc.get('num_speculative_tokens')}, validated)"))
    rows += [("  download first", cmd) for cmd in sc.get("download", [])]
    if sc.get("derived"):
        rows.append(("  derived draft", sc["derived"]))
    return rows


@pair_app.command("engine")
def engine_cmd(
    *,
    name: Annotated[str, typer.Argument(help="Pair registered model.")],
    version: Annotated[str, typer.Argument(help="Pair version the engine serves.")],
    url: Annotated[str, typer.Option("--url", help="The engine's base URL, e.g. http://127.0.0.1:8080 (llama-server).")],
    flags: Annotated[str | None, typer.Option(
        "--flags", help="The command line the engine runs with (recorded each night; a change is named as the likely "
                        "cause of an engine-side drop), e.g. \"llama-server -m t.gguf --spec-draft-model d.gguf ...\".")] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="Engine check requests in flight.")] = 1,
    engine: Annotated[str | None, typer.Option(
        "--engine", help=f"The engine serving at --url: {engines_help(checkable_names())} (tag engine).")] = None,
    tracking_uri: TrackingOpt = None,
) -> None:
    """Name the engine and its endpoint serving a pair version: the nightly then runs the engine check on it.
    User info in --url and the value of --api-key (and other credential options) in --flags are never
    stored or printed: the engine check authenticates with SPECDEC_ENGINE_API_KEY."""
    import shlex

    _quiet_mlflow()
    from registry.pairs import engine_tags, set_engine

    try:
        argv = shlex.split(flags) if flags is not None else None
        tags, dropped = engine_tags(url, argv, concurrency, engine=engine)
        set_engine(name, version, tags=tags, registry=_command_registry(tracking_uri))
    except _user_errors() as e:
        _fail(str(e))
    for what in dropped:
        Console(stderr=True, emoji=False).print(f"[yellow]note:[/] {what}", highlight=False, soft_wrap=True)
    _out().print(f"{name} v{version}: engine check against {tags['engine']} at {tags['engine_url']} each night",
                 highlight=False)


@pair_app.command("promote")
def promote_cmd(
    *,
    name: Annotated[str, typer.Argument(help="Pair registered model.")],
    version: Annotated[str, typer.Argument(help="Pair version to promote.")],
    alias: Annotated[str, typer.Option(help="Alias to move (champion is gated; challenger is not).")] = "champion",
    force: Annotated[bool, typer.Option("--force", help="Move the alias even if the gate fails (needs --reason).")] = False,
    reason: Annotated[str | None, typer.Option(help="Why (required with --force; recorded in tags).")] = None,
    actor: Annotated[str | None, typer.Option(help="Who (default: the OS user).")] = None,
    min_acceptance_rate: Annotated[float | None, typer.Option(
        min=0.0, max=1.0, help="Gate threshold (default: the acceptance policy, SPECDEC_POLICY__THRESHOLD, 0.40).")] = None,
    min_predicted_speedup: Annotated[float | None, typer.Option(help="Gate: minimum predicted speedup (off by default).")] = None,
    tracking_uri: TrackingOpt = None,
) -> None:
    """Move an alias to a pair version if its latest validation passes the gate."""
    _quiet_mlflow()
    from registry.errors import PromotionRefused
    from registry.promotion import promote

    gate = _policy_gate(min_predicted_speedup=min_predicted_speedup)
    if min_acceptance_rate is not None:
        gate = _policy_gate(min_acceptance_rate=min_acceptance_rate, min_predicted_speedup=min_predicted_speedup)
    try:
        res = promote(name, version, alias, force=force, reason=reason, actor=actor, gate=gate,
                      registry=_command_registry(tracking_uri))
    except PromotionRefused as e:
        lines = "\n".join(f"  - {r}" for r in e.reasons)
        _fail(f"refused to move {name}@{alias} to version {version}:\n{lines}\n"
              "Validate this version with the nightly flow (make it the challenger: "
              "`specdec pair promote NAME VERSION --alias challenger`, then `specdec nightly run`), "
              "or use --force --reason '...'.")
    except _user_errors() as e:
        _fail(str(e))
    out = _out()
    prev = f" (was v{res.previous_version})" if res.previous_version else ""
    out.print(f"[green]{name}@{alias}[/] -> version {res.version}{prev}", highlight=False)
    if res.forced:
        out.print(f"[yellow]forced by {res.actor}[/]: {res.reason}; gate said: {'; '.join(res.reasons_overridden)}", highlight=False)
    elif res.gate.run_id:
        out.print(f"gate passed on validation run {res.gate.run_id}", highlight=False)
