"""What to do about an alert: one ``Do:`` line per cause (firing rule), the first thing an on-call person acts on.

The alert names what fired (:mod:`monitoring.alerts`); these lines say what to do about each kind of cause, with
the command or the place in MLflow where it is done. A floor that fires says more when the run knows what changed
since the last passing run (``target`` | ``draft`` | ``both``, :attr:`monitoring.alerts.AlertContext.changed`).
"""

from __future__ import annotations

from typing import Sequence

from monitoring.rules import RuleResult

__all__ = ["RULE_ACTIONS", "FLOOR_ACTIONS", "do_lines"]

#: the floor (rule ``absolute``) by what changed since the last passing run
FLOOR_ACTIONS = {
    "target": "Do: re-derive the draft from the new target (or retrain it) and register the new pair; leave "
              "@champion where it is until that pair passes",
    "draft": "Do: move @challenger back to the pair version with the previous draft: the new draft does not fit "
             "this target",
    "both": "Do: validate the new target with the draft it was derived from; register a new pair once it passes",
    None: "Do: open the Evidently report and the categories that fell; if the held-out set moved, re-baseline, "
          "else run `specdec draft recommend` for a smaller k or a better-fitting draft",
}
#: every other cause, by rule name
RULE_ACTIONS = {
    "relative": "Do: compare this run with its baseline in MLflow (target, draft, held-out and code versions) and "
                "promote nothing until a run passes again",
    "speed": "Do: re-run on an idle machine if it was loaded; else lower k with `specdec draft recommend` or use a "
             "cheaper draft",
    "collapse": "Do: check the draft's weights and tokenizer (a collapsed draft proposes the same tokens) and "
                "register it again",
    "measurement": "Do: re-run with more prompts (`--limit`) so the confidence interval is narrow enough to judge",
    "gate": "Do: keep this version out of @champion until the gate's criteria above hold",
    "reference": "Do: fix the alias or model version in MLflow (the pair's page, Aliases pencil), then re-run the "
                 "night",
    "engine_error": "Do: check the engine endpoint the version names (`specdec pair engine`), its process and its "
                    "log",
    "ungated_promotion": "Do: move @champion back, or validate this version and promote it with "
                         "`specdec pair promote`",
    "representativeness": "Do: check that production traffic and the held-out set still cover the same "
                          "categories before trusting this window",
}


def do_lines(firing: Sequence[RuleResult], changed: str | None = None) -> list[str]:
    """One ``Do:`` line per cause among the ``firing`` rule results, in their order (a rule firing overall and in
    categories is one cause); a rule with no action here gets none."""
    lines: list[str] = []
    for rule in dict.fromkeys(r.rule for r in firing):
        line = FLOOR_ACTIONS.get(changed, FLOOR_ACTIONS[None]) if rule == "absolute" else RULE_ACTIONS.get(rule)
        if line:
            lines.append(line)
    return lines
