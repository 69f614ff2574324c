"""docs/settings.md is generated from the pydantic settings models (tests/support/settings_doc.py): each
variable's name is written once, in its model. Stale page -> this fails with the command that refreshes it."""

from __future__ import annotations

from tests.support.settings_doc import OUT, REFRESH, attribute_docs, render


def test_the_settings_reference_is_generated_from_the_models():
    fresh = render()
    on_disk = OUT.read_text() if OUT.exists() else ""
    assert on_disk == fresh, f"docs/settings.md is stale or missing: run `{REFRESH}` and commit it"


def test_every_variable_of_the_tree_is_in_the_reference():
    from flows.settings import NightlySettings
    from monitoring.settings import MonitoringSettings

    page = render()
    for name in ("SPECDEC_HOME", "SPECDEC_MODELS_DIR", "SPECDEC_ENGINES_DIR", "SPECDEC_POLICY__THRESHOLD",
                 "SPECDEC_RULES__ABSOLUTE_THRESHOLD", "SPECDEC_TRACKING_URI", "MLFLOW_TRACKING_URI", "SPECDEC_DB_URL",
                 "SPECDEC_ALERT_CHANNELS", "SPECDEC_RULES__SPEED_ENABLED", "SPECDEC_DELIVERY__MAX_ATTEMPTS",
                 "SPECDEC_PRODUCTION_SOURCES", "SPECDEC_NIGHTLY_METHOD", "PREFECT_API_URL", "SPECDEC_WATCH_SECRET",
                 "SPECDEC_DEMO_DRAFT"):
        assert f"`{name}`" in page, name
    assert page.count("| `SPECDEC_HOME` |") == 1  # every section has a home; it is listed once
    for cls in (NightlySettings, MonitoringSettings):
        for field in cls.model_fields:
            assert f"_{field.upper()}`" in page, (cls.__name__, field)


def test_attribute_docs_reads_shared_and_continued_lines():
    class Example:
        """Title.

        Attributes:
            a / b: shared text
                continued.
            c: own text.
        Raises:
            d: not an attribute.
        """

    assert attribute_docs(Example) == {"a": "shared text continued.", "b": "shared text continued.", "c": "own text."}
