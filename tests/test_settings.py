"""The one settings tree (specdec.settings): sections, SPECDEC_HOME read once, documented names."""

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
    from specdec.settings import load_settings

    s = load_settings()
    assert s.home == s.core.home == s.registry.home == s.monitoring.home == home
    assert s.core.models_dir == home / "models"
    assert s.registry.tracking_uri == f"sqlite:///{home / 'mlflow.db'}"
    assert s.monitoring.db_url == f"sqlite:///{home / 'history.db'}" and s.monitoring.reports_dir == home / "reports"
    assert s.policy.policy().threshold == s.monitoring.rules.absolute_threshold == 0.40


def test_packages_get_their_section_of_the_same_tree(home, monkeypatch):
    import flows.settings
    import monitoring.production.settings
    import monitoring.settings
    import registry.settings
    from specdec import settings

    assert registry.settings.get_settings().tracking_uri == settings.load_settings().registry.tracking_uri
    assert monitoring.settings.MonitoringSettings is settings.MonitoringSettings
    assert monitoring.production.settings.ProductionSettings is settings.ProductionSettings
    assert flows.settings.NightlySettings is settings.NightlySettings
    monkeypatch.setenv("SPECDEC_NIGHTLY_LIMIT", "7")
    monkeypatch.setenv("SPECDEC_PRODUCTION_WINDOW_MINUTES", "5")
    monkeypatch.setenv("SPECDEC_RULES__RELATIVE_DROP", "0.2")
    s = settings.load_settings()
    assert (s.nightly.limit, s.production.window_minutes, s.monitoring.rules.relative_drop) == (7, 5.0, 0.2)


def test_production_engine_names_are_the_engines_monitoring_reads():
    from monitoring.production.engines import ENGINES
    from specdec.settings.production import ENGINE_NAMES

    assert set(ENGINE_NAMES) == set(ENGINES)


def test_specdec_home_is_resolved_in_one_module():
    """Only specdec/settings/home.py reads SPECDEC_HOME (as the ``home`` field of its base section)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readers = [str(p.relative_to(root)) for pkg in ("specdec", "registry", "monitoring", "flows")
               for p in (root / pkg).rglob("*.py")
               if 'environ.get("SPECDEC_HOME"' in p.read_text() or "getenv(\"SPECDEC_HOME\"" in p.read_text()]
    assert readers == []
