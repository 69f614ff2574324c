"""Terminal side of ``specdec validate --method replay|both``: the replay tables."""

from __future__ import annotations

import math
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

__all__ = ["print_replay"]


def _f(x: Any, digits: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def print_replay(report: Any, out: Console) -> None:
    """The acceptance-by-k table, the per-method counters, agreement and the recommended k."""
    r = report.replay
    k0 = report.config.get("num_speculative_tokens")
    t = Table(title=f"replay ({r['kind']}; precision {r['precision']}; gate: {r['gate_method']})", title_justify="left",
              box=box.SIMPLE_HEAD)
    for name in ("k", "acceptance [95% CI]", "mean acc. len", "pred. speedup (c, v measured)"):
        t.add_column(name, justify="right")
    for row in r["acceptance_by_k"]:
        acc = row.get("acceptance_rate", row.get("expected_acceptance_rate"))
        ci = row.get("acceptance_rate_ci", row.get("expected_acceptance_rate_ci")) or [None, None]
        mal = row.get("mean_accepted_length", row.get("expected_mean_accepted_length"))
        mark = " *" if row["k"] == k0 else ""
        t.add_row(f"{row['k']}{mark}", f"{_f(acc)} [{_f(ci[0], 2)}, {_f(ci[1], 2)}]", _f(mal, 2),
                  _f(row.get("predicted_speedup"), 2))
    out.print(t)
    cont = r["continuations"]
    out.print(f"replayed {r['num_prompts_replayed']} prompts (continuations: {cont['cache']} cached, "
              f"{sum(v for w, v in cont.items() if w != 'cache')} produced); seconds: continuation "
              f"{_f(r['seconds']['continuation'], 1)}, replay {_f(r['seconds']['replay'], 1)}", highlight=False)
    if r.get("recommended_num_speculative_tokens") is not None:
        out.print(f"recommended k from the replayed curve: {r['recommended_num_speculative_tokens']} "
                  f"(predicted {_f(r['predicted_speedup_at_recommended'], 2)}x with c = {_f(r['cost_ratio'])}, "
                  f"v(n) = {', '.join(_f(x, 2) for x in (r.get('verify_cost_by_n') or [])[:9])}, ...)", highlight=False)
    kt = r.get("best_k_tau") or {}
    if kt.get("num_speculative_tokens") is not None:
        fixed = r["best_fixed_k"]
        tau = kt["assistant_confidence_threshold"]
        out.print(f"best (k, tau): k = {kt['num_speculative_tokens']}, assistant_confidence_threshold = "
                  f"{'none' if tau is None else _f(tau, 1)} (predicted {_f(kt['predicted_speedup'], 2)}x) next to the best "
                  f"fixed k = {fixed['num_speculative_tokens']} ({_f(fixed['predicted_speedup'], 2)}x)", highlight=False)
    if "counters" in r:
        for name, c in r["counters"].items():
            ci = c.get("acceptance_rate_ci") or [None, None]
            out.print(f"{name:>17}: {c['num_prompts']} prompts, acceptance {_f(c['acceptance_rate'])} "
                      f"[{_f(ci[0], 2)}, {_f(ci[1], 2)}], drafts {c['num_drafts']}, proposed {c['num_draft_tokens']}, "
                      f"accepted {c['num_accepted_tokens']}", highlight=False)
    if "replay_decode_agreement" in r:
        out.print(f"replay_decode_agreement: {_f(r['replay_decode_agreement'])} of {r['num_compared']} decoded prompts; "
                  f"{r['beyond_numerics']} disagreement(s) beyond numerics", highlight=False)
        for d in r["disagreements"][:10]:
            out.print(f"  {d['category']} #{d['prompt_id']}: position {d['position']}, logit margin "
                      f"{_f(d['logit_margin'])}: {d['class']}", highlight=False)
