"""``specdec draft recommend``: which draft pays on this machine (see :mod:`specdec.validation.recommend`).

Registered through the ``specdec.cli`` entry point ``draft = "specdec.validation.recommend_cli:register"``;
``specdec validate --draft auto`` uses :func:`run_recommend` too.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from specdec.models.store import ModelStore

draft_app = typer.Typer(help="Choose a draft for a target on this machine.", no_args_is_help=True)
_out = Console()
_err = Console(stderr=True, emoji=False)


def register(app: typer.Typer) -> None:
    """Add the ``draft`` sub-command group to the ``specdec`` app (``draft train`` joins it in :mod:`specdec.cli`)."""
    app.add_typer(draft_app, name="draft")


def _fail(msg: str) -> None:
    _err.print(f"[bold red]error:[/] {msg}", highlight=False)
    raise typer.Exit(code=1)


def _f(x: float | None, d: int = 2, suffix: str = "") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{d}f}{suffix}"


def print_recommendation(rec: Any, console: Console = _out) -> None:
    """The candidates table (α, c, v, measured speedup with CI, best k), the native-bf16 line and
    the recommendation."""
    from rich import box
    from rich.table import Table

    t = Table(title=f"draft candidates for {rec.target_ref} ({rec.device}, {rec.dtype}; {rec.num_prompts} prompts "
                    f"over {len(rec.categories)} categories, {rec.max_new_tokens} new tokens, greedy)",
              title_justify="left", box=box.SIMPLE_HEAD, caption_justify="left",
              caption="acc.: replayed acceptance rate at k; c: draft pass / target pass; v(k): verification pass of k + 1 "
                      "tokens / one-token pass; pred. and measured: speedup over target-only; exact: greedy outputs "
                      "identical to target-only; a draft-length threshold (tau) is noted below only where replay finds one that "
                      "beats the best fixed k")
    for col in ("drafter", "acc.", "c", "k", "v(k)", "pred.", "measured [95% CI]", "meas/pred", "α̂", "exact"):
        t.add_column(col, justify="left" if col == "drafter" else "right", no_wrap=True)
    notes = []
    for c in rec.candidates:
        if c.reason:
            notes.append(f"{c.spec}: {'unavailable: ' if not c.available else ''}{c.reason}")
        if not c.available:
            t.add_row(c.spec, *["-"] * 9)
            continue
        ci = f" [{_f(c.speedup_ci[0])}, {_f(c.speedup_ci[1])}]"
        sp = f"{_f(c.measured_speedup, 2, 'x')}{ci}"
        style = "green" if c.pays else ("red" if c.measured_speedup < 1 or c.timing_suspect else "")
        name = f"[bold]{c.spec}[/]" if c.spec == rec.best else c.spec
        t.add_row(name, _f(c.alpha, 3), _f(c.cost_ratio), str(c.k or "-"), _f(c.verify_cost),
                  _f(c.predicted_speedup, 2, "x"), f"[{style}]{sp}[/]" if style else sp,
                  _f(c.measured_over_predicted, 2) + (" timing suspect" if c.timing_suspect else ""), _f(c.alpha_hat, 3),
                  f"{c.identical_outputs}/{c.compared_outputs}")
    console.print(t)
    for c in rec.candidates:
        kt = c.best_k_tau
        if kt and kt.get("assistant_confidence_threshold") is not None:
            notes.append(f"{c.spec}: a draft-length threshold beats fixed k by replay: k={kt['num_speculative_tokens']}, "
                         f"--assistant-confidence-threshold {kt['assistant_confidence_threshold']:g} predicts "
                         f"{_f(kt['predicted_speedup'], 2, 'x')} (not measured)")
    for n in notes:
        console.print(f"  [dim]note[/] {n}", highlight=False)
    for line in floor_warnings(rec):
        console.print(f"[yellow]warning: {line}[/]", highlight=False)
    nb = rec.native_bf16
    console.print(f"native bf16: {'yes' if nb.get('native') else 'no'} ({nb.get('detail')}); target one-token pass "
                  f"{rec.target_step_ms:.1f} ms; load avg {', '.join(f'{x:.1f}' for x in rec.load_avg_1m[:1] + rec.load_avg_1m[-1:])}"
                  f" on {rec.num_cpus} CPUs; {rec.seconds:.0f} s", highlight=False)
    from specdec.validation.machine import OVERLOADED_LOAD_PER_CPU

    loads = [x for x in rec.load_avg_1m if x == x]
    if loads and rec.num_cpus and max(loads) / rec.num_cpus > OVERLOADED_LOAD_PER_CPU:
        console.print(f"[yellow]warning: the machine was busy during the timings (load avg up to {max(loads):.1f} on "
                      f"{rec.num_cpus} CPUs): other jobs shared the cores, so the speedups are unreliable; re-run on "
                      "an idle machine[/]", highlight=False)
    color = "green" if rec.best else "yellow"
    console.print(f"[bold {color}]recommendation:[/] {rec.summary}", highlight=False)


def floor_warnings(rec: Any) -> list[str]:
    """``derived:bf16: acceptance rate 0.29 at k = 4 is already below floor 0.40 (policy default); at smaller k:
    ...`` for each measured candidate whose chosen k replays an acceptance rate below the policy's floor
    (:func:`specdec.policy.below_floor_note`): served at that k, the nightly's floor would fire at once."""
    from specdec.policy import below_floor_note, floor_for
    from specdec.settings.policy import get_policy

    floor = floor_for(get_policy())
    out = []
    for c in rec.candidates:
        note = below_floor_note(c.acceptance_by_k, c.k, floor) if c.available and c.k else None
        if note:
            out.append(f"{c.spec}: {note}")
    return out


def run_recommend(target: Any, *, heldout: str = "spec_bench", candidates: list[str] | None = None,
                  per_category: int = 1, max_prompt_tokens: int | None = 256, max_new_tokens: int = 32,
                  k_max: int = 8, seed: int = 0, target_ref: str | None = None,
                  console: Console = _err, store: ModelStore | None = None) -> Any:
    """Load the held-out set, pick the short stratified prompts and run
    :func:`specdec.validation.recommend.recommend_draft` with a status line, replaying into this home's
    continuation cache (``SPECDEC_HOME``, read here: an entry module) with candidate drafts fetched into ``store``
    (default: the settings' models directory). Returns the Recommendation."""
    from specdec.settings import get_settings
    from specdec.validation.continuation_cache import ContinuationCache
    from specdec.validation.heldout import load_heldout

    settings = get_settings()
    store = store or ModelStore(settings.models_dir)  # an entry module: the edge
    from specdec.validation.recommend import recommend_draft
    from specdec.validation.short_prompts import short_prompts

    held = short_prompts(load_heldout(heldout), target.tokenizer, per_category=per_category,
                         max_prompt_tokens=max_prompt_tokens, seed=seed)
    with console.status("measuring draft candidates ...") as status:
        def progress(m: str) -> None:
            status.update(m)
            if not console.is_terminal:  # piped, CI, a log: the spinner prints nothing there, a line per phase does
                console.print(m, highlight=False, soft_wrap=True)

        return recommend_draft(target, held, candidates=candidates, max_new_tokens=max_new_tokens,
                               k_values=tuple(range(1, k_max + 1)), seed=seed,
                               target_ref=target_ref, progress=progress,
                               cache=ContinuationCache.in_home(settings.home), store=store)


@draft_app.command("recommend")
def recommend(
    *,
    target: Annotated[str, typer.Option("--target", help="Target model: local dir, Hub id, .gguf file, or 'smollm2'.")],
    candidate: Annotated[list[str] | None, typer.Option(
        "--candidate", help="Drafter spec to measure (repeatable). Default: derived:bf16, derived:int8, derived:int4, "
                            "ngram on a CPU; derived:fp8, derived:int8, ngram on CUDA.")] = None,
    heldout: Annotated[str, typer.Option("--heldout", help="spec_bench | humaneval | a JSONL path.")] = "spec_bench",
    per_category: Annotated[int, typer.Option("--per-category", min=1, help="Prompts per category.")] = 1,
    max_prompt_tokens: Annotated[int, typer.Option(
        "--max-prompt-tokens", min=0, help="Draw among prompts at most this long (0 = any length).")] = 256,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=1)] = 32,
    k_max: Annotated[int, typer.Option("--k-max", min=1, help="Largest k considered.")] = 8,
    device: Annotated[str, typer.Option("--device", help="auto | cpu | cuda | cuda:N.")] = "auto",
    dtype: Annotated[str, typer.Option("--dtype", help="auto (bf16 on CUDA, fp32 on CPU) | float32 | bfloat16.")] = "auto",
    seed: Annotated[int, typer.Option("--seed")] = 0,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the result as JSON here.")] = None,
) -> None:
    """Measure candidate drafts (derived copies, n-gram) against the target here and name the best.
    Ctrl-C: the candidate being measured finishes and the ones measured so far are the recommendation
    (exit 130); twice: stop at once."""
    from specdec import stopping

    with stopping.stoppable(lambda line: _err.print(f"[bold yellow]{line}[/]", highlight=False),
                            kept="the candidates measured so far are above"):
        _recommend(target=target, candidate=candidate, heldout=heldout, per_category=per_category,
                   max_prompt_tokens=max_prompt_tokens, max_new_tokens=max_new_tokens, k_max=k_max, device=device,
                   dtype=dtype, seed=seed, json_out=json_out)
        stopping.check()


def _recommend(*, target, candidate, heldout, per_category, max_prompt_tokens, max_new_tokens, k_max, device, dtype,
               seed, json_out) -> None:
    """The ``draft recommend`` command's body (see :func:`recommend`)."""
    import torch

    from specdec.models import load_causal_lm
    from specdec.settings import model_store

    store = model_store()
    if device.startswith("cuda") and not torch.cuda.is_available():
        _fail("--device cuda requested but CUDA is not available")
    with _err.status(f"loading target {target} ..."):
        try:
            tgt = load_causal_lm(target, store=store, dtype=dtype, device=device)
        except (FileNotFoundError, ValueError) as e:
            _fail(f"target: {e}")
    from specdec.core.finite import BrokenModel, NonFiniteLogits

    try:
        rec = run_recommend(tgt, store=store, heldout=heldout, candidates=candidate or None, per_category=per_category,
                            max_prompt_tokens=max_prompt_tokens or None, max_new_tokens=max_new_tokens,
                            k_max=k_max, seed=seed, target_ref=target)
    except NonFiniteLogits as e:  # a pass-cost or speed pass: the target, or a candidate drafter
        _fail(str(BrokenModel.naming(e, tgt.model, ["(timing pass)"])))
    except (FileNotFoundError, ValueError, BrokenModel) as e:
        _fail(str(e))
    print_recommendation(rec)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(rec.to_dict(), indent=2))
        _out.print(f"written: {json_out}")
