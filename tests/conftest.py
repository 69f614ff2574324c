"""Shared test setup: offline, no telemetry, deterministic threads; pytest-xdist workers and their homes.

``make test`` runs the suite in two pytest-xdist workers. The work unit is a test module (its module-scoped
servers and models are built once, on one worker), or a group of modules named in :data:`SHARED_WORKER` (they
run on one worker, one after another, and share its session-scoped fixtures): :func:`pytest_xdist_make_scheduler`.
(xdist's own ``--dist loadgroup`` with ``xdist_group`` marks does not group with pytest 9.2: pytest-xdist
issue 1386.) Modules that take minutes are handed out first (:data:`SLOW_FIRST`).
Each worker gets its own ``SPECDEC_HOME`` and ``PREFECT_HOME`` (unless set) and its own port range
(:func:`tests.support.net.free_port`); the caches worth keeping (converted models, the llama.cpp build)
stay shared: ``SPECDEC_MODELS_DIR`` and ``SPECDEC_ENGINES_DIR`` default to the repository's ``.specdec/``.
"""

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DO_NOT_TRACK", "true")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _worker_homes() -> None:
    """Under pytest-xdist: a ``SPECDEC_HOME`` and ``PREFECT_HOME`` per worker (``.specdec/xdist/<gwN>``),
    the shared caches named explicitly so the workers reuse them. Serial runs are left as they are."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        # the controller: its terminal width, for the workers (which start with COLUMNS=80 set; Rich consoles
        # created at import would keep that width and wrap tables that tests read)
        os.environ.setdefault("SPECDEC_TEST_COLUMNS", os.environ.get("COLUMNS", ""))
        return
    columns = os.environ.get("SPECDEC_TEST_COLUMNS")
    if columns == "":
        os.environ.pop("COLUMNS", None)
    elif columns:
        os.environ["COLUMNS"] = columns
    shared = Path(os.environ.get("SPECDEC_HOME") or Path(__file__).resolve().parents[1] / ".specdec").resolve()
    os.environ.setdefault("SPECDEC_MODELS_DIR", str(shared / "models"))
    os.environ.setdefault("SPECDEC_ENGINES_DIR", str(shared / "engines"))
    home = shared / "xdist" / worker
    home.mkdir(parents=True, exist_ok=True)
    os.environ["SPECDEC_HOME"] = str(home)
    os.environ.setdefault("PREFECT_HOME", str(home / "prefect"))


_worker_homes()

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


#: modules that take minutes (real servers, CLI processes, real models; ``--durations`` of the registry and
#: monitoring directories and the flows directory, docs/operations.md "Tests and CI"), handed out first under
#: pytest-xdist so that no worker starts a long module while the other one has nothing left to do. Prefixes;
#: earlier is sooner. Every run prints its 30 slowest tests: keep this list in step with them.
SLOW_FIRST = ("tests/vllm/", "tests/flows/", "tests/docker/", "tests/registry/test_store.py", "tests/registry/test_webhooks.py",
              "tests/monitoring/test_production_invariants.py", "tests/monitoring/test_production_llamacpp.py",
              "tests/monitoring/test_production_cli.py", "tests/validation/test_engine_check.py",
              "tests/models/test_eagle3_interop.py", "tests/training/", "tests/registry/test_killed_register.py",
              "tests/monitoring/test_alert_delivery_faults.py", "tests/monitoring/test_evidently.py",
              "tests/registry/test_acceptance_policy.py", "tests/monitoring/test_alert_redirects.py",
              "tests/registry/test_mlflow_ui_browser.py", "tests/validation/test_recommend.py",
              "tests/validation/test_replay_method.py", "tests/models/test_smollm2.py", "tests/core/test_smoke_real.py")


#: modules that run on one pytest-xdist worker, one after another, sharing its session fixtures: module -> group
SHARED_WORKER = {"tests/flows/test_server.py": "prefect_server", "tests/flows/test_watch.py": "prefect_server",
                 # one vLLM engine at a time on a 2-core runner, and each `vllm serve` started once for all of them
                 "tests/vllm/": "vllm"}


def _group(module: str) -> str:
    """The work unit of a test module: its :data:`SHARED_WORKER` group (a module or a folder prefix), else itself."""
    return next((g for prefix, g in SHARED_WORKER.items() if module == prefix or
                 (prefix.endswith("/") and module.startswith(prefix))), module)


def _slowness(item) -> int:
    path = item.nodeid.split("::", 1)[0]
    return next((i for i, prefix in enumerate(SLOW_FIRST) if path.startswith(prefix)), len(SLOW_FIRST))


def pytest_collection_modifyitems(config, items):
    """Under xdist the slow modules (:data:`SLOW_FIRST`) come first (a stable sort: the order inside a module is
    kept; ``make test`` passes ``--no-loadscope-reorder`` so xdist keeps this order instead of sorting the
    modules by their number of tests)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=_slowness)


def pytest_xdist_make_scheduler(config, log):
    """xdist's scope scheduler with one work unit per test module, or per :data:`SHARED_WORKER` group."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid.split("::", 1)[0])

    return ModuleScheduling(config, log)


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
