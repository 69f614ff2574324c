"""The end of a nightly flow run: a Markdown summary artifact in Prefect, and a run that fails (red in
the Prefect UI, not a green "Completed") when a validation failed or could not run.

``specdec nightly run`` calls the flow with ``fail_on_failure=False`` (it prints its own table and
chooses its exit code); deployments (prefect.yaml, ``nightly serve``, ``pair watch``) pass True.
"""

from __future__ import annotations

import logging

log = logging.getLogger("flows.nightly")

FAILING = ("failed", "error")


class ValidationsFailed(RuntimeError):
    """One or more validations of this run failed (``results`` holds every NightlyResult)."""

    def __init__(self, results: list) -> None:
        self.results = results
        bad = [f"{r.pair}@{r.alias} v{r.version or '?'}: {r.status}" for r in results if r.status in FAILING]
        super().__init__(f"{len(bad)} validation(s) failed: " + "; ".join(bad))


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def summary_markdown(results: list) -> str:
    """A Markdown table of the run: pair, alias, version, status, acceptance [95% CI], alert, MLflow run."""
    lines = ["| pair | alias | version | status | acceptance [95% CI] | alert | note |", "|---|---|---|---|---|---|---|"]
    for r in results:
        ci = r.acceptance_rate_ci
        acc = f"{r.acceptance_rate:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if r.acceptance_rate is not None and len(ci) == 2 else "-"
        note = r.ungated_promotion or r.root_cause_hint or r.message or ""
        lines.append("| " + " | ".join(_cell(x) for x in (r.pair, r.alias, r.version or "-", f"**{r.status}**", acc,
                                                           r.alert_transition or "-", note[:300])) + " |")
    return "\n".join(lines)


def finish_run(results: list, fail_on_failure: bool) -> list:
    """Publish the summary artifact (key ``nightly-summary``; outside a flow run nothing is
    published), then return ``results`` or raise :class:`ValidationsFailed`."""
    try:
        from prefect.artifacts import create_markdown_artifact

        create_markdown_artifact(summary_markdown(results), key="nightly-summary",
                                 description="specdec nightly validation: one row per (pair, alias)")
    except Exception as e:  # noqa: BLE001 (no API, or outside a run: the results still return)
        log.debug("summary artifact not published: %s: %s", type(e).__name__, e)
    if fail_on_failure and any(r.status in FAILING for r in results):
        raise ValidationsFailed(results)
    return results
