"""``specdec ingest prometheus|metrics|serve`` (entry point ``specdec.cli: ingest``).

One window of production acceptance, now::

    specdec ingest prometheus --url http://prometheus:9090 --pair specdec-pair --alias champion
    specdec ingest metrics --url http://vllm:8000/metrics --pair specdec-pair   # since the last scrape

Sources and mappings can also come from ``SPECDEC_PRODUCTION_SOURCES`` / ``..._MAPPINGS``
(:mod:`monitoring.production.settings`); ``--pair`` adds a mapping for this call.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from monitoring.production.settings import ENGINE_NAMES
from specdec.engines.profiles import DEFAULT_ENGINE, engines_help

ingest_app = typer.Typer(help="Ingest a serving engine's speculative-decoding counters (production acceptance).",
                         no_args_is_help=True)
err = Console(stderr=True, emoji=False)
out = Console()

Url = Annotated[str, typer.Option("--url", help="Prometheus base URL, or the engine's /metrics URL.")]
Engine = Annotated[str, typer.Option("--engine", help=f"{engines_help(ENGINE_NAMES)} (which metric names to read).")]
Source = Annotated[Optional[str], typer.Option("--source", help="Source name (default: the engine name).")]
Pair = Annotated[Optional[str], typer.Option("--pair", help="Registered pair serving these models (adds a mapping).")]
Alias = Annotated[str, typer.Option("--alias", help="Alias production serves.")]
Version = Annotated[Optional[str], typer.Option("--version", help="Pin the pair version (else resolved from the alias).")]
Model = Annotated[str, typer.Option("--model", help="Model label value the mapping applies to ('*' = any).")]
K = Annotated[Optional[int], typer.Option("--num-speculative-tokens", min=1,
                                          help="k, when the engine does not export per-position counters.")]
DbUrl = Annotated[Optional[str], typer.Option("--db-url", help="Override SPECDEC_DB_URL.")]
NoAlert = Annotated[bool, typer.Option("--no-alert", help="Record and evaluate, but change no incident.")]
Plot = Annotated[Optional[Path], typer.Option("--plot", help="Write each pair's acceptance trend PNG into this directory.")]


def register(app: typer.Typer) -> None:
    """Add the ``ingest`` sub-commands to the ``specdec`` CLI."""
    app.add_typer(ingest_app, name="ingest")


@dataclass(frozen=True)
class IngestRequest:
    """One ``specdec ingest`` call: the source (``kind`` ``prometheus`` | ``metrics``, ``url``, ``engine``,
    ``source`` name, PromQL ``selector``), the mapping it adds (``pair``, ``alias``, ``version``,
    ``model``, ``k``), the store (``db_url``), ``no_alert``, ``plot`` and the window (``start``, ``end``;
    None for a ``metrics`` scrape: since the previous one)."""

    kind: str
    url: str
    engine: str
    source: str | None = None
    selector: str = ""
    pair: str | None = None
    alias: str = "champion"
    version: str | None = None
    model: str = "*"
    k: int | None = None
    db_url: str | None = None
    no_alert: bool = False
    plot: Path | None = None
    start: dt.datetime | None = None
    end: dt.datetime | None = None


def _settings(req: IngestRequest, ps):
    """The production section ``ps`` (read by the command) with this call's source and mapping added."""
    from pydantic import ValidationError

    from monitoring.production.settings import ProductionMapping, ProductionSource

    try:
        ps = ps.model_copy(deep=True)
        name = req.source or req.engine
        src = ProductionSource(name=name, kind=req.kind, url=req.url, engine=req.engine, selector=req.selector)
        ps.sources = [s for s in ps.sources if s.name != name] + [src]
        if req.pair:
            ps.mappings = [ProductionMapping(source=name, model=req.model, pair=req.pair, alias=req.alias,
                                             version=req.version, num_speculative_tokens=req.k)] + list(ps.mappings)
    except ValidationError as e:
        _invalid(e)
    if not ps.mappings:
        err.print("[yellow]warning:[/] no (source, model) -> pair mapping: pass --pair, or set "
                  "SPECDEC_PRODUCTION_MAPPINGS; models are reported but not recorded")
    return ps, src


def _invalid(e, section: str = "production") -> None:
    from specdec.settings.home import settings_error_line

    err.print(f"[red]error:[/] invalid {section} settings: {settings_error_line(e)}")
    raise typer.Exit(2) from None


def _production_settings():
    """The production section, read once by the command (a malformed one: one line, exit 2)."""
    from pydantic import ValidationError

    from monitoring.production.settings import get_production_settings

    try:
        return get_production_settings()
    except ValidationError as e:
        _invalid(e)


def _registry_settings():
    """The registry section, read once by the command: where the mappings' aliases are resolved (a malformed
    one: one line, exit 2)."""
    from pydantic import ValidationError

    from registry.settings import get_settings

    try:
        return get_settings()
    except ValidationError as e:
        _invalid(e, "registry")


def _run(req: IngestRequest, ps) -> None:
    """Ingest the window of ``req`` with the production section ``ps``; print it; exit 1 when refused."""
    from sqlalchemy.exc import SQLAlchemyError

    from flows.production_lib import version_resolver
    from specdec.validation.provenance import code_version
    from monitoring.cli import open_store
    from monitoring.production.ingest import ingest_window
    from monitoring.production.sources import ProductionSourceError

    ps, src = _settings(req, ps)
    ms, db = open_store(req.db_url, upgrade=True)
    try:
        outcomes = ingest_window(db, src, req.start, req.end, settings=ps, monitoring_settings=ms,
                                 resolve_version=version_resolver(_registry_settings()), alert=not req.no_alert,
                                 code_version=code_version())
    except ProductionSourceError as e:
        err.print(f"[red]error:[/] {e}")
        raise typer.Exit(1) from None
    except ValueError as e:
        err.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from None
    except SQLAlchemyError as e:
        err.print(f"[red]error:[/] history store: {type(e).__name__}")
        raise typer.Exit(1) from None
    if not outcomes:
        err.print(f"[red]error:[/] no {req.engine} speculative-decoding series found in this window "
                  f"(check --engine, --url and the selector)")
        raise typer.Exit(1)
    _print(outcomes)
    refused = any(o.status == "refused" for o in outcomes)
    if req.plot is not None:
        from flows.production_lib import write_trend_plots

        for p, path in write_trend_plots(sorted({o.pair for o in outcomes if o.pair}), req.plot, ms).items():
            out.print(f"trend of {p}: {path}")
    db.dispose()
    if refused:
        raise typer.Exit(1)


def _print(outcomes) -> None:
    t = Table("source", "model", "pair", "window (UTC)", "drafts", "draft tokens", "acceptance [95% CI]",
              "mean len", "resets", "status", "vs nightly", "alerts", title="production acceptance")
    for o in outcomes:
        win = f"{o.start:%m-%d %H:%M:%S}–{o.end:%H:%M:%S}" if o.start and o.end else "-"
        ci = o.acceptance_rate_ci
        acc = "-" if o.acceptance_rate is None else (
            f"{o.acceptance_rate:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if len(ci) == 2 else f"{o.acceptance_rate:.3f}")
        alerts = ", ".join(f"{w}: {x}" for w, x in (("health", o.health_transition),
                                                    ("representativeness", o.representativeness_transition)) if x)
        t.add_row(o.source, o.model or "-", f"{o.pair}@{o.alias} v{o.version}" if o.pair else "-", win,
                  "-" if o.num_drafts is None else str(o.num_drafts),
                  "-" if o.num_draft_tokens is None else str(o.num_draft_tokens), acc,
                  "-" if o.mean_accepted_length is None else f"{o.mean_accepted_length:.2f}", str(o.resets),
                  o.status, o.representativeness or "-", alerts or "-")
    out.print(t)
    for o in outcomes:
        if o.message and o.status in ("failed", "unmapped", "baseline") or o.representativeness == "firing":
            out.print(f"{o.source}/{o.model or '-'}: {o.message}")
        elif o.status == "refused":
            from rich.markup import escape

            err.print(f"[red]error:[/] {escape(f'{o.source}/{o.model or chr(45)}: {o.message}')}", highlight=False)


def _parse_end(end: str | None, settle: float) -> dt.datetime:
    if end is None:
        from flows.production_lib import window_end_of_run

        return window_end_of_run(settle, now=dt.datetime.now(dt.timezone.utc))
    try:
        t = dt.datetime.fromisoformat(end.replace("Z", "+00:00"))
    except ValueError:
        err.print(f"[red]error:[/] --end {end!r} is not an ISO-8601 time (e.g. 2026-12-01T10:15:00Z)")
        raise typer.Exit(2) from None
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


@ingest_app.command("prometheus")
def prometheus_cmd(
    *,
    url: Url, engine: Engine = DEFAULT_ENGINE, source: Source = None,
    selector: Annotated[str, typer.Option("--selector", help='Extra PromQL label matchers, e.g. job="vllm".')] = "",
    window: Annotated[Optional[float], typer.Option("--window", min=0.01, help="Window length in minutes "
                                                    "(default SPECDEC_PRODUCTION_WINDOW_MINUTES, 15).")] = None,
    end: Annotated[Optional[str], typer.Option("--end", help="Window end, ISO-8601 (default: now floored to the "
                                               "minute minus --settle seconds).")] = None,
    settle: Annotated[float, typer.Option("--settle", min=0, help="Seconds the default end stays behind now.")] = 60.0,
    pair: Pair = None, alias: Alias = "champion", version: Version = None, model: Model = "*", k: K = None,
    db_url: DbUrl = None, no_alert: NoAlert = False, plot: Plot = None,
) -> None:
    """Ingest one window from a Prometheus server's HTTP query API (reset-aware counter deltas)."""
    ps = _production_settings()
    t_end = _parse_end(end, settle)
    minutes = window if window is not None else ps.window_minutes
    _run(IngestRequest("prometheus", url, engine, source, selector, pair, alias, version, model, k, db_url, no_alert,
                       plot, t_end - dt.timedelta(minutes=minutes), t_end), ps)


@ingest_app.command("metrics")
def metrics_cmd(
    *,
    url: Url, engine: Engine = DEFAULT_ENGINE, source: Source = None,
    pair: Pair = None, alias: Alias = "champion", version: Version = None, model: Model = "*", k: K = None,
    db_url: DbUrl = None, no_alert: NoAlert = False, plot: Plot = None,
) -> None:
    """Scrape the engine's /metrics now; the window runs from the previous scrape of this source
    (the first scrape only stores the baseline)."""
    _run(IngestRequest("metrics", url, engine, source, "", pair, alias, version, model, k, db_url, no_alert, plot),
         _production_settings())


@ingest_app.command("serve")
def serve_cmd() -> None:
    """Serve the production-acceptance flow on its cron (SPECDEC_PRODUCTION_CRON; needs a Prefect server)."""
    from flows.production import production_acceptance_flow
    from monitoring.production.settings import get_production_settings

    ps = get_production_settings()
    production_acceptance_flow.serve(name=ps.deployment_name, cron=ps.cron, tags=["specdec", "production"],
                                     description="Ingest production speculative-decoding counters every window.")
