"""``specdec history``, ``specdec alerts test``, ``specdec db upgrade`` (typer + rich).

Registered through the ``specdec.cli`` entry point ``monitoring = "monitoring.cli:register"``.
Heavy imports (SQLAlchemy, httpx) happen inside the commands so ``specdec --help`` stays fast.
"""

from __future__ import annotations

import math
from typing import Optional

import typer
from rich.console import Console

err = Console(stderr=True, emoji=False)
out = Console()

alerts_app = typer.Typer(help="Alert channels (Slack / generic webhook).", no_args_is_help=True)
db_app = typer.Typer(help="The monitoring history store (SQL, Alembic migrations).", no_args_is_help=True)

SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float | None], lo: float = 0.0, hi: float = 1.0) -> str:
    """Unicode sparkline of ``values`` on a fixed ``[lo, hi]`` scale; ``None``/NaN shown as ``·``."""
    chars = []
    for v in values:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            chars.append("·")
            continue
        x = min(max((v - lo) / (hi - lo), 0.0), 1.0)
        chars.append(SPARK[min(int(x * len(SPARK)), len(SPARK) - 1)])
    return "".join(chars)


def _settings(db_url: str | None):
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from monitoring.settings import get_settings

    try:
        return get_settings(**({"db_url": db_url} if db_url else {}))
    except SettingsError as e:  # e.g. SPECDEC_ALERT_CHANNELS is not valid JSON
        err.print(f"[red]invalid monitoring settings:[/red] {e} (check the SPECDEC_* environment variables; "
                  "SPECDEC_ALERT_CHANNELS must be a JSON list)")
        raise typer.Exit(code=1)
    except ValidationError as e:
        from monitoring.redact import redact_text
        from specdec.settings.home import settings_error_line

        err.print(f"[red]invalid monitoring settings:[/red] {redact_text(settings_error_line(e))}", soft_wrap=True)
        raise typer.Exit(code=1)


def open_store(db_url: str | None, *, upgrade: bool):
    """(settings, connected history store) for ``db_url``; a readable error and exit 1 if unreachable."""
    from sqlalchemy.exc import SQLAlchemyError

    from monitoring.db import connect
    from monitoring.redact import redact_db_url, redact_text

    settings = _settings(db_url)
    try:
        return settings, connect(settings, upgrade=upgrade)
    except SQLAlchemyError as e:
        msg = redact_text(str(getattr(e, "orig", e))).replace(settings.db_url, redact_db_url(settings.db_url))
        err.print(f"[red]cannot open history store {redact_db_url(settings.db_url)}:[/red] {msg}")
        raise typer.Exit(code=1)


def _f(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def history_cmd(
    pair: Optional[str] = typer.Option(None, "--pair", help="Only this pair (registered model name)."),
    limit: int = typer.Option(20, "--limit", min=1, help="Most recent runs to show."),
    source: Optional[str] = typer.Option(None, "--source", help="Only 'nightly' (held-out validations), "
                                         "'production' (serving-engine counter windows), 'engine' (every engine check) or "
                                         "'engine:<engine>' (one engine's, e.g. engine:llamacpp); default all."),
    db_url: Optional[str] = typer.Option(None, "--db-url", help="Override SPECDEC_DB_URL."),
) -> None:
    """Table of past validation runs (nightly and production) with an acceptance-rate trend per pair."""
    from monitoring import history

    try:
        source_col, engine = history.parse_source_label(source) if source is not None else (None, None)
    except ValueError as e:
        err.print(f"[red]--{e}[/red]")
        raise typer.Exit(code=2)
    missing = _missing_sqlite_file(db_url or _settings(None).db_url)
    if missing is not None:  # reading never creates a store: a mistyped --db-url is said so, not made
        if db_url:
            err.print(f"[red]no history store at {missing}[/red] (--db-url names a SQLite file that does not exist)",
                      highlight=False, soft_wrap=True)
            raise typer.Exit(code=1)
        err.print("no validation runs recorded (no history store yet)")
        raise typer.Exit(code=0)
    _, db = open_store(db_url, upgrade=True)
    runs = history.list_runs(db, pair_name=pair, limit=limit, source=source_col, engine=engine)
    if not runs:
        err.print("no validation runs recorded" + (f" for pair {pair!r}" if pair else ""))
        raise typer.Exit(code=0)
    _print_history_table(runs)
    by_pair: dict[tuple[str, str], list] = {}
    for r in reversed(runs):  # oldest first for the trend
        by_pair.setdefault((r.pair_name, history.source_label(r.source, r.engine)), []).append(r)
    for (name, src), rows in by_pair.items():
        values = [r.acceptance_rate for r in rows]
        last = next((v for v in reversed(values) if v is not None), None)
        label = name if src == "nightly" else f"{name} ({src})"
        out.print(f"acceptance trend {label}: {sparkline(values)}  (0..1 scale, oldest→newest, last {_f(last)})")
        speeds = [r.speedup for r in rows]
        if any(v is not None for v in speeds):
            last = next((v for v in reversed(speeds) if v is not None), None)
            scaled = [None if v is None else min(max(v / 2.0, 0.0), 1.0) for v in speeds]
            out.print(f"speedup trend    {label}: {sparkline(scaled)}  (0..2x scale, oldest→newest, last "
                      f"{_f(last, 2)}x)")


_COLUMNS = ("run", "date", "source", "pair", "alias", "held-out", "k", "acceptance rate (95% CI)", "per-token α",
            "α_tf", "tok/step", "speedup (95% CI)", "load/CPU", "verdict", "mlflow")
_DETAIL = ("source", "held-out", "α_tf", "tok/step", "load/CPU", "mlflow")  # the columns a narrow terminal leaves out


def _print_history_table(runs) -> None:
    """The ``history`` table of ``runs``; below 200 columns without the :data:`_DETAIL` columns (said below it)."""
    from rich import box
    from rich.table import Table

    narrow = out.width < 200
    table = Table(title="specdec validation history", show_lines=False, **({"box": box.SIMPLE_HEAD} if narrow else {}))
    cols = [c for c in _COLUMNS if not (narrow and c in _DETAIL)]
    for col in cols:
        table.add_column(col, justify="right" if col in ("run", "k", "per-token α", "α_tf", "tok/step", "load/CPU") else "left",
                         overflow="fold", no_wrap=col in ("run", "date", "pair", "alias", "acceptance rate (95% CI)", "per-token α", "verdict"))
    for r in runs:
        cells = dict(zip(_COLUMNS, _history_cells(r)))
        table.add_row(*(cells[c] for c in cols))
    out.print(table)
    for r in runs:  # a crashed run says why below the table (its row has no numbers to show)
        if r.status == "crashed":
            out.print(f"run {r.id} crashed: {r.error}", highlight=False, soft_wrap=True)
    if narrow:
        out.print(f"[dim]{', '.join(_DETAIL)} left out below 200 columns (COLUMNS=200 shows them)[/]", highlight=False)


def _history_cells(r) -> tuple[str, ...]:
    """One history row's cells, in :data:`_COLUMNS` order (the held-out cell: ``<held-out>@<version>``, an engine
    check's ``engine:<engine>:<held-out>@<version>``, a production window's ``<source>:<model> HH:MM-HH:MM``)."""
    from monitoring.db import ENGINE, PRODUCTION
    from monitoring.history import source_label

    style = {"passed": "green", "failed": "red", "inconclusive": "yellow", "error": "magenta", "crashed": "magenta"}
    ci = (f" ({_f(r.acceptance_rate_ci_low)}-{_f(r.acceptance_rate_ci_high)})"
          if r.acceptance_rate_ci_low is not None else "")
    st = style.get(r.status)
    prod = r.source == PRODUCTION
    source = source_label(r.source, r.engine)
    when = f"{r.window_end:%Y-%m-%d %H:%M}" if prod and r.window_end else r.scheduled_date.isoformat()
    heldout = (f"{r.production_source}:{r.heldout_name} {r.window_start:%H:%M}-{r.window_end:%H:%M}"
               if prod and r.window_start and r.window_end else
               f"{source}:{r.heldout_name}@{r.heldout_version}" if r.source == ENGINE else
               f"{r.heldout_name}@{r.heldout_version}")
    return (str(r.id), when, source, f"{r.pair_name} v{r.pair_version}", r.alias or "",
            heldout, str(r.num_speculative_tokens or "-"),
            f"{_f(r.acceptance_rate)}{ci}", _f(r.per_token_acceptance), _f(r.alpha_tf), _f(r.draft_tokens_per_step, 2),
            _speedup_cell(r), _f(r.load_avg_1m / r.num_cpus, 2) if r.load_avg_1m is not None and r.num_cpus else "-",
            f"[{st}]{r.status}[/{st}]" if st else r.status,
            "-" if prod else ("yes" if r.mlflow_logged else "[yellow]pending[/yellow]"))


def _missing_sqlite_file(url: str) -> str | None:
    """The path of a SQLite history store that does not exist yet, else None (another database, or in memory)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        u = make_url(url)
    except (ArgumentError, ValueError):
        return None  # open_store says what is wrong with it
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return None
    from pathlib import Path

    return None if Path(u.database).expanduser().exists() else u.database


def _speedup_cell(r) -> str:
    """``1.21x (1.12-1.30)``, red when the CI lies below 1.0."""
    if r.speedup is None:
        return "-"
    ci = (f" ({_f(r.speedup_ci_low, 2)}-{_f(r.speedup_ci_high, 2)})" if r.speedup_ci_low is not None else "")
    cell = f"{r.speedup:.2f}x{ci}"
    return f"[red]{cell}[/red]" if r.speedup_ci_high is not None and r.speedup_ci_high < 1.0 else cell


@alerts_app.command("test")
def alerts_test(
    timeout: Optional[float] = typer.Option(None, help="Per-request timeout in seconds."),
) -> None:
    """Send a test message to every configured channel; exit 1 if any delivery fails."""
    from monitoring.alerts import send_test

    import math

    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        err.print(f"[red]error:[/red] --timeout must be a positive number of seconds, got {timeout}", highlight=False)
        raise typer.Exit(code=2)
    settings = _settings(None)
    if timeout is not None:
        settings.delivery.timeout_s = timeout
    if not settings.alert_channels:
        err.print("[red]no alert channels configured[/red]: set SPECDEC_ALERT_CHANNELS, e.g. "
                  "'[{\"type\": \"slack\", \"url\": \"https://hooks.slack.com/services/...\"}]'")
        raise typer.Exit(code=1)
    failed = 0
    for channel, result in send_test(settings):
        if result.ok:
            out.print(f"[green]ok[/green]   {channel.display}: HTTP {result.status_code} "
                      f"after {result.attempts} attempt(s)")
        else:
            failed += 1
            err.print(f"[red]FAIL[/red] {channel.display}: {result.error} after {result.attempts} attempt(s)")
    if failed:
        raise typer.Exit(code=1)


@db_app.command("upgrade")
def db_upgrade(
    revision: str = typer.Argument("head", help="Target Alembic revision."),
    db_url: Optional[str] = typer.Option(None, "--db-url", help="Override SPECDEC_DB_URL."),
) -> None:
    """Create or migrate the history tables (Alembic) to ``revision``."""
    from sqlalchemy.exc import SQLAlchemyError

    from monitoring.redact import redact_db_url

    settings, db = open_store(db_url, upgrade=False)
    try:
        db.upgrade(revision)
    except SQLAlchemyError as e:
        why = str(e) if type(e).__name__ == "SchemaTooNew" else type(e).__name__  # its text is safe and says what to do
        err.print(f"[red]migration failed on {redact_db_url(settings.db_url)}:[/red] {why}")
        raise typer.Exit(code=1)
    out.print(f"history store {redact_db_url(settings.db_url)} at revision {db.current_revision()}")


@db_app.command("current")
def db_current(db_url: Optional[str] = typer.Option(None, "--db-url", help="Override SPECDEC_DB_URL.")) -> None:
    """Print the Alembic revision of the history store (``None`` when empty)."""
    from monitoring.redact import redact_db_url

    settings, db = open_store(db_url, upgrade=False)
    out.print(f"{redact_db_url(settings.db_url)}: {db.current_revision()}")


def register(app: typer.Typer) -> None:
    """Add ``history``, ``alerts`` and ``db`` to the ``specdec`` CLI."""
    app.command("history")(history_cmd)
    app.add_typer(alerts_app, name="alerts")
    app.add_typer(db_app, name="db")
