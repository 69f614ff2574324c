"""``specdec nightly run|serve`` (entry point ``specdec.cli: nightly``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from flows.settings import NightlySettings

nightly_app = typer.Typer(help="The nightly validation flow (Prefect).", no_args_is_help=True)
err = Console(stderr=True, emoji=False)


def register(app: typer.Typer) -> None:
    """Add the ``nightly`` sub-commands to the ``specdec`` CLI."""
    app.add_typer(nightly_app, name="nightly")
    from flows.watch_cli import watch_cmd
    from registry.cli import pair_app

    pair_app.command("watch")(watch_cmd)  # the pair group's watch: its receiver starts Prefect runs


@nightly_app.command("run")
def run_cmd(
    *,
    pair: Annotated[Optional[list[str]], typer.Option("--pair", help="Pair name (repeatable).")] = None,
    alias: Annotated[Optional[list[str]], typer.Option("--alias", help="Alias to validate (repeatable).")] = None,
    heldout: Annotated[Optional[str], typer.Option(help="Held-out set name or JSONL path.")] = None,
    limit: Annotated[Optional[int], typer.Option(min=1, help="Stratified subset size.")] = None,
    device: Annotated[Optional[str], typer.Option(help="auto | cpu | cuda")] = None,
    batch_size: Annotated[Optional[int], typer.Option(
        "--batch-size", min=1,
        help="Prompts decoded together (default: SPECDEC_NIGHTLY_BATCH_SIZE, else 1). Larger batches raise "
             "throughput on GPUs; on a 2-core CPU batch > 1 mostly adds padding cost.")] = None,
    parallel: Annotated[bool, typer.Option(help="Validate pair versions in parallel on a local Dask cluster.")] = False,
    dask_address: Annotated[Optional[str], typer.Option(help="Existing Dask scheduler (implies --parallel).")] = None,
    ray_address: Annotated[Optional[str], typer.Option(
        help="Run the tasks on Ray instead of Dask (prefect-ray): local | auto | ray://host:port "
             "(default: SPECDEC_NIGHTLY_RAY_ADDRESS).")] = None,
    method: Annotated[Optional[str], typer.Option(help="both | replay | decode (default: SPECDEC_NIGHTLY_METHOD).")] = None,
    shards: Annotated[Optional[int], typer.Option(
        min=1, help="Split each pair's replay over this many tasks (with --parallel: Dask workers); the report "
                    "is the one-process report (docs/scale.md).")] = None,
    continuations: Annotated[Optional[str], typer.Option(
        help="core | engine: the target's greedy continuations from the engine the pair version names "
             "(with --method replay; the target's weights are not loaded for model and n-gram drafters).")] = None,
    fail_on_alert: Annotated[bool, typer.Option(
        "--fail-on-alert", help="Exit 3 when a validation failed the drift rules (CI-style use).")] = False,
    debug: Annotated[bool, typer.Option(
        "--debug", help="Show third-party logs and tracebacks on the terminal (they always go to the log file).")] = False,
) -> None:
    """Run the nightly validation once, now (no schedule needed; Prefect ephemeral mode is fine)."""
    from pydantic import ValidationError

    from flows.settings import NightlySettings, load_settings

    # the settings tree is read once (and a malformed value rejected) before Prefect is imported
    try:
        NightlySettings()
    except ValidationError as e:
        err.print(f"[red]error:[/] invalid nightly settings (SPECDEC_NIGHTLY_* environment): {settings_problems(e)}",
                  highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    try:
        tree = load_settings()
    except ValidationError as e:
        err.print(f"[red]error:[/] invalid settings: {settings_problems(e)}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    s = tree.nightly
    from registry.models import validate_name
    from registry.promotion import check_alias_name

    try:  # every option checked before any work starts
        for a in alias or s.aliases:
            check_alias_name(a, tree.registry.aliases)
        for p in pair or s.pairs:
            validate_name(p)
        check_device(device or s.device)
        check_ray(ray_address or s.ray_address)
    except ValueError as e:
        err.print(f"[red]error:[/] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    ray_address = _reach_cluster(ray_address or s.ray_address, dask_address)
    _check_pairs(tree, pair)
    from specdec import stopping
    from specdec.terminal import ReadableTerminal

    run = NightlyRun(section=s, options={"pairs": pair or None, "aliases": alias or None, "heldout": heldout,
                                         "limit": limit, "device": device, "batch_size": batch_size,
                                         "method": method, "shards": shards, "continuations": continuations},
                     parallel=parallel or bool(dask_address), dask_workers=s.dask_workers, dask_address=dask_address,
                     ray_address=ray_address)
    # SIGTERM or a second Ctrl-C: now; a first Ctrl-C: after the current prompt. One line, exit 143 / 130;
    # Prefect's TerminationSignal raised by its own handler inside the flow is the same stop
    with stopping.stoppable(_stopped_line, kept="history claims still held are taken over by the next run"):
        with ReadableTerminal(str(tree.home), "nightly", debug=debug) as term:
            err.print(f"[dim]log file: {term.log_path}[/]", soft_wrap=True)
            _run(tree, run, term, fail_on_alert=fail_on_alert)


def _check_pairs(tree, pairs: list[str] | None) -> None:
    """One line and exit 1 when a pair named with ``--pair`` is not registered (with the closest registered name),
    before any flow starts (:func:`registry.pairs.check_pairs_exist`). Only a store that opens is asked: a history
    store or registry that cannot be opened (read-only or full disk, a newer schema, a server down) is left to the
    night, which reports it in its own one line."""
    if not pairs:
        return
    from monitoring.db import connect
    from registry.errors import PairNotFound
    from registry.pairs import check_pairs_exist
    from registry.service import Registry

    try:
        connect(tree.monitoring).dispose()
        check_pairs_exist(list(pairs), registry=Registry(tree.registry))
    except PairNotFound as e:
        err.print(f"[red]error:[/] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    except Exception:  # noqa: BLE001 (the night meets the same fault and says it in one line)
        logging.getLogger("flows.cli").debug("pair check skipped", exc_info=True)


def _reach_cluster(ray_address: str | None, dask_address: str | None) -> str | None:
    """The Ray address the run uses (:func:`flows.cluster.check_cluster`), or one line and exit 1 when the named
    cluster is not there (``auto`` with none, or no answer within :data:`flows.cluster.CONNECT_TIMEOUT_S` s)."""
    from flows.cluster import ClusterUnreachable, check_cluster

    try:
        return check_cluster(ray_address, dask_address)
    except ClusterUnreachable as e:
        err.print(f"[red]error:[/] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


def check_ray(address: str | None) -> None:
    """Raises ValueError (one line) when ``address`` asks for Ray and ``prefect-ray`` is not installed."""
    import importlib.util

    if address and importlib.util.find_spec("prefect_ray") is None:
        raise ValueError(f"--ray-address {address}: the Ray task runner needs prefect-ray: pip install 'specdec[ray]'")


def check_device(device: str) -> str:
    """``device`` if it is ``auto``, ``cpu``, ``cuda`` or ``cuda:N``; else ValueError (before any model loads)."""
    import re

    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device or ""):
        raise ValueError(f"unknown --device {device!r}: use auto, cpu, cuda or cuda:N")
    return device


def _stopped_line(text: str) -> None:
    head, _, rest = text.partition(":")
    err.print(f"[red]{head}:[/]{rest}", highlight=False, soft_wrap=True)


def _flow_failed(e: Exception, term) -> None:
    """One line for the exception that ended the flow run; exit 2 for settings, else 1."""
    from pydantic import ValidationError

    if isinstance(e, ValidationError):  # settings read inside the flow (rules, channels, policy)
        err.print(f"[red]error:[/] invalid settings: {settings_problems(e)}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    err.print(f"[red]error:[/] {type(e).__name__}: {e}  (details: {term.log_path})", soft_wrap=True)
    raise typer.Exit(1) from None


def settings_problems(e) -> str:
    """A pydantic ``ValidationError`` of settings as one line: ``NAME: message (got 'value')``; the value
    is left out where the model hides its input (secrets)."""
    shown = "input_value=" in str(e)  # pydantic's own text leaves inputs out under hide_input_in_errors

    def one(er) -> str:
        got = f" (got {er['input']!r})" if shown and "input" in er and not isinstance(er["input"], dict) else ""
        return f"{'.'.join(str(x) for x in er['loc'])}: {er['msg']}{got}"

    return "; ".join(one(er) for er in e.errors())


def _private_prefect_api(tree, lease):
    """A private Prefect API that dies with this process, state kept under ``<home>/prefect`` (unless
    ``PREFECT_HOME`` says otherwise); its UI is off, run logs go to our log file. Recorded in ``lease``
    so a killed run's server is reaped."""
    import os

    from flows.prefect_api import PrefectAPI
    from flows.recovery import process_create_time

    prefect_home = (tree.prefect.home or tree.home / "prefect").expanduser()
    # Prefect's own settings, configured at this edge before Prefect reads them (it reads the environment)
    os.environ["PREFECT_HOME"] = str(prefect_home)
    prefect_home.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PREFECT_LOGGING_TO_API_ENABLED", "false")
    api = PrefectAPI(tree.home / "logs" / "prefect-server.log", prefect_home=prefect_home).start()
    lease.server_pid = api.proc.pid
    lease.server_create_time = process_create_time(api.proc.pid)
    lease.save()
    return api


def _print_results(results, policy) -> None:
    from flows.summary import acceptance_cell

    t = Table("pair", "alias", "version", "verdict", "acceptance rate [95% CI] at k (α)", "speedup [95% CI]", "alert")
    t.add_column("hint", overflow="fold", max_width=100)  # a long message wraps; the table stays readable in a log
    for r in results:
        acc = acceptance_cell(r)
        sci = r.speedup_ci
        speed = (f"{r.speedup:.2f}x" + (f" [{sci[0]:.2f}, {sci[1]:.2f}]" if len(sci) == 2 else "")
                 if r.speedup is not None else "-")
        t.add_row(r.pair, r.alias, r.version or "-", r.status, acc, speed, r.alert_transition or "-",
                  r.root_cause_hint or r.message or "")
    out = Console(width=min(Console().width, 200))  # readable in a log: no line over 200 columns
    out.print(t)
    out.print(f"[dim]{policy.describe()}[/]")


@dataclass(frozen=True)
class NightlyRun:
    """What ``specdec nightly run`` runs: the nightly section (``SPECDEC_NIGHTLY_*``) with the command's
    options over it, and the flow's task runner.

    Attributes:
        section: :class:`flows.settings.NightlySettings`.
        options: flow parameters given on the command line (None: not given, the section's value holds).
        parallel / dask_workers / dask_address / ray_address: the task runner (:func:`flows.nightly.nightly_flow_for`).
    """

    section: NightlySettings
    options: dict[str, Any]
    parallel: bool = False
    dask_workers: int = 2
    dask_address: str | None = None
    ray_address: str | None = None
    method: str = "both"
    shards: int = 1
    continuations: str = "core"

    def parameters(self) -> dict:
        """The flow's parameters: :meth:`flows.nightly.NightlyJob.from_settings`, the same mapping as
        ``nightly serve`` and the deployments (imports Prefect: call it once its API is configured)."""
        from flows.nightly import NightlyJob

        return NightlyJob.from_settings(self.section, **self.options).parameters()


def _run(tree, run: NightlyRun, term, *, fail_on_alert: bool) -> None:
    """The nightly flow run of ``run`` with the settings ``tree``, on a private Prefect API unless
    ``PREFECT_API_URL`` names one; then the results table and the exit code."""
    from flows.recovery import NightlyLease, crash_dead_flow_runs, reap_dead_leases
    from flows.settings import using

    home = tree.home
    lease = NightlyLease.mine(home)
    dead = reap_dead_leases(home)  # servers left by a killed nightly (where the kernel did not stop them)
    api = None
    try:
        if not tree.prefect.api_url:
            api = _private_prefect_api(tree, lease)
        from flows.nightly import nightly_flow_for

        import torch  # noqa: F401 (its log handlers exist before the terminal filter is applied)

        term.refresh()
        try:
            import torchao  # noqa: F401 (CUDA-extension load warnings go to the log file now)
        except ImportError:
            pass
        term.refresh()
        if dead:
            crash_dead_flow_runs(home, dead)
        flow = nightly_flow_for(parallel=run.parallel, dask_workers=run.dask_workers, dask_address=run.dask_address,
                                ray_address=run.ray_address)
        try:
            with using(tree):  # the flow runs with this command's settings, read once
                results = flow(**run.parameters())
        except Exception as e:  # noqa: BLE001 (the command's last resort: one line, details in the log file; registry/monitoring errors carry clear messages)
            logging.getLogger("flows.cli").debug("nightly run failed", exc_info=True)
            if term.debug:
                err.print_exception()
            _flow_failed(e, term)
    finally:
        if api is not None:
            try:  # send buffered run logs while the API is still up (else "Error logging to API")
                from prefect.logging.handlers import APILogHandler

                APILogHandler.flush()
            except Exception:  # noqa: BLE001 (shutting down: a log flush that fails must not hide the run's outcome)
                pass
            api.stop()
        lease.release()
    _report(results, tree.policy, fail_on_alert)


def _report(results, policy, fail_on_alert: bool) -> None:
    """The results table and the exit code of ``nightly run`` (1 error, 4 nothing validated, 3 --fail-on-alert)."""
    from specdec.stopping import check

    check()  # a stop the flow engine dropped after the flow body returned still stops with 143
    _print_results(results, policy)
    unlogged = [r for r in results if r.history_run_id is not None and not r.mlflow_run_id]
    for r in unlogged:  # e.g. MLflow refused the write: the row stays pending, and says so
        err.print(f"[red]error:[/] {r.pair}@{r.alias} v{r.version}: recorded in the history (run {r.history_run_id}) "
                  "but not logged to MLflow (reason in the log); it is retried on the next run", highlight=False)
    if any(r.status == "error" for r in results) or unlogged:
        raise typer.Exit(1)
    if any(r.status == "already-running" for r in results) and not any(r.history_run_id for r in results):
        err.print("[yellow]nothing validated:[/] another run holds the claim (already-running); exit 4")
        raise typer.Exit(4)
    if fail_on_alert and any(r.status == "failed" for r in results):
        err.print("[red]a validation failed the drift rules[/] (--fail-on-alert)")
        raise typer.Exit(3)


@nightly_app.command("serve")
def serve_cmd() -> None:
    """Serve the nightly deployment on its cron schedule (needs `prefect server start`)."""
    from pydantic import ValidationError

    from flows.deploy import serve_nightly
    from flows.settings import NightlySettings

    try:
        section = NightlySettings()  # this command's read of SPECDEC_NIGHTLY_*
    except ValidationError as e:
        err.print(f"[red]error:[/] invalid nightly settings (SPECDEC_NIGHTLY_* environment): {settings_problems(e)}",
                  highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    serve_nightly(section)
