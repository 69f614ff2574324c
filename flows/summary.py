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
    """A Markdown table of the run: pair, alias, version, the run's verdict word (the history's, the MLflow
    run's and the alert's), acceptance rate [95% CI] at k with the per-token α beside it, alert, note."""
    lines = ["| pair | alias | version | verdict | acceptance rate [95% CI] at k (per-token α) | alert | note |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        acc = acceptance_cell(r)
        note = r.ungated_promotion or r.root_cause_hint or r.message or ""
        lines.append("| " + " | ".join(_cell(x) for x in (r.pair, r.alias, r.version or "-", f"**{r.status}**", acc,
                                                           r.alert_transition or "-", note[:300])) + " |")
    return "\n".join(lines)


def acceptance_cell(r) -> str:
    """``0.296 [0.261, 0.331] at k=4 (α 0.562)`` of a NightlyResult, or ``-``."""
    ci = r.acceptance_rate_ci or []
    if r.acceptance_rate is None or len(ci) != 2:
        return "-"
    alpha = f" (α {r.per_token_acceptance:.3f})" if r.per_token_acceptance is not None else ""
    return f"{r.acceptance_rate:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] at k={r.num_speculative_tokens or '?'}{alpha}"


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
