"""``specdec validate --engine-url URL``: the engine check from the command line (the glue only; the check is
the engine measurement of :func:`specdec.validation.validate`, method ``engine``:
:func:`specdec.validation.engine_check.measure_engine`)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from specdec.models.store import ModelStore
from specdec.validation.engine_report import EngineCheckReport, EngineGroup

ENGINE_REPORT_FILE = "engine_check.json"


def run_engine_check(tgt: Any, drafter: Any, hs: Any, config: Any, *, endpoint: Any, concurrency: int,
                     target_ref: str, err: Console, cache: Any, limits: Any = None) -> EngineCheckReport:
    """The engine check of ``drafter`` (a resolved model drafter; on vLLM also an n-gram drafter) served at
    ``endpoint``: ``validate(..., method="engine")``, its report's ``engine_check`` section; ``cache``: the
    continuation cache of the core's continuations (:meth:`ContinuationCache.in_home` of the command's home).

    Raises:
        ValueError: a drafter the engine check cannot compare (a head; n-gram on an engine other than vLLM).
        specdec.engines.errors.EngineRequestError: the engine could not be measured (one line).
    """
    from specdec.validation.api import ValidationRequest, validate
    from specdec.validation.engine_check import EngineCheck

    check = EngineCheck(endpoint, concurrency=concurrency, **({"limits": limits} if limits else {}))
    with err.status("engine check: sending the held-out prompts to the engine ...") as status:
        def progress(step: Any) -> None:
            status.update(f"engine check: {step.done}/{step.total} prompts answered by the engine ...")

        request = ValidationRequest(tgt, [drafter], hs, config, method="engine", target_ref=target_ref,
                                    progress=progress, engine_check=check, cache=cache)
        return validate(request)[0].engine_check


def offline_endpoint(engine: str, target_ref: str, drafter: Any, config: Any, *, engines_dir: Path, store: ModelStore,
                     python: str | None = None) -> Any:
    """The :class:`~specdec.engines.profile.EngineEndpoint` of an offline check of ``engine`` (a profile that runs
    ``offline``: vLLM's ``LLM`` in the engine venv): the target checkpoint the
    core loaded and the ``--speculative-config`` the pair's serving config prints (draft as a local checkpoint);
    ``engines_dir``: the command's ``CoreSettings.engines_dir`` (the installed vLLM and its compile caches);
    ``store``: its :class:`~specdec.models.ModelStore` (where the target and draft references resolve).

    Raises:
        ValueError: a drafter vLLM cannot be given here (no loadable draft reference).
    """
    import json

    from specdec.engines.profile import EngineEndpoint
    from specdec.engines.profiles import engine_profile
    from specdec.kinds import kind_of
    from specdec.models.resolve import resolve_model_ref
    from specdec.validation.api import drafter_parts
    from specdec.validation.serving import serving_config

    _, _, kind, ref, recipe = drafter_parts(drafter)
    draft_dir = None if kind_of(kind).model_free or not ref else str(resolve_model_ref(ref, store=store)[0])
    engine = engine_profile(engine).name
    served = serving_config(engine, kind, config.num_speculative_tokens, draft=draft_dir, drafter_recipe=recipe)
    options = [("model", str(resolve_model_ref(target_ref, store=store)[0])),
               ("speculative_config", json.dumps(served["speculative_config"], separators=(",", ":"))),
               ("engines_dir", str(engines_dir))]
    if python:
        options.append(("python", python))
    return EngineEndpoint(url=None, engine=engine, options=tuple(options))


def _f(x: float, d: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{d}f}"


def _ci(ci: list[float]) -> str:
    return f"[{_f(ci[0])}, {_f(ci[1])}]"


def _row(table: Table, name: str, g: EngineGroup) -> None:
    table.add_row(name, str(g.num_prompts), f"{_f(g.engine_acceptance_rate)} {_ci(g.engine_acceptance_rate_ci)}",
                  f"{_f(g.core_acceptance_rate)} {_ci(g.core_acceptance_rate_ci)}",
                  f"{_f(g.difference, 3)} {_ci(g.difference_ci)}")


def write_and_print(report: EngineCheckReport, out_dir: Path, out: Console) -> Path:
    """Write ``engine_check.json`` into ``out_dir`` and print the summary table; returns the path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / ENGINE_REPORT_FILE
    path.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    t = Table(title=f"engine check: {report.engine} at {report.url} vs the core (acceptance = accepted / drafted, "
                    f"k={report.config.get('num_speculative_tokens')})")
    for col in ("group", "prompts", "engine [95% CI]", "core, same tokens [95% CI]", "engine - core [95% CI]"):
        t.add_column(col)
    _row(t, "overall", report.overall)
    for name, g in report.categories.items():
        _row(t, name, g)
    out.print(t)
    a, s = report.audit, report.speed
    out.print(f"verdict: {report.verdict}; counters: {report.counters_source}; engine per position "
              f"{report.engine_per_position or '-'} vs core {report.core_per_position}", highlight=False)
    if a.get("checked"):
        out.print(f"greedy audit vs the core's target-only output: {a['identical']}/{a['checked']} identical, "
                  f"{a['near_tie']} near-tie flips, {a['divergent']} divergences", highlight=False)
    speed = f"engine {_f(s.get('speculative_tokens_per_second'), 1)} tokens/s with speculation"
    if s.get("baseline_tokens_per_second") and not math.isnan(s["baseline_tokens_per_second"]):
        speed += (f", {_f(s['baseline_tokens_per_second'], 1)} without; speedup {_f(s['speedup'], 2)}x "
                  f"{_ci(s['speedup_ci'])}")
    out.print(speed + f"; build {report.fingerprint.get('build_info', '?')}", highlight=False)
    d = report.delivery
    if d is not None:
        e, c = d.engine, d.core
        out.print(f"per step, engine vs core (validated rule): drafted tokens {e.draft_tokens} vs {c.draft_tokens}, "
                  f"drafts per request {_f(e.drafts_per_request, 1)} vs {_f(c.drafts_per_request, 1)}, tokens per draft "
                  f"{_f(e.draft_tokens_per_draft, 2)} vs {_f(c.draft_tokens_per_draft, 2)}, mean accepted length "
                  f"{_f(e.mean_accepted_length, 2)} vs {_f(c.mean_accepted_length, 2)}", highlight=False)
    for f in report.findings:
        out.print(f"[bold red]finding ({f.kind}):[/] {escape(f.message)}", highlight=False)
    for note in report.notes:
        out.print(f"[yellow]note:[/] {note}", highlight=False)
    out.print(f"engine check report: {path}")
    return path
