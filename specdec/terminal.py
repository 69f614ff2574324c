"""A readable terminal for long-running commands.

Everything is logged to a file (``<SPECDEC_HOME>/logs/<command>-<UTC time>.log``, DEBUG, tracebacks
included). The terminal shows our messages: records of ``flows``, ``monitoring``, ``registry``,
``specdec`` and of the flow/task run loggers (INFO and up, Prefect's own state chatter dropped),
and other libraries' records only at ERROR. Tracebacks are replaced on the terminal by a pointer to
the log file. ``debug=True`` (``--debug``) leaves the terminal as the libraries configured it.
Progress bars of MLflow artifact downloads and Hugging Face loads are switched off.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import re
import sys
import warnings
from pathlib import Path

from specdec.redact import MaskUserinfoFilter, MaskUserinfoFormatter

OURS = ("flows", "monitoring", "registry", "specdec", "prefect.flow_runs", "prefect.task_runs")
_ENGINE_CHATTER = re.compile(r"^(Finished in state|Beginning |Created |Executing |Submitting |Starting temporary "
                             r"server|Stopping temporary server|Running flow|View at )")


# the flow engine's own report of the exception that ended a flow run (the command reports it in one line)
_ENGINE_FAILURE = re.compile(r"^(Encountered exception during execution|Finished in state Failed)")


def quiet_env() -> None:
    """Environment that turns third-party progress bars off (call before importing them)."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TQDM_DISABLE", "1")


class _TerminalFilter(logging.Filter):
    def __init__(self, log_path: Path) -> None:
        super().__init__()
        self.log_path = log_path

    def filter(self, record: logging.LogRecord) -> bool:
        ours = record.name.startswith(OURS)
        if not ours and record.levelno < logging.ERROR:
            return False
        if record.name.startswith("prefect.") and record.levelno < logging.WARNING:
            if _ENGINE_CHATTER.match(str(record.msg)):
                return False
        if record.name.startswith(("prefect.flow_runs", "prefect.task_runs")) and _ENGINE_FAILURE.match(str(record.msg)):
            return False  # the command prints the error itself, once (a settings error appeared twice)
        if record.exc_info or record.exc_text or record.stack_info:
            record.exc_info, record.exc_text, record.stack_info = None, None, None
            record.msg = f"{record.getMessage()} (traceback in {self.log_path})"
            record.args = ()
        if not ours:  # another library's error: its first line (SQL and parameters stay in the log file)
            first, _, rest = record.getMessage().partition("\n")
            if rest:
                record.msg, record.args = f"{first} (details in {self.log_path})", ()
        return True


def _terminal_handlers() -> list[logging.Handler]:
    out = []
    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    for lg in loggers:
        for h in lg.handlers:
            stream = getattr(h, "stream", None)
            if isinstance(h, logging.FileHandler):
                continue
            # MLflow's handler writes through its own stream object (MlflowLoggingStream) to sys.stderr
            if (stream in (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__) or "Console" in type(h).__name__
                    or "LoggingStream" in type(stream).__name__):
                out.append(h)
    return out


class ReadableTerminal:
    """Context manager: install the log file and the terminal filter; re-applied by :meth:`refresh`
    after libraries that add their own handlers were imported (Prefect, torch, torchao)."""

    def __init__(self, home: Path | str, command: str, debug: bool = False) -> None:
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        self.log_path = Path(home) / "logs" / f"{command}-{stamp}-{os.getpid()}.log"
        self.debug = debug
        self.file_handler: logging.FileHandler | None = None
        self.console_handler: logging.Handler | None = None
        self.filter = _TerminalFilter(self.log_path)
        self.redact = MaskUserinfoFilter()

    def __enter__(self) -> "ReadableTerminal":
        quiet_env()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.file_handler = logging.FileHandler(self.log_path, encoding="utf-8")
        self.file_handler.setLevel(logging.DEBUG)
        # every line of every library's logger is redacted (httpx wrote the tracking
        # URI's password with each request URL)
        self.file_handler.setFormatter(MaskUserinfoFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.captureWarnings(True)
        if not self.debug:
            warnings.simplefilter("default")
        self.refresh()
        return self

    def refresh(self) -> None:
        """Attach the file handler to every logger that does not propagate to the root, and the
        terminal filter to every terminal handler (call after heavy imports)."""
        root = logging.getLogger()
        if self.file_handler not in root.handlers:
            root.addHandler(self.file_handler)
        if not any(h in root.handlers for h in _terminal_handlers()):
            # nothing prints to the terminal otherwise (Prefect configures only its own loggers here):
            # progress and our warnings would reach the log file only
            console = logging.StreamHandler(sys.stderr)
            console.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(message)s", "%H:%M:%S"))
            root.addHandler(console)
            self.console_handler = console
        if root.level > logging.INFO:
            root.setLevel(logging.INFO)
        for lg in list(logging.Logger.manager.loggerDict.values()):
            if isinstance(lg, logging.Logger) and not lg.propagate and self.file_handler not in lg.handlers:
                lg.addHandler(self.file_handler)
        for h in _terminal_handlers():
            if self.redact not in h.filters:  # --debug too: the terminal shows no secret either
                h.addFilter(self.redact)
            if not self.debug and self.filter not in h.filters:
                h.addFilter(self.filter)

    def __exit__(self, *exc) -> None:
        self.refresh()
        for h in _terminal_handlers():
            h.removeFilter(self.filter)
            h.removeFilter(self.redact)
        for lg in [logging.getLogger()] + list(logging.Logger.manager.loggerDict.values()):
            if isinstance(lg, logging.Logger) and self.file_handler in lg.handlers:
                lg.removeHandler(self.file_handler)
        if self.file_handler is not None:
            self.file_handler.close()
        if self.console_handler is not None:
            logging.getLogger().removeHandler(self.console_handler)


@contextlib.contextmanager
def quiet_command(command: str, debug: bool = False, *, settings=None):
    """:class:`ReadableTerminal` for a one-shot command (``model fetch``, ``pair register``,
    ``pair watch``): library noise (torchao load failures, pytree warnings, progress bars, every httpx
    request, another library's tracebacks) goes to ``<SPECDEC_HOME>/logs/<command>-*.log``, as with
    ``nightly run``. Where that file cannot be created (a read-only or full home) the command runs
    with the terminal as it is. ``SPECDEC_DEBUG=1`` (or ``debug``) leaves the terminal unfiltered.
    ``settings``: the command's :class:`specdec.settings.CoreSettings` (home, debug; read here when not given).

    Yields the terminal (call ``refresh()`` after heavy imports) or None.
    """
    from specdec.settings import CoreSettings

    s = settings if settings is not None else CoreSettings()
    quiet_env()
    try:
        term = ReadableTerminal(s.home, command, debug=debug or s.debug)
        term.__enter__()
    except OSError:
        yield None
        return
    try:
        yield term
    finally:
        term.__exit__(None, None, None)
