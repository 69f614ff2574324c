"""Keep the demo's terminal to our own steps: third-party output goes to the demo's log file.

:class:`ThirdPartyToLog` redirects file descriptor 2 (so C-level messages, tqdm progress bars,
Prefect's and MLflow's console handlers and Python warnings all land there), points the root
logger at the file, and turns off Hugging Face progress bars. The demo prints through a
``rich.Console`` bound to the *original* stdout, which is left alone. On exit everything is
restored; a traceback of an unexpected error is written to the log, and one line to the terminal.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path


class ThirdPartyToLog:
    """Context manager: send stderr, logging and warnings to ``log_path`` (appended)."""

    def __init__(self, log_path: str | Path) -> None:
        self.log_path = Path(log_path)
        self._saved_fd: int | None = None
        self._fh = None
        self._handler: logging.Handler | None = None
        self._old_level = logging.root.level

    def __enter__(self) -> "ThirdPartyToLog":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.log_path, "a", buffering=1)  # noqa: SIM115 (closed in __exit__)
        sys.stderr.flush()
        sys.stdout.flush()
        self._saved_fd = os.dup(2)
        os.dup2(self._fh.fileno(), 2)
        self._handler = logging.StreamHandler(self._fh)
        self._handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.root.addHandler(self._handler)
        logging.root.setLevel(logging.INFO)
        logging.captureWarnings(True)
        warnings.simplefilter("default")
        for k, v in {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
                     "TQDM_DISABLE": "1"}.items():
            os.environ.setdefault(k, v)
        try:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        except Exception:  # noqa: BLE001 (transformers not importable: nothing to silence)
            pass
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is not None and not isinstance(exc, (KeyboardInterrupt, SystemExit)):
            logging.getLogger("flows.demo").error("demo failed", exc_info=(exc_type, exc, tb))
        logging.captureWarnings(False)
        if self._handler is not None:
            logging.root.removeHandler(self._handler)
        logging.root.setLevel(self._old_level)
        if self._saved_fd is not None:
            os.dup2(self._saved_fd, 2)
            os.close(self._saved_fd)
        if self._fh is not None:
            self._fh.close()
        return False
