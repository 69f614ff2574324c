"""The one settings tree (composed by flows.settings from each package's section): sections, SPECDEC_HOME
read once, documented names."""

from __future__ import annotations

import pytest


@pytest.fixture()
def home(monkeypatch, tmp_path):
    for var in ("SPECDEC_MODELS_DIR", "SPECDEC_TRACKING_URI", "MLFLOW_TRACKING_URI", "SPECDEC_DB_URL",
                "SPECDEC_REPORTS_DIR", "SPECDEC_CACHE_DIR", "SPECDEC_ARTIFACTS_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "h"))
    monkeypatch.chdir(tmp_path)  # no stray .env
    return (tmp_path / "h").resolve()


def test_every_section_lives_under_one_home(home):
    from flows.settings import load_settings

    s = load_settings()
    assert s.home == s.core.home == s.registry.home == s.monitoring.home == home
    assert s.core.models_dir == home / "models"
    assert s.registry.tracking_uri == f"sqlite:///{home / 'mlflow.db'}"
    assert s.monitoring.db_url == f"sqlite:///{home / 'history.db'}" and s.monitoring.reports_dir == home / "reports"
    assert s.policy.threshold == s.monitoring.rules.policy.threshold == 0.40


def test_packages_get_their_section_of_the_same_tree(home, monkeypatch):
    import flows.settings
    import monitoring.production.settings
    import monitoring.settings
    import registry.settings
    import specdec.settings
    from specdec.policy import AcceptancePolicy

    s = flows.settings.load_settings()
    assert registry.settings.get_settings().tracking_uri == s.registry.tracking_uri
    assert isinstance(s.monitoring, monitoring.settings.MonitoringSettings)
    assert isinstance(s.production, monitoring.production.settings.ProductionSettings)
    assert isinstance(s.nightly, flows.settings.NightlySettings)
    assert isinstance(s.core, specdec.settings.CoreSettings) and isinstance(s.policy, AcceptancePolicy)
    monkeypatch.setenv("SPECDEC_NIGHTLY_LIMIT", "7")
    monkeypatch.setenv("SPECDEC_PRODUCTION_WINDOW_MINUTES", "5")
    monkeypatch.setenv("SPECDEC_RULES__RELATIVE_DROP", "0.2")
    s = flows.settings.load_settings()
    assert (s.nightly.limit, s.production.window_minutes, s.monitoring.rules.relative_drop) == (7, 5.0, 0.2)


def test_the_decoding_library_keeps_only_its_own_sections():
    """specdec/settings holds core, policy, home and the model store's layout; the other sections live with their
    packages."""
    from pathlib import Path

    import specdec.settings

    here = Path(specdec.settings.__file__).parent
    assert sorted(p.name for p in here.glob("*.py")) == ["__init__.py", "aliases.py", "core.py", "home.py",
                                                          "policy.py", "store.py"]


def test_a_flow_called_in_process_runs_with_the_callers_tree(home, tmp_path):
    from flows.settings import for_this_run, load_settings, using

    given = load_settings(home=tmp_path / "other")
    with using(given):
        assert for_this_run() is given
    assert for_this_run().home == home


def test_production_engine_names_are_the_engines_monitoring_reads():
    from monitoring.production.engines import ENGINES
    from monitoring.production.settings import ENGINE_NAMES

    assert set(ENGINE_NAMES) == set(ENGINES)


def test_specdec_home_is_resolved_in_one_module():
    """Only specdec/settings/home.py reads SPECDEC_HOME (as the ``home`` field of its base section)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readers = [str(p.relative_to(root)) for pkg in ("specdec", "registry", "monitoring", "flows")
               for p in (root / pkg).rglob("*.py")
               if 'environ.get("SPECDEC_HOME"' in p.read_text() or "getenv(\"SPECDEC_HOME\"" in p.read_text()]
    assert readers == []


_PRODUCT = ("specdec", "registry", "monitoring", "flows")


def _product_lines():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for pkg in _PRODUCT:
        for p in (root / pkg).rglob("*.py"):
            rel = p.relative_to(root).as_posix()
            for i, line in enumerate(p.read_text().splitlines(), 1):
                yield rel, i, line


def test_mlflow_clients_are_built_only_by_the_registry_service():
    import re

    built = [f"{f}:{i}" for f, i, line in _product_lines()
             if re.search(r"MlflowClient\(|mlflow\.set_tracking_uri|mlflow\.tracking", line)]
    assert [b.split(":")[0] for b in built] == ["registry/service.py"], built


#: modules that read the environment for a reason other than settings (each with the reason)
ENV_READS_ALLOWED = {
    "flows/prefect_api.py": "the private Prefect server's child process gets this process's environment, and the "
                            "PREFECT_API_URL it sets for Prefect is restored on stop",
    "specdec/engines/vllm_install.py": "the vLLM engine's child process gets this process's environment plus its "
                                       "compile-cache and offline switches",
}


def test_the_environment_is_read_only_in_the_settings_modules():
    """Settings modules read the environment; elsewhere only write-only configuration of third-party
    libraries at an entry point (``os.environ.setdefault(...)``, ``os.environ[...] = ...``, ``.pop``)."""
    import re

    write = re.compile(r"^\s*os\.environ(\.setdefault\(|\[[^\]]+\]\s*=[^=]|\.pop\()")
    reads = [f"{f}:{i}: {line.strip()}" for f, i, line in _product_lines()
             if re.search(r"os\.environ|getenv", line) and not write.match(line)
             and not (f.startswith("specdec/settings/") or f.endswith("/settings.py")) and f not in ENV_READS_ALLOWED]
    assert reads == []
