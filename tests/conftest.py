"""Shared test setup: offline, no telemetry, deterministic threads."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DO_NOT_TRACK", "true")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import warnings  # noqa: E402

warnings.filterwarnings("ignore", category=FutureWarning)

import torch  # noqa: E402

# Tiny test models are dominated by per-op overhead: one intra-op thread is several times faster
# than two on a 2-core machine, and keeps parallel test processes from thrashing each other.
torch.set_num_threads(1)

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def prefect_harness():
    """One temporary Prefect API (SQLite) for every flow test in the session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


def pytest_terminal_summary(terminalreporter):
    """The skipped tests in one line, grouped by reason (the reasons say how to enable them)."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    counts: dict[str, int] = {}
    for rep in skipped:
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        reason = reason.removeprefix("Skipped: ")
        counts[reason] = counts.get(reason, 0) + 1
    terminalreporter.write_line("skipped " + str(len(skipped)) + ": "
                                + "; ".join(f"{n} x {r}" for r, n in sorted(counts.items(), key=lambda x: -x[1])))
