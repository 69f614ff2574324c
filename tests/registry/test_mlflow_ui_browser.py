"""The MLflow UI as the promotion console, checked in a real browser.

A real ``mlflow server`` on 127.0.0.1 holds a pair registered from tiny test models (four versions:
passed + @champion, failed + @challenger, passed, never validated); headless Chromium (the Debian
package, driven by Playwright's Python package) opens the registered-model page and a version page.
For every version the versions table must show the verdict and the acceptance rate [CI] in full in
the Description column (the table shows 29 characters of it) and the ``validation_status`` /
``acceptance_rate`` tag chips unclipped; a version links to its validation run; the validation
experiment opens on its runs table; a run shows its plots and the Evidently report (which says what
it compares). Screenshots go to a temporary directory; ``SPECDEC_UI_SHOTS=benchmarks/results/ui`` refreshes
the committed ones.

Skipped, with the reason, only where no Chromium executable or no Playwright package exists
(``.ci/run`` installs ``chromium`` with apt-get when it runs as root).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.support.mlflow_server import MlflowServer
from tests.support.reports import tiny_report
from tests.support.models import save_tiny_checkpoint
from tests.support.gate import policy_gate
from tests.support.registry import open_registry_at

pytestmark = pytest.mark.server

# a test run never rewrites the committed screenshots unless asked to
SHOTS = Path(os.environ.get("SPECDEC_UI_SHOTS") or tempfile.mkdtemp(prefix="specdec-ui-"))
PAIR = "specdec-pair"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1920, "height": 1080}  # a common desktop; MLflow's assistant panel left open as it starts
TAG_CHIP = "[role=status][data-component-id$='keyvaluetag.tsx_60']"  # MLflow's KeyValueTag


def _chromium() -> str:
    exe = os.environ.get("SPECDEC_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        pytest.skip("no Chromium executable (Debian: apt-get install chromium; .ci/run installs it as root)")
    return exe


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    """A served MLflow store with four versions of one pair, validated and promoted through specdec."""
    import registry as R

    tmp = tmp_path_factory.mktemp("ui")
    mp = pytest.MonkeyPatch()
    mp.setenv("SPECDEC_HOME", str(tmp / "home"))
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    mp.delenv("SPECDEC_TRACKING_URI", raising=False)
    with MlflowServer(tmp / "mlflow") as server:
        uri = server.uri
        registry = open_registry_at(uri)
        t1 = R.register_model_version("tiny-target", save_tiny_checkpoint(tmp / "t1", seed=0), registry=registry)
        t2 = R.register_model_version("tiny-target", save_tiny_checkpoint(tmp / "t2", seed=0, perturb=0.05), registry=registry)
        d1 = R.register_model_version("tiny-draft", save_tiny_checkpoint(tmp / "d1", seed=0, perturb=0.01), registry=registry)
        d2 = R.register_model_version("tiny-draft", save_tiny_checkpoint(tmp / "d2", seed=0, perturb=0.06), registry=registry)
        cfg = R.SpeculativeConfig(4)
        R.register_pair(t1, d1, config=cfg, name=PAIR, registry=registry)  # v1
        R.register_pair(t2, d1, config=cfg, name=PAIR, registry=registry)  # v2: target fine-tuned, draft forgotten
        R.register_pair(t2, d2, config=cfg, name=PAIR, registry=registry)  # v3: draft retrained
        R.register_pair(t2, None, drafter_kind="ngram", config=cfg, name=PAIR, registry=registry)  # v4: never validated
        expected = {"1": ("passed", 0.72, (0.65, 0.79)), "2": ("failed", 0.31, (0.24, 0.38)),
                    "3": ("passed", 0.69, (0.62, 0.76))}
        runs = {v: R.log_validation(PAIR, v, tiny_report(acc, ci, num_speculative_tokens=4, heldout_name="spec_bench"),
                                    tmp / f"report-v{v}", registry=registry, gate=policy_gate())
                for v, (_, acc, ci) in expected.items()}
        # v2's night again, with the Evidently report the nightly attaches (v2 against v1, its baseline)
        from monitoring.evidently_report import build_report
        from tests.support.reports import make_report

        cur, ref = make_report(0.31, num_prompts=24, seed=2), make_report(0.72, num_prompts=24, seed=1)
        drift = build_report(cur.prompts, ref.prompts, tmp / "evidently", current_label=f"{PAIR} v2, night 2026-01-01",
                             reference_label=f"{PAIR} v1, night 2026-01-01 (the last passing run of the champion)",
                             pooled=(0.31, 0.72))
        runs["2"] = R.log_validation(PAIR, "2", tiny_report(0.31, (0.24, 0.38), num_speculative_tokens=4,
                                                             heldout_name="spec_bench"), tmp / "report-v2b",
                                     extra_artifacts=[drift.html_path, drift.json_path], registry=registry, gate=policy_gate())
        R.promote(PAIR, "1", actor="alice", registry=registry, gate=policy_gate())
        R.promote(PAIR, "2", "challenger", actor="alice", registry=registry, gate=policy_gate())
        yield {"uri": uri, "expected": expected, "runs": runs}
    mp.undo()


@pytest.fixture(scope="module")
def page():
    sync_api = pytest.importorskip("playwright.sync_api", reason="the Playwright Python package is not installed "
                                                                  "(pip install -e '.[test]')")
    exe = _chromium()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        pg = browser.new_page(viewport=VIEWPORT)
        pg.set_default_timeout(60_000)
        yield pg
        browser.close()


def _fully_visible(element) -> bool:
    """The element's text is not cut: no overflow inside it, and its box lies inside its table cell."""
    return element.evaluate("""e => {
        const cell = e.closest('[role=cell]'), r = e.getBoundingClientRect(), c = cell.getBoundingClientRect();
        const cut = [e, ...e.querySelectorAll('*')].some(x => x.scrollWidth > x.clientWidth + 1);
        return !cut && r.left >= c.left - 1 && r.right <= c.right + 1;
    }""")


def test_versions_table_shows_verdict_and_acceptance_untruncated(page, console):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.goto(f"{console['uri']}/#/models/{PAIR}")
    page.wait_for_selector("text=Version 4")
    page.wait_for_timeout(1000)  # let the table settle (fonts, column widths)
    rows = page.locator("[role=row]").filter(has=page.locator("[role=cell]"))
    seen = {}
    for i in range(rows.count()):
        row = rows.nth(i)
        cells = row.locator("[role=cell]")
        name = row.get_by_text("Version ", exact=False).first.inner_text().strip()
        version = name.removeprefix("Version ").strip()
        description = cells.last
        seen[version] = description.inner_text().strip()
        if version in console["expected"]:
            status, acc, (lo, hi) = console["expected"][version]
            head = f"{status}: acc {acc:.2f} [{lo:.2f}-{hi:.2f}]"  # the judged metric: the acceptance rate at k (policy default)
            assert seen[version].startswith(head), (version, seen[version])
            assert _fully_visible(description.locator("span").first), f"v{version}: description clipped on screen"
            for key, value in (("validation_status", status), ("acceptance_rate", f"{acc:.3f}")):
                chip = row.locator(f"{TAG_CHIP}[title='{key}']")
                assert chip.count() == 1, f"v{version}: no {key} tag"
                assert chip.inner_text().replace("\n", "") == f"{key}: {value}"
                assert _fully_visible(chip), f"v{version}: tag {key} clipped on screen"
        assert row.locator(TAG_CHIP).count() <= 10, f"v{version}: more than 10 tags"
    assert sorted(seen) == ["1", "2", "3", "4"], seen
    assert seen["4"].startswith("not validated at k=4")
    # the page scrolls inside MLflow's own container: a taller window (same width, so the same
    # column widths) puts every version in one screenshot
    page.set_viewport_size({"width": VIEWPORT["width"], "height": 2300})
    page.wait_for_timeout(500)
    page.screenshot(path=str(SHOTS / "registered-model-versions.png"))
    page.set_viewport_size(VIEWPORT)


def test_version_page_shows_the_whole_line(page, console):
    page.goto(f"{console['uri']}/#/models/{PAIR}/versions/2")
    line = page.get_by_text("failed: acc 0.31 [0.24-0.38] at k=4", exact=False).first
    line.wait_for()
    text = line.inner_text()
    assert "draft changed" not in text and "target changed since v1" in text and "spec_bench, 9 prompts" in text
    assert "@challenger" in text and "by alice" in text
    page.wait_for_timeout(500)
    page.screenshot(path=str(SHOTS / "pair-version-2.png"), full_page=True)


def test_validation_run_page_names_the_night_and_links_the_version(page, console):
    from mlflow import MlflowClient

    run_id = console["runs"]["1"]
    eid = MlflowClient(console["uri"]).get_run(run_id).info.experiment_id
    page.goto(f"{console['uri']}/#/experiments/{eid}/runs/{run_id}")
    page.get_by_text(f"{PAIR} v1 night 2026-01-01").first.wait_for()
    link = page.get_by_role("link", name=f"pair version {PAIR} v1")
    link.wait_for()
    assert page.get_by_text("passed: acc 0.72 [0.65-0.79] at k=4", exact=False).count() >= 1
    page.wait_for_timeout(500)
    page.screenshot(path=str(SHOTS / "validation-run-v1.png"))
    href = link.get_attribute("href")
    assert href == f"#/models/{PAIR}/versions/1"  # MLflow opens description links in a new tab
    page.goto(f"{console['uri']}/{href}")  # the route resolves to the version page
    page.get_by_text("Version 1").first.wait_for()
    assert page.get_by_text("passed: acc 0.72 [0.65-0.79] at k=4", exact=False).count() >= 1


def _experiment_id(console) -> str:
    from mlflow import MlflowClient

    return MlflowClient(console["uri"]).get_run(console["runs"]["1"]).info.experiment_id


def test_validation_experiment_opens_on_its_runs_table(page, console):
    eid = _experiment_id(console)
    # the route specdec's links use (run descriptions, alerts): MLflow 3.17 shows the GenAI overview
    # (traces, tokens: "No data") unless a route or the user's toggle asks for the runs view
    page.goto(f"{console['uri']}/#/experiments/{eid}?workflowType=machine_learning")
    page.get_by_text(f"{PAIR} v1 night 2026-01-01").first.wait_for()  # the runs table, not the GenAI overview
    assert page.get_by_text(f"{PAIR} v3 night 2026-01-01").count() >= 1
    page.wait_for_timeout(1500)
    page.screenshot(path=str(SHOTS / "validation-experiment-runs.png"))


def test_version_links_to_its_validation_evidence(page, console):
    page.goto(f"{console['uri']}/#/models/{PAIR}/versions/1")
    link = page.get_by_role("link", name="validation run")
    link.wait_for()
    href = link.get_attribute("href")
    assert href.endswith(f"/runs/{console['runs']['1']}?workflowType=machine_learning"), href
    assert page.locator("a[href*='github.com']").count() == 0  # "@champion" is not a GitHub mention


def test_validation_run_page_shows_its_plots(page, console):
    eid, run_id = _experiment_id(console), console["runs"]["1"]
    page.goto(f"{console['uri']}/#/experiments/{eid}/runs/{run_id}/artifactPath/plots/acceptance_trend.png"
              "?workflowType=machine_learning")
    img = page.locator("img[src*='acceptance_trend.png'], img[alt*='acceptance_trend']").first
    img.wait_for()
    page.wait_for_function("i => i.complete && i.naturalWidth > 0", arg=img.element_handle())
    page.wait_for_timeout(500)
    page.screenshot(path=str(SHOTS / "validation-run-plots.png"))


def test_evidently_report_says_what_is_compared(page, console):
    eid, run_id = _experiment_id(console), console["runs"]["2"]
    page.goto(f"{console['uri']}/#/experiments/{eid}/runs/{run_id}/artifactPath/drift.html?workflowType=machine_learning")
    frame_el = page.locator("iframe").first
    frame_el.wait_for()
    frame = frame_el.content_frame
    frame.get_by_text("specdec drift report").wait_for()
    assert frame.get_by_text(f"{PAIR} v2, night 2026-01-01", exact=False).count() >= 1
    assert frame.get_by_text("is the K-S p-value", exact=False).count() >= 1
    page.wait_for_timeout(2000)  # Evidently draws its widgets
    page.screenshot(path=str(SHOTS / "evidently-report.png"))
